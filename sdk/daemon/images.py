"""The image store: named root filesystems, unpacked, ready for an agent's containers to use.

It lives in the SDK so that both the ``agora image`` CLI and the agent use it (the SDK imports
nothing of the agent's).

Layout: ``<store>/<name>/rootfs/`` (the unpacked tree) and ``<store>/<name>/image.json``
(``{"name", "imported_at", "source", "size_bytes"}``). An import unpacks into
``<store>/.tmp-<random>/`` and renames that into place, so an image is either whole or absent;
names starting with a dot are never images.

Tarballs are unpacked with the checks of tarfile's ``"data"`` filter, adjusted for root
filesystems: absolute symlink targets are kept (busybox links ``/bin/sh -> /bin/busybox``; they
resolve inside the container's root), and modes keep sticky and write bits (``/tmp`` is 1777),
but no member is ever written outside the rootfs or through a symlink, device nodes are skipped,
and setuid/setgid bits are dropped. The path checks are lexical plus ``lstat`` of each component
rather than ``realpath``, so an absolute symlink unpacked earlier cannot redirect a later member.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

__all__ = [
    "ImageError",
    "ImageRecord",
    "ImageStore",
    "default_image_store",
    "image_name_problem",
]

log = structlog.get_logger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RECORD = "image.json"
_ROOTFS = "rootfs"
#: Mode bits an image keeps: permissions and sticky, never setuid/setgid.
_KEPT_MODE = 0o1777


class ImageError(Exception):
    """An image cannot be imported, read or removed; the message says why."""


@dataclass(frozen=True, slots=True)
class ImageRecord:
    name: str
    rootfs: str  # absolute path of the unpacked tree
    size_bytes: int
    imported_at: float  # seconds since the epoch
    source: str  # the tarball or directory it was imported from


def image_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an image, or None when it can."""
    if not _NAME.fullmatch(name):
        return (
            f"bad image name {name!r}: want a letter or digit, then up to 127 letters, digits, "
            "'.', '_' or '-'"
        )
    if ".." in name:
        return f"bad image name {name!r}: must not contain '..'"
    return None


def default_image_store() -> str:
    """$AGORA_IMAGE_STORE, else $AGORA_HOME/images, else a system or per-user default."""
    if store := os.environ.get("AGORA_IMAGE_STORE"):
        return store
    if home := os.environ.get("AGORA_HOME"):
        return os.path.join(home, "images")
    if os.geteuid() == 0:
        return "/var/lib/agora/images"
    return os.path.join(os.path.expanduser("~"), ".local", "share", "agora", "images")


class ImageStore:
    """Images under one directory (created on the first import)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def import_image(self, name: str, source: str, *, replace: bool = False) -> ImageRecord:
        """Unpack a tarball, or copy a directory, into a new image ``name``.

        ImageError when the name is bad, the image exists and ``replace`` is false, the source
        is missing or not a tar archive, or a member is unsafe; nothing is left behind then.
        """
        _check_name(name)
        source = os.path.abspath(source)
        if not os.path.lexists(source):
            raise ImageError(f"no such file or directory: {source}")
        final = os.path.join(self.root, name)
        if not replace and os.path.lexists(final):
            raise ImageError(f"image {name!r} exists already (replace it with --replace)")
        os.makedirs(self.root, mode=0o755, exist_ok=True)
        tmp = os.path.join(self.root, f".tmp-{secrets.token_hex(8)}")
        os.mkdir(tmp, 0o700)
        try:
            rootfs = os.path.join(tmp, _ROOTFS)
            os.mkdir(rootfs, 0o755)
            if os.path.isdir(source):
                _copy_tree(source, rootfs, _identity(self.root))
            else:
                _unpack(source, rootfs)
            record = {
                "name": name,
                "imported_at": time.time(),
                "source": source,
                "size_bytes": _tree_size(rootfs),
            }
            Path(tmp, _RECORD).write_text(json.dumps(record, indent=2) + "\n")
            os.chmod(tmp, 0o755)
            self._move_into_place(tmp, final, name, replace)
        except BaseException:
            _rmtree(tmp)
            raise
        log.info("image_imported", name=name, source=source, size_bytes=record["size_bytes"])
        got = self.get(name)
        assert got is not None
        return got

    def get(self, name: str) -> ImageRecord | None:
        """The image ``name``, or None when there is none (or its record is unreadable)."""
        if image_name_problem(name) is not None:
            return None
        return self._read(name)

    def list(self) -> list[ImageRecord]:
        """Every image, by name."""
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [r for n in names if not n.startswith(".") and (r := self.get(n)) is not None]

    def remove(self, name: str) -> bool:
        """Delete the image ``name``; False when there was none."""
        _check_name(name)
        path = os.path.join(self.root, name)
        trash = os.path.join(self.root, f".trash-{secrets.token_hex(8)}")
        try:
            os.rename(path, trash)  # gone from view at once, even if deleting takes a while
        except FileNotFoundError:
            return False
        _rmtree(trash)
        log.info("image_removed", name=name)
        return True

    def _read(self, name: str) -> ImageRecord | None:
        path = os.path.join(self.root, name)
        try:
            data: Any = json.loads(Path(path, _RECORD).read_text())
            record = ImageRecord(
                name=name,
                rootfs=os.path.join(path, _ROOTFS),
                size_bytes=int(data["size_bytes"]),
                imported_at=float(data["imported_at"]),
                source=str(data["source"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("image_record_unreadable", name=name, error=str(exc))
            return None
        return record if os.path.isdir(record.rootfs) else None

    def _move_into_place(self, tmp: str, final: str, name: str, replace: bool) -> None:
        old: str | None = None
        if replace and os.path.lexists(final):
            old = os.path.join(self.root, f".trash-{secrets.token_hex(8)}")
            os.rename(final, old)
        try:
            os.rename(tmp, final)  # fails if another import of this name won the race
        except OSError as exc:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.rename(old, final)
            raise ImageError(f"image {name!r} exists already (imported meanwhile?)") from exc
        if old is not None:
            _rmtree(old)


def _check_name(name: str) -> None:
    if (problem := image_name_problem(name)) is not None:
        raise ImageError(problem)


# --- tarballs -------------------------------------------------------------------------------


def _unpack(source: str, rootfs: str) -> None:
    try:
        with tarfile.open(source, "r:*") as archive:
            archive.extractall(
                rootfs, numeric_owner=True, filter=lambda m, _dest: _safe_member(m, rootfs)
            )
    except tarfile.ReadError as exc:
        raise ImageError(
            f"{source} is not a tar archive (.tar, .tar.gz, .tar.xz, .tar.bz2)"
        ) from exc
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ImageError(f"cannot unpack {source}: {exc}") from exc


def _safe_member(member: tarfile.TarInfo, rootfs: str) -> tarfile.TarInfo | None:
    """The member as it may be unpacked under ``rootfs``; None to skip it; ImageError if unsafe."""
    if member.ischr() or member.isblk():
        log.info("image_device_skipped", member=member.name)
        return None
    name = _inside_name(member.name, member.name)
    if name == "." and not member.isdir():
        raise ImageError(f"unsafe member {member.name!r}: not a directory but names the root")
    # A symlink replaces whatever is at its own path; anything else would write through it.
    _no_symlink_on_path(rootfs, name, member.name, final=not member.issym())
    linkname = member.linkname
    if member.islnk():
        linkname = _inside_name(member.linkname, member.name)
        _no_symlink_on_path(rootfs, linkname, member.name, final=True)
        # Else tarfile would unpack the link's target from the archive, unchecked.
        if not os.path.isfile(os.path.join(rootfs, linkname)):
            raise ImageError(f"unsafe member {member.name!r}: hard link to a non-file or later one")
    elif member.issym() and not linkname.startswith("/"):
        _inside_name(posixpath.join(posixpath.dirname(name), linkname), member.name)
    # Owners: tarfile sets the numeric ids (numeric_owner) only when running as root.
    return member.replace(name=name, linkname=linkname, mode=member.mode & _KEPT_MODE, deep=False)


def _inside_name(path: str, member: str) -> str:
    """``path`` relative to the rootfs, normalised; ImageError when it leaves the rootfs."""
    name = posixpath.normpath(path.lstrip("/")) if path.strip("/") else "."
    if name == ".." or name.startswith("../") or "\0" in name:
        raise ImageError(f"unsafe member {member!r}: {path!r} is outside the image")
    return name


def _no_symlink_on_path(rootfs: str, name: str, member: str, *, final: bool) -> None:
    parts = [] if name == "." else name.split("/")
    checked = parts if final else parts[:-1]
    path = rootfs
    for part in checked:
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise ImageError(f"unsafe member {member!r}: would be written through a symlink")


# --- directories ----------------------------------------------------------------------------


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _copy_tree(source: str, dest: str, skip: tuple[int, int] | None) -> None:
    """Copy ``source``'s contents into the existing ``dest``: links stay links, hard links stay
    linked, devices and sockets are skipped, and the store itself (``skip``) is never entered."""
    linked: dict[tuple[int, int], str] = {}
    try:
        _copy_dir(source, dest, skip, linked)
        _copy_attrs(os.stat(source), dest)
    except OSError as exc:
        raise ImageError(f"cannot copy {source}: {exc}") from exc


def _copy_dir(
    source: str, dest: str, skip: tuple[int, int] | None, linked: dict[tuple[int, int], str]
) -> None:
    with os.scandir(source) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            target = os.path.join(dest, entry.name)
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) == skip:
                    continue
                os.mkdir(target, 0o700)
                _copy_dir(entry.path, target, skip, linked)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.path), target)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in linked:
                    os.link(linked[key], target)
                    continue
                shutil.copyfile(entry.path, target, follow_symlinks=False)
                linked[key] = target
            elif stat.S_ISFIFO(st.st_mode):
                os.mkfifo(target)
            else:
                log.info("image_special_file_skipped", path=entry.path)
                continue
            _copy_attrs(st, target)


def _copy_attrs(st: os.stat_result, target: str) -> None:
    link = stat.S_ISLNK(st.st_mode)
    if os.geteuid() == 0:
        os.chown(target, st.st_uid, st.st_gid, follow_symlinks=False)
    if not link:
        os.chmod(target, stat.S_IMODE(st.st_mode) & _KEPT_MODE)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=not link)


# --- sizes and removal ----------------------------------------------------------------------


def _walk(top: str) -> Iterator[os.DirEntry[str]]:
    with os.scandir(top) as entries:
        for entry in entries:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(entry.path)


def _tree_size(top: str) -> int:
    """Bytes of the regular files under ``top``, each hard-linked file once."""
    seen: set[int] = set()
    total = 0
    for entry in _walk(top):
        if entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def _rmtree(path: str) -> None:
    """Remove ``path``; as non-root, first make read-only directories (unpacked so) writable."""
    try:
        if os.geteuid() != 0:
            _make_writable(path)
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("image_remove_failed", path=path, error=str(exc))


def _make_writable(top: str) -> None:
    os.chmod(top, 0o700)
    with os.scandir(top) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _make_writable(entry.path)
