"""A durable key -> value store for the agent's checkpoint: a snapshot plus an append-only log.

Layout of the directory (one *generation* N at a time)::

    snapshot.N   every live record at the start of generation N (absent for generation 0)
    log.N        the commits made since, one frame per commit
    LOCK         flock'ed while a Journal has the directory open

A frame is ``length (4 bytes, big endian) + crc32 (4 bytes, of length + payload) + payload``, the
payload msgpack. A log frame holds one commit (``[[kind, key, value-or-nil], ...]``, nil: delete),
so a commit is atomic: it is wholly in the log or not at all. A snapshot holds its records in
frames of up to 1000 and ends with a frame ``["end", count]``; it is written to ``snapshot.N.tmp``,
fsynced, renamed into place and the directory fsynced, and only then does ``log.N`` start.

Crash safety: ``load`` takes the newest complete snapshot (a ``.tmp`` never counts) and replays
its generation's log (absent: empty), so every crash point during compaction leaves either the old
generation (snapshot.N-1 + log.N-1, which hold everything committed) or the new one (snapshot.N,
written from the same state) -- and both say the same. A crash in the middle of an append leaves a
torn last frame: ``load`` drops it and truncates it away. A bad frame that is *not* the tail (more
data follows it) is real corruption and raises :class:`JournalError`.

``commit`` costs one write and one fsync; when the log has grown past max(1 MiB, twice the live
data) it also compacts (a snapshot write with its own fsyncs).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import struct
import zlib
from collections.abc import Iterator
from typing import IO, Any, Final

import msgpack
import structlog

__all__ = ["COMPACT_MIN_BYTES", "Journal", "JournalError", "read_boot_id"]

log = structlog.get_logger(__name__)

COMPACT_MIN_BYTES: Final = 1024 * 1024
MAX_FRAME: Final = 1 << 30
_HEADER: Final = struct.Struct(">II")
_SNAPSHOT_CHUNK: Final = 1000
_NAME: Final = re.compile(r"^(snapshot|log)\.(\d+)$")

Key = tuple[str, str]


class JournalError(Exception):
    """The journal is corrupt (not merely torn at its tail) or locked by another process."""


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    """This boot's id: it changes when the host reboots (the checkpoint is then stale)."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def _frame(payload: bytes) -> bytes:
    length = struct.pack(">I", len(payload))
    return length + struct.pack(">I", zlib.crc32(payload, zlib.crc32(length))) + payload


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _frames(data: bytes, path: str) -> tuple[list[Any], int]:
    """The decoded payloads of ``data`` and the length of its good prefix. A bad frame that
    reaches the end of the data (or a tail of zeros) is a torn append: it ends the good prefix.
    A bad frame with more data behind it raises."""
    out: list[Any] = []
    pos, size = 0, len(data)
    while pos < size:
        problem = None
        if size - pos < _HEADER.size:
            problem = "a partial frame header"
            end = size
        else:
            length, crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if length == 0 or length > MAX_FRAME:
                problem = f"a frame length of {length}"
                end = size if not any(data[pos:]) else pos + _HEADER.size
            elif end > size:
                problem = "a frame cut short"
            elif zlib.crc32(data[pos + _HEADER.size : end], zlib.crc32(data[pos : pos + 4])) != crc:
                problem = "a checksum mismatch"
        if problem is None:
            try:
                out.append(msgpack.unpackb(data[pos + _HEADER.size : end], raw=False))
            except Exception as exc:  # a frame with a good checksum but junk inside
                raise JournalError(f"{path}: undecodable frame at byte {pos}: {exc}") from None
            pos = end
            continue
        if end >= size or not any(data[pos:]):
            return out, pos  # the torn tail of an interrupted append
        raise JournalError(
            f"{path}: corrupt at byte {pos} of {size} ({problem}, with data after it); "
            "the checkpoint cannot be trusted: move the directory away to start afresh"
        )
    return out, pos


class Journal:
    """Durable records keyed by (kind, key); see the module docstring for the format."""

    def __init__(self, directory: str) -> None:
        self._dir = directory
        # Only the agent reads its checkpoint: it holds each executor's secret.
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        self._lock: IO[bytes] | None = open(os.path.join(directory, "LOCK"), "ab")  # noqa: SIM115
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise JournalError(f"{directory}: in use by another process") from None
        self._live: dict[Key, bytes] = {}
        self._live_bytes = 0
        self._buffer: dict[Key, bytes | None] = {}
        self._generation = 0
        self._log: IO[bytes] | None = None
        self._log_bytes = 0
        self._loaded = False

    # --- public ----------------------------------------------------------------------------
    def load(self) -> dict[tuple[str, str], bytes]:
        """Every live record: the newest snapshot plus its log, a torn tail dropped (and cut
        off the file). Leftovers of older generations are removed."""
        self._close_log()
        generation, has_snapshot = self._newest()
        live: dict[Key, bytes] = {}
        if has_snapshot:
            self._read_snapshot(self._path("snapshot", generation), live)
        log_path = self._path("log", generation)
        if os.path.exists(log_path):
            with open(log_path, "rb") as f:
                data = f.read()
            commits, good = _frames(data, log_path)
            for ops in commits:
                self._apply(live, ops, log_path)
            if good < len(data):
                log.warning("journal_torn_tail_dropped", path=log_path, bytes=len(data) - good)
                os.truncate(log_path, good)
        self._generation = generation
        self._live = live
        self._live_bytes = sum(len(k) + len(n) + len(v) for (k, n), v in live.items())
        self._open_log(log_path)
        self._remove_stale()
        self._loaded = True
        return dict(live)

    def put(self, kind: str, key: str, value: bytes) -> None:
        self._buffer[(kind, key)] = bytes(value)

    def delete(self, kind: str, key: str) -> None:
        self._buffer[(kind, key)] = None

    def commit(self) -> None:
        """Make every buffered put and delete durable: one append, one fsync."""
        if not self._loaded:
            self.load()
        if not self._buffer:
            return
        ops = [[kind, key, value] for (kind, key), value in self._buffer.items()]
        frame = _frame(msgpack.packb(ops, use_bin_type=True))
        assert self._log is not None
        try:
            self._log.write(frame)
            self._log.flush()
            os.fsync(self._log.fileno())
        except BaseException:
            # Nothing of this commit may stay in the log (a later append would follow junk).
            with contextlib.suppress(OSError):
                self._log.truncate(self._log_bytes)
            raise
        self._log_bytes += len(frame)
        self._apply(self._live, ops, "")
        self._buffer.clear()
        if self._log_bytes > max(COMPACT_MIN_BYTES, 2 * self._live_bytes):
            self.compact()

    def compact(self) -> None:
        """Start a new generation: a snapshot of every live record and an empty log."""
        if not self._loaded:
            self.load()
        nxt = self._generation + 1
        final = self._path("snapshot", nxt)
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            for chunk in self._chunks():
                f.write(_frame(msgpack.packb(["records", chunk], use_bin_type=True)))
            f.write(_frame(msgpack.packb(["end", len(self._live)], use_bin_type=True)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self._dir)
        self._switch_log(nxt)

    def close(self) -> None:
        self._close_log()
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def generation(self) -> int:
        return self._generation

    # --- internals -------------------------------------------------------------------------
    def _switch_log(self, generation: int) -> None:
        """The new snapshot is durable: start its log, then drop the older generation."""
        self._close_log()
        self._generation = generation
        self._open_log(self._path("log", generation))
        _fsync_dir(self._dir)
        self._remove_stale()

    def _path(self, kind: str, generation: int) -> str:
        return os.path.join(self._dir, f"{kind}.{generation}")

    def _newest(self) -> tuple[int, bool]:
        snapshots: list[int] = []
        logs: list[int] = []
        for name in os.listdir(self._dir):
            m = _NAME.match(name)
            if m is not None:
                (snapshots if m.group(1) == "snapshot" else logs).append(int(m.group(2)))
        generation = max(snapshots, default=0)
        if logs and max(logs) > generation:
            raise JournalError(
                f"{self._dir}: log.{max(logs)} has no snapshot.{max(logs)}"
                + ("" if generation == 0 else f" (newest snapshot: {generation})")
            )
        return generation, bool(snapshots)

    def _remove_stale(self) -> None:
        removed = False
        for name in os.listdir(self._dir):
            m = _NAME.match(name)
            stale = m is not None and int(m.group(2)) != self._generation
            if stale or name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._dir, name))
                removed = True
        if removed:
            _fsync_dir(self._dir)

    def _open_log(self, path: str) -> None:
        created = not os.path.exists(path)
        self._log = open(path, "ab")  # noqa: SIM115 -- kept open between commits
        self._log_bytes = self._log.tell()
        if created:
            _fsync_dir(self._dir)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _chunks(self) -> Iterator[list[list[Any]]]:
        items = [[kind, key, value] for (kind, key), value in self._live.items()]
        for i in range(0, len(items), _SNAPSHOT_CHUNK):
            yield items[i : i + _SNAPSHOT_CHUNK]

    def _read_snapshot(self, path: str, live: dict[Key, bytes]) -> None:
        with open(path, "rb") as f:
            data = f.read()
        frames, good = _frames(data, path)
        count = None
        for payload in frames:
            if (
                count is None
                and isinstance(payload, list)
                and len(payload) == 2
                and payload[0] == "records"
            ):
                self._apply(live, payload[1], path)
            elif count is None and isinstance(payload, list) and payload[:1] == ["end"]:
                count = payload[1]
            else:
                raise JournalError(f"{path}: unexpected frame {str(payload)[:80]}")
        if count is None or good != len(data) or count != len(live):
            raise JournalError(f"{path}: incomplete snapshot (renamed before it was whole?)")

    def _apply(self, live: dict[Key, bytes], ops: Any, path: str) -> None:
        if not isinstance(ops, list):
            raise JournalError(f"{path}: a frame that is not a list of records")
        size = 0
        for op in ops:
            if not (
                isinstance(op, list)
                and len(op) == 3
                and isinstance(op[0], str)
                and isinstance(op[1], str)
                and (op[2] is None or isinstance(op[2], bytes))
            ):
                raise JournalError(f"{path}: a malformed record {str(op)[:80]}")
            kind, key, value = op
            old = live.pop((kind, key), None)
            if old is not None:
                size -= len(kind) + len(key) + len(old)
            if value is not None:
                live[(kind, key)] = value
                size += len(kind) + len(key) + len(value)
        if live is self._live:
            self._live_bytes += size
