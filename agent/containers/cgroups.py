"""Cgroups for containers: one cgroup per container with cpu, memory and pids limits, usage,
OOM detection and a destroy that leaves nothing behind. cgroup v1 and v2, detected at start.

    cgroups = Cgroups.detect("agora")           # None: no usable, writable hierarchy
    cg = cgroups.create("c-42", Limits(cpus=0.5, cfs_quota=True, mem_bytes=64 << 20))
    # the forked child writes its own pid into each of cg.procs_files() before exec
    cg.usage(); cg.oom_killed(); cg.totals(); cg.destroy()
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Mapping

import structlog
from agora.agent.containers import _cgroup_v1, _cgroup_v2
from agora.agent.containers._cgroup_base import (
    Cgroup,
    CgroupError,
    CgroupFs,
    Limits,
    Totals,
    Usage,
    check_name,
)

__all__ = ["Cgroup", "CgroupError", "CgroupFs", "Cgroups", "Limits", "Totals", "Usage"]

log = structlog.get_logger(__name__)

_Mount = tuple[str, str, frozenset[str]]  # mountpoint, fstype, options


class Cgroups:
    """The agent's cgroup root: <own cgroup of this process per controller>/<root> (v1, for every
    controller in CONTROLLERS that is mounted and writable) or the v2 equivalent."""

    CONTROLLERS = _cgroup_v1.CONTROLLERS

    def __init__(
        self,
        version: int,
        bases: Mapping[str, str],
        controllers: frozenset[str],
        *,
        unique: tuple[str, ...] | None = None,
        fs: CgroupFs | None = None,
    ) -> None:
        """``bases`` maps controller -> root directory (v1 names; v2 maps every usable one to
        the same directory and passes it as ``unique`` too, since it may have none)."""
        self.version = version
        self.controllers = controllers
        self._bases = dict(bases)
        self._unique = unique if unique is not None else tuple(dict.fromkeys(bases.values()))
        self._fs = fs or CgroupFs()
        self._cls: type[Cgroup] = _cgroup_v1.V1Cgroup if version == 1 else _cgroup_v2.V2Cgroup

    def __repr__(self) -> str:
        return f"Cgroups(v{self.version}, {sorted(self.controllers)}, {self._unique})"

    @property
    def roots(self) -> tuple[str, ...]:
        return self._unique

    @classmethod
    def detect(
        cls,
        root: str,
        *,
        proc: str = "/proc",
        sysfs: str = "/sys/fs/cgroup",
        fs: CgroupFs | None = None,
        devices: bool = False,
    ) -> Cgroups | None:
        """Find this process's cgroups, make ``root`` under them, and return the usable set;
        None when nothing is usable. Never raises for an unsupported or read-only system."""
        parts = root.split("/")
        if not root or any(p in ("", ".", "..") for p in parts):
            raise CgroupError(f"bad cgroup root {root!r}: want a relative path")
        fs = fs or CgroupFs()
        try:
            mounts = _read_mounts(os.path.join(proc, "self", "mounts"))
            own = _read_own(os.path.join(proc, "self", "cgroup"))
        except OSError as e:
            log.info("no cgroups: cannot read /proc", error=str(e))
            return None
        sysfs = os.path.normpath(sysfs)
        unified = any(mp == sysfs and kind == "cgroup2" for mp, kind, _ in mounts)
        if not unified:
            found = cls._detect_v1(mounts, own, parts, fs, devices)
            if found is not None:
                return found
        v2_mounts = sorted((mp != sysfs, mp) for mp, kind, _ in mounts if kind == "cgroup2")
        if v2_mounts and "" in own:
            return cls._detect_v2(v2_mounts[0][1], own[""], parts, fs)
        log.info("no usable cgroup hierarchy")
        return None

    @classmethod
    def _detect_v1(
        cls,
        mounts: list[_Mount],
        own: dict[str, str],
        parts: list[str],
        fs: CgroupFs,
        devices: bool = False,
    ) -> Cgroups | None:
        bases: dict[str, str] = {}
        made: dict[str, str | None] = {}  # own dir -> root made under it (None: not writable)
        for controller, parent in _cgroup_v1.own_dirs(mounts, own).items():
            if controller == "devices" and not devices:
                continue  # only for GPU isolation: one more directory per container otherwise
            if parent not in made:
                made[parent] = _makedirs(fs, parent, parts)
            base = made[parent]
            if base is not None:
                bases[controller] = base
        if not bases:
            return None
        names = {"cpu", "memory", "pids", "freezer", "devices"} & bases.keys()
        found = cls(1, bases, frozenset(names), fs=fs)
        log.info("cgroups", version=1, controllers=sorted(names), roots=found.roots)
        return found

    @classmethod
    def _detect_v2(
        cls, mountpoint: str, own_path: str, parts: list[str], fs: CgroupFs
    ) -> Cgroups | None:
        parent = os.path.join(mountpoint, own_path.lstrip("/"))
        if not os.path.isdir(parent):
            parent = mountpoint
        wanted = _cgroup_v2.delegate(fs, parent)
        base = _makedirs(fs, parent, parts, between=lambda d: _cgroup_v2.delegate(fs, d, wanted))
        if base is None:
            return None
        usable = _cgroup_v2.delegate(fs, base, wanted)
        names = set(usable)
        if os.path.exists(os.path.join(base, "cgroup.freeze")):
            names.add("freezer")
        found = cls(2, dict.fromkeys(usable, base), frozenset(names), unique=(base,), fs=fs)
        log.info("cgroups", version=2, controllers=sorted(names), roots=found.roots)
        return found

    def _cgroup(self, name: str) -> Cgroup:
        check_name(name)
        dirs = {c: os.path.join(base, name) for c, base in self._bases.items()}
        unique = tuple(os.path.join(base, name) for base in self._unique)
        return self._cls(name, dirs, unique, self._fs)

    def create(self, name: str, limits: Limits) -> Cgroup:
        """Make the container cgroup ``name`` (one path component) with ``limits``; on any
        failure nothing is left behind and CgroupError says which file and why."""
        cg = self._cgroup(name)
        cg.check(limits)
        made: list[str] = []
        try:
            for path in cg.procs_files():
                directory = os.path.dirname(path)
                try:
                    self._fs.mkdir(directory)
                except OSError as e:
                    code = e.errno or 0
                    raise CgroupError(
                        f"mkdir {directory}: {os.strerror(code)}", path=directory, errno=code
                    ) from e
                made.append(directory)
            cg.apply(limits, fresh=True)
        except BaseException:
            for directory in reversed(made):
                try:
                    self._fs.rmdir(directory)
                except OSError as e:
                    log.warning("cgroup rollback failed", path=directory, error=str(e))
            raise
        return cg

    def open(self, name: str) -> Cgroup | None:
        """The existing container cgroup ``name`` (after an agent restart), else None."""
        cg = self._cgroup(name)
        if any(os.path.isdir(os.path.dirname(p)) for p in cg.procs_files()):
            return cg
        return None

    def names(self) -> list[str]:
        """Container cgroups that exist under the root, in any hierarchy."""
        found: set[str] = set()
        for base in self._unique:
            with contextlib.suppress(FileNotFoundError):
                found.update(e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))
        return sorted(found)

    def cleanup_root(self) -> None:
        """Remove the root directories that hold no container cgroup; leave the others."""
        for base in self._unique:
            try:
                self._fs.rmdir(base)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise CgroupError(
                        f"rmdir {base}: {e.strerror}", path=base, errno=e.errno
                    ) from e
                log.info("cgroup root still in use, kept", path=base)


def _makedirs(
    fs: CgroupFs, parent: str, parts: list[str], between: Callable[[str], object] | None = None
) -> str | None:
    """mkdir -p ``parts`` under ``parent`` (calling ``between`` on each directory that gets a
    child); the deepest path, or None when it cannot be made (read-only, not permitted)."""
    path = parent
    for part in parts:
        if between is not None:
            between(path)
        path = os.path.join(path, part)
        try:
            fs.mkdir(path)
        except FileExistsError:
            pass
        except OSError as e:
            log.info("cgroup hierarchy not usable", path=path, error=e.strerror)
            return None
    return path


def _read_mounts(path: str) -> list[_Mount]:
    out: list[_Mount] = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                point = _unescape(fields[1])
                out.append((os.path.normpath(point), fields[2], frozenset(fields[3].split(","))))
    return out


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _read_own(path: str) -> dict[str, str]:
    """/proc/self/cgroup -> {v1 controller: path} plus {"": path} for the v2 line."""
    own: dict[str, str] = {}
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            _, controllers, cgroup_path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own.setdefault(controller, cgroup_path)
    return own
