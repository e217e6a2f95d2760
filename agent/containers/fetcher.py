"""Fetch a task's URIs into its sandbox, with a fetch cache shared by everything on one agent.

Sources: ``file://`` URLs and absolute paths (copied), ``http://`` and ``https://`` (streamed).
Each URI lands in the sandbox under ``output_file`` or the URI's last path component; archives
(.tar, .tar.gz/.tgz, .tar.bz2/.tbz2, .tar.xz/.txz, .zip) are also unpacked into the sandbox when
``extract`` is set, and the archive is kept. Everything is written under a temporary name first
and renamed into place, so a failed fetch leaves nothing under a final name; archives are unpacked
into a staging directory and moved in only once complete. Archive members may not leave the
sandbox (no absolute paths, no ``..``, no links out, no device files).

The cache (``cache=True``) holds one file per URI string, named by its SHA-256, in ``cache_dir``.
Several processes may share one cache: entries appear by ``os.replace``, eviction of the least
recently used entries (by mtime, touched on every hit) runs under an ``fcntl`` lock file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Final

import structlog
from agora.sdk.messages.container import URI

__all__ = [
    "FetchError",
    "Fetcher",
    "archive_kind",
    "local_source_problem",
    "unsafe_tar_member",
]

log = structlog.get_logger(__name__)

_CHUNK: Final = 1024 * 1024
_TEMP_PREFIX: Final = ".fetch-"
_STALE_TEMP_SECONDS: Final = 3600.0
_TAR_SUFFIXES: Final = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "::1"})


class FetchError(Exception):
    """A URI could not be fetched; the message names the URI and the cause."""


def archive_kind(name: str) -> str | None:
    """ "tar" or "zip" when ``name`` has an archive suffix we unpack, else None."""
    lowered = name.lower()
    if lowered.endswith(_TAR_SUFFIXES):
        return "tar"
    if lowered.endswith(".zip"):
        return "zip"
    return None


class Fetcher:
    """Fetches URIs into sandboxes. ``http_timeout`` bounds each blocking network operation."""

    def __init__(
        self, cache_dir: str, cache_max_bytes: int = 2 * 1024**3, *, http_timeout: float = 30.0
    ) -> None:
        self._cache_dir = cache_dir
        self._cache_max = cache_max_bytes
        self._timeout = http_timeout

    async def fetch_all(self, uris: Sequence[URI], sandbox: str) -> None:
        """Fetch ``uris`` in order in a worker thread; the first failure raises FetchError."""

        def fetch_each() -> None:
            for uri in uris:
                self.fetch(uri, sandbox)

        await asyncio.to_thread(fetch_each)

    def fetch(self, uri: URI, sandbox: str, *, env: Mapping[str, str] | None = None) -> str:
        """Fetch one URI into ``sandbox``; return the path of the file made there. ``env`` gives
        the proxy settings (http_proxy, https_proxy, no_proxy); default: this process's."""
        source = _parse(uri)
        name = _output_name(uri, source)
        if not os.path.isdir(sandbox):
            raise FetchError(f"cannot fetch {uri.value!r}: sandbox {sandbox!r} is not a directory")
        dest = os.path.join(sandbox, name)
        try:
            fd, tmp = tempfile.mkstemp(
                dir=sandbox, prefix=f"{_TEMP_PREFIX}{name[:64]}.", suffix=".part"
            )
        except OSError as exc:
            raise FetchError(f"cannot fetch {uri.value!r}: {_describe(exc)}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                hit = uri.cache and self._copy_from_cache(uri, out)
                if not hit:
                    self._download(uri, source, out, env)
            if uri.cache and not hit:
                self._store_in_cache(uri, tmp)
            os.chmod(tmp, 0o755 if uri.executable else 0o644)
            kind = archive_kind(name) if uri.extract else None
            if kind is not None:
                _extract(uri, tmp, kind, sandbox)
            os.replace(tmp, dest)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise FetchError(f"cannot fetch {uri.value!r}: {_describe(exc)}") from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        log.info("uri_fetched", uri=uri.value, path=dest, cached=bool(hit), extracted=kind)
        return dest

    # -- sources --------------------------------------------------------------------------

    def _download(
        self, uri: URI, source: str, out: IO[bytes], env: Mapping[str, str] | None
    ) -> None:
        if not source.startswith(("http://", "https://")):
            try:
                with open(source, "rb") as src:
                    if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                        raise FetchError(f"cannot fetch {uri.value!r}: not a regular file")
                    shutil.copyfileobj(src, out, _CHUNK)
            except OSError as exc:
                raise FetchError(f"cannot fetch {uri.value!r}: {_describe(exc)}") from exc
            return
        opener = urllib.request.build_opener(urllib.request.ProxyHandler(_proxies(source, env)))
        request = urllib.request.Request(source, headers={"User-Agent": "agora-fetcher"})
        try:
            with opener.open(request, timeout=self._timeout) as response:
                expected = response.headers.get("Content-Length")
                copied = 0
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    copied += len(chunk)
        except urllib.error.HTTPError as exc:
            raise FetchError(f"cannot fetch {uri.value!r}: HTTP {exc.code} {exc.reason}") from exc
        except urllib.error.URLError as exc:
            raise FetchError(f"cannot fetch {uri.value!r}: {exc.reason}") from exc
        except (OSError, ValueError) as exc:  # timeouts, resets, http.client errors
            raise FetchError(f"cannot fetch {uri.value!r}: {_describe(exc)}") from exc
        if expected is not None and expected.isdigit() and int(expected) != copied:
            raise FetchError(
                f"cannot fetch {uri.value!r}: got {copied} of {expected} bytes (truncated)"
            )

    # -- cache ----------------------------------------------------------------------------

    def _entry(self, uri: URI) -> str:
        return os.path.join(self._cache_dir, hashlib.sha256(uri.value.encode()).hexdigest())

    def _copy_from_cache(self, uri: URI, out: IO[bytes]) -> bool:
        entry = self._entry(uri)
        try:
            with open(entry, "rb") as src:  # an open file survives a concurrent eviction
                now = time.time_ns()
                with contextlib.suppress(OSError):
                    os.utime(src.fileno(), ns=(now, now))
                shutil.copyfileobj(src, out, _CHUNK)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("fetch_cache_read_failed", uri=uri.value, error=_describe(exc))
            out.seek(0)
            out.truncate()
            return False
        return True

    def _store_in_cache(self, uri: URI, path: str) -> None:
        size = os.path.getsize(path)
        if size > self._cache_max:
            log.info("fetch_not_cached_too_big", uri=uri.value, size=size, cap=self._cache_max)
            return
        tmp = ""
        try:
            os.makedirs(self._cache_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._cache_dir, prefix=_TEMP_PREFIX)
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, _CHUNK)
            now = time.time_ns()
            os.utime(tmp, ns=(now, now))
            os.replace(tmp, self._entry(uri))
            tmp = ""
            self._evict()
        except OSError as exc:  # the cache is an optimisation: never fail a fetch for it
            log.warning("fetch_cache_write_failed", uri=uri.value, error=_describe(exc))
        finally:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _evict(self) -> None:
        """Remove least recently used entries until the cache fits its cap; drop stale temps."""
        with open(os.path.join(self._cache_dir, ".lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            entries: list[tuple[int, str, int]] = []
            for item in os.scandir(self._cache_dir):
                try:
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if item.name.startswith(_TEMP_PREFIX):
                    if time.time() - info.st_mtime > _STALE_TEMP_SECONDS:
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
                elif len(item.name) == 64 and stat.S_ISREG(info.st_mode):
                    entries.append((info.st_mtime_ns, item.path, info.st_size))
            total = sum(size for _, _, size in entries)
            for _, path, size in sorted(entries):
                if total <= self._cache_max:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                total -= size
                log.info("fetch_cache_evicted", path=path, size=size)


# -- helpers ------------------------------------------------------------------------------


def local_source_problem(uri: URI, uid: int, gid: int, groups: tuple[int, ...]) -> str | None:
    """Why the user ``uid`` could not read the local file ``uri`` names (None: it could, or the
    URI is not local). The fetcher runs as the agent: it must not hand a task what its own user
    may not read (``/etc/shadow``)."""
    try:
        source = _parse(uri)
    except FetchError:
        return None  # reported by the fetch itself
    if not source.startswith("/"):
        return None
    path = os.path.realpath(source)
    parts = path.split("/")
    dirs = ["/" + "/".join(parts[1:i]) for i in range(1, len(parts))]
    for directory, need in [*((d, 0o1) for d in dirs), (path, 0o4)]:
        try:
            st = os.stat(directory)
        except OSError:
            return None  # the fetch reports it
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid == gid or st.st_gid in groups:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        if not bits & need:
            return f"cannot fetch {uri.value!r}: the task's user may not read it"
    return None


def _parse(uri: URI) -> str:
    """The local path or http(s) URL to read ``uri`` from."""
    value = uri.value
    if value.startswith("/"):
        return value
    try:
        parsed = urllib.parse.urlsplit(value)
    except ValueError as exc:
        raise FetchError(f"cannot fetch {value!r}: {exc}") from None
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        if not parsed.hostname:
            raise FetchError(f"cannot fetch {value!r}: no host")
        return value
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise FetchError(f"cannot fetch {value!r}: file:// URIs must be local")
        path = urllib.parse.unquote(parsed.path)
        if not path.startswith("/"):
            raise FetchError(f"cannot fetch {value!r}: file:// needs an absolute path")
        return path
    shown = scheme or "none (not an absolute path)"
    raise FetchError(f"cannot fetch {value!r}: unsupported scheme {shown}")


def _output_name(uri: URI, source: str) -> str:
    if uri.output_file is not None:
        name = uri.output_file
    elif source.startswith(("http://", "https://")):
        name = urllib.parse.unquote(urllib.parse.urlsplit(source).path).rsplit("/", 1)[-1]
    else:
        name = os.path.basename(source)
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        what = "output_file" if uri.output_file is not None else "the file name from the URI"
        raise FetchError(f"cannot fetch {uri.value!r}: {what} {name!r} is not a plain file name")
    if name.startswith(_TEMP_PREFIX):
        raise FetchError(f"cannot fetch {uri.value!r}: names starting {_TEMP_PREFIX!r} are ours")
    return name


def _proxies(url: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The proxies for ``url`` from ``env`` (default os.environ); none for loopback hosts."""
    env = os.environ if env is None else env
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host in _LOOPBACK or host.startswith("127."):
        return {}
    no_proxy = env.get("no_proxy", env.get("NO_PROXY", ""))
    for item in (part.strip().lower().lstrip(".") for part in no_proxy.split(",")):
        if item == "*" or (item and (host == item or host.endswith("." + item))):
            return {}
    proxies = {}
    for scheme in ("http", "https"):
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            proxies[scheme] = value
    return proxies


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _extract(uri: URI, archive: str, kind: str, sandbox: str) -> None:
    staging = tempfile.mkdtemp(dir=sandbox, prefix=_TEMP_PREFIX)
    try:
        if kind == "tar":
            _extract_tar(archive, staging)
        else:
            _extract_zip(archive, staging)
        _merge(staging, sandbox)
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile, ValueError) as exc:
        raise FetchError(f"cannot extract {uri.value!r}: {_describe(exc)}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract_tar(archive: str, staging: str) -> None:
    with tarfile.open(archive, "r:*") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, filter="data")
            return
        members = tar.getmembers()
        for member in members:
            problem = unsafe_tar_member(member)
            if problem is not None:
                raise ValueError(f"member {member.name!r} {problem}")
        tar.extractall(staging, members=members)


def unsafe_tar_member(member: tarfile.TarInfo) -> str | None:
    """Why extracting ``member`` could write outside the target directory, or None. The check
    used where tarfile has no ``filter="data"``."""
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "is not a file, directory or link"
    if _escapes(member.name):
        return "is outside the archive root"
    if member.issym() and _escapes(member.linkname, base=os.path.dirname(member.name)):
        return "links outside the archive root"
    if member.islnk() and _escapes(member.linkname):
        return "links outside the archive root"
    return None


def _escapes(path: str, base: str = "") -> bool:
    if path.startswith("/") or (base and base.startswith("/")):
        return True
    parts = [p for p in os.path.join(base, path).split("/") if p not in ("", ".")]
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def _extract_zip(archive: str, staging: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            name = info.filename
            if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
                raise ValueError(f"member {name!r} has an absolute path")
            if ".." in name.replace("\\", "/").split("/"):
                raise ValueError(f"member {name!r} is outside the archive root")
        for info in infos:
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "surrogateescape")
                if target.startswith("/") or ".." in target.split("/"):
                    raise ValueError(f"member {info.filename!r} links outside the archive root")
                link = os.path.join(staging, info.filename.rstrip("/"))
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(target, link)
                continue
            path = zf.extract(info, staging)
            if mode and not info.is_dir():
                os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)


def _merge(src_dir: str, dst_dir: str) -> None:
    """Move the tree under ``src_dir`` into ``dst_dir``: directories merge, files and links
    replace what is there (a symlink in the way is replaced, never followed)."""
    for entry in _scandir(src_dir):
        target = os.path.join(dst_dir, entry.name)
        try:
            existing = os.lstat(target)
        except FileNotFoundError:
            os.rename(entry.path, target)
            continue
        if entry.is_dir(follow_symlinks=False):
            if stat.S_ISDIR(existing.st_mode):
                _merge(entry.path, target)
                continue
            os.unlink(target)
            os.rename(entry.path, target)
        elif stat.S_ISDIR(existing.st_mode):
            raise IsADirectoryError(0, "a directory is in the way of an archive member", target)
        else:
            os.replace(entry.path, target)


def _scandir(path: str) -> Iterator[os.DirEntry[str]]:
    with os.scandir(path) as entries:
        yield from list(entries)
