"""What both cgroup versions share: the value types, plain file I/O on cgroupfs, and a container
cgroup's common half (membership, pids, destroy). Public names are re-exported by ``cgroups``."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

CFS_PERIOD_US = 100_000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class CgroupError(Exception):
    """A cgroup operation failed; ``path`` and ``errno`` name the file and cause when known."""

    def __init__(self, message: str, *, path: str | None = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


_DEVICE_RULE = re.compile(r"[abc] (\*|\d{1,10}):(\*|\d{1,10}) [rwm]{1,3}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a container may use. ``None`` means unlimited."""

    cpus: float | None = None  # cpu shares: v1 cpu.shares, v2 cpu.weight
    cfs_quota: bool = False  # also a hard CFS quota of ``cpus`` per period
    mem_bytes: int | None = None  # hard limit, swap excluded
    pids_max: int | None = None
    #: Device rules to deny (v1 devices controller, where mounted): "c 195:1 rwm".
    deny_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cpus is not None and not self.cpus > 0:
            raise ValueError(f"cpus must be > 0, not {self.cpus}")
        if self.cfs_quota and self.cpus is None:
            raise ValueError("cfs_quota needs cpus")
        if self.mem_bytes is not None and self.mem_bytes <= 0:
            raise ValueError(f"mem_bytes must be > 0, not {self.mem_bytes}")
        if self.pids_max is not None and self.pids_max <= 0:
            raise ValueError(f"pids_max must be > 0, not {self.pids_max}")
        for rule in self.deny_devices:
            if not _DEVICE_RULE.fullmatch(rule):
                raise ValueError(f"bad device rule {rule!r}: want e.g. 'c 195:1 rwm'")

    def cpu_shares(self) -> int:
        return max(2, round((self.cpus or 1.0) * 1024))

    def cfs_quota_us(self) -> int:
        return max(1000, round((self.cpus or 1.0) * CFS_PERIOD_US))


@dataclass(frozen=True, slots=True)
class Usage:
    """A container cgroup's consumption; a limit of 0 means none."""

    cpu_seconds: float
    rss_bytes: int
    mem_limit_bytes: int
    cpu_limit: float  # cpus: the CFS quota when set, else the share-equivalent
    oom_kills: int


@dataclass(frozen=True, slots=True)
class Totals:
    """What a container cgroup used over its whole life (None: the kernel does not say)."""

    cpu_seconds: float | None
    max_rss_bytes: int | None  # peak memory charged to the cgroup (page cache included)


class CgroupFs:
    """What a fake tree must emulate: the files a kernel makes on mkdir, rmdir of a directory
    that lists files, the effect of writes, signals. Unit tests pass their own; this one is real."""

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)

    def write(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _fail(action: str, path: str, err: OSError) -> CgroupError:
    code = err.errno or 0
    return CgroupError(
        f"{action} {path}: {os.strerror(code)} (errno {code})", path=path, errno=code
    )


def write(fs: CgroupFs, path: str, value: str) -> None:
    try:
        fs.write(path, value.encode())
    except OSError as e:
        raise _fail(f"write {value!r} to", path, e) from e


def write_optional(fs: CgroupFs, path: str, value: str) -> bool:
    """Write to a file the kernel may not offer; False when it is absent."""
    try:
        write(fs, path, value)
    except CgroupError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def read_optional(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _fail("read", path, e) from e


def read_keyed(path: str) -> dict[str, int]:
    """``key value`` lines (memory.stat, cpu.stat, memory.events, oom_control); {} if absent."""
    out: dict[str, int] = {}
    for line in (read_optional(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def read_int(path: str) -> int | None:
    text = read_optional(path)
    return None if text is None or not text.strip().lstrip("-").isdigit() else int(text)


def check_name(name: str) -> str:
    """A container cgroup name is one path component: no '/', '..', nor a leading dot."""
    if not _NAME.fullmatch(name):
        raise CgroupError(f"bad cgroup name {name!r}: want [A-Za-z0-9][A-Za-z0-9._-]*")
    return name


class Cgroup:
    """One container's cgroup: a directory per hierarchy (v1) or one directory (v2)."""

    def __init__(
        self, name: str, dirs: Mapping[str, str], unique: Sequence[str], fs: CgroupFs
    ) -> None:
        self.name = name
        self._dirs = dict(dirs)  # controller -> directory
        self._unique = tuple(unique)  # each directory once
        self._fs = fs

    def __repr__(self) -> str:
        return f"Cgroup({self.name!r}, {self._unique!r})"

    def procs_files(self) -> tuple[str, ...]:
        return tuple(os.path.join(d, "cgroup.procs") for d in self._unique)

    def add(self, pid: int) -> None:
        for path in self.procs_files():
            write(self._fs, path, str(pid))

    def pids(self) -> list[int]:
        """Every process in this cgroup (and any cgroups nested under it), sorted."""
        return sorted(self._tree_pids(self._tree()))

    def update(self, limits: Limits) -> None:
        self.check(limits)
        self.apply(limits, fresh=False)

    def check(self, limits: Limits) -> None:
        """Refuse limits whose controller is not usable here, rather than not enforce them."""
        wanted = {
            "cpu": limits.cpus is not None,
            "memory": limits.mem_bytes is not None,
            "pids": limits.pids_max is not None,
        }
        missing = sorted(c for c, want in wanted.items() if want and c not in self._dirs)
        if missing:
            raise CgroupError(f"cgroup {self.name}: no usable {'/'.join(missing)} controller")

    def apply(self, limits: Limits, *, fresh: bool) -> None:
        """Write limits; ``fresh`` (just created, kernel defaults) skips the unlimited ones."""
        raise NotImplementedError

    def usage(self) -> Usage:
        raise NotImplementedError

    def totals(self) -> Totals:
        """CPU time and peak memory so far; read before ``destroy`` for a container's final
        account. Raises CgroupError when a file is there but cannot be read."""
        raise NotImplementedError

    def oom_killed(self) -> bool:
        raise NotImplementedError

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill every process, wait until none is left, remove every directory. Idempotent."""
        deadline = time.monotonic() + timeout
        tree = self._tree()
        if not tree:
            return
        if self._tree_pids(tree):
            self._stop_all(tree, deadline)
            for delay in _backoff(deadline):
                pids = self._tree_pids(tree)
                if not pids:
                    break
                self._kill(pids)
                if delay is None:
                    raise CgroupError(f"cgroup {self.name}: pids {sorted(pids)} survive SIGKILL")
        for path in tree:
            self._rmdir(path, deadline)

    def _stop_all(self, tree: list[str], deadline: float) -> None:
        """First strike: SIGKILL everything (a version may freeze around it or use cgroup.kill)."""
        self._kill(self._tree_pids(tree))

    def _kill(self, pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                self._fs.kill(pid, signal.SIGKILL)

    def _tree(self) -> list[str]:
        """Existing directories of this cgroup, children before parents."""
        out: list[str] = []
        for top in self._unique:
            out.extend(_walk_up(top))
        return out

    def _tree_pids(self, tree: list[str]) -> set[int]:
        pids: set[int] = set()
        for path in tree:
            text = read_optional(os.path.join(path, "cgroup.procs")) or ""
            pids.update(int(p) for p in text.split())
        return pids

    def _rmdir(self, path: str, deadline: float) -> None:
        for delay in _backoff(deadline):
            try:
                self._fs.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or delay is None:
                    raise _fail("rmdir", path, e) from e


def _walk_up(top: str) -> Iterator[str]:
    try:
        entries = list(os.scandir(top))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _walk_up(entry.path)
    yield top


def _backoff(deadline: float) -> Iterator[float | None]:
    """Paces a retry loop: yields before each attempt, sleeping (growing) between attempts; the
    attempt made after the deadline passed gets None, meaning "last chance"."""
    delay = 0.0005
    while True:
        if time.monotonic() >= deadline:
            yield None
            return
        yield delay
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
