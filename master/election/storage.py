"""Durable state of one master's Raft node: term and vote, the latest snapshot, the log after it.

Three files in one directory:

- ``hard_state.json``: ``{"term": N, "voted_for": "tcp://..." | null, "crc": C}``, replaced
  atomically (temp file, fsync, rename, fsync the directory).
- ``snapshot.bin``: a header (magic, index, term, length, crc32 of the data) and the data,
  replaced atomically the same way.
- ``log.bin``: append-only frames ``>II`` (payload length, crc32 of the payload) + payload, the
  payload being ``pack_record(LogEntry)``. Appends cost one write and one fsync per Ready;
  installing a snapshot rewrites the (then short) file atomically; a truncation cuts the file at
  the remembered offset of the first dropped entry.

Recovery cuts off a torn tail (a crash in the middle of an append) with a warning. Anything else
that does not add up (a bad frame followed by good ones, indices that skip, terms that go down, a
damaged hard state or snapshot file) raises :class:`StorageError` naming the file: the master must
refuse to start rather than forget a vote or a committed entry.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from io import BufferedWriter
from pathlib import Path
from typing import Final

import structlog
from agora.master.election.types import HardState, Ready, Snapshot
from agora.sdk.codec import pack_record, unpack_record
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import LogEntry

__all__ = ["RaftStorage", "StorageError"]

log = structlog.get_logger(__name__)

HARD_STATE_FILE: Final = "hard_state.json"
SNAPSHOT_FILE: Final = "snapshot.bin"
LOG_FILE: Final = "log.bin"
_TMP: Final = ".tmp"
_FRAME: Final = struct.Struct(">II")
_SNAP_MAGIC: Final = b"AGRSNAP1"
_SNAP_HEAD: Final = struct.Struct(">8sQQQI")


class StorageError(Exception):
    """The Raft state on disk is damaged beyond a torn tail; the message names the file."""


@dataclass(slots=True)
class _Slot:
    """Where one log entry lives in ``log.bin``."""

    index: int
    term: int
    offset: int


def _frame(entry: LogEntry) -> bytes:
    payload = pack_record(entry)
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` + ".tmp", fsync it and rename it over ``path`` (the caller
    fsyncs the directory)."""
    tmp = path.with_name(path.name + _TMP)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RaftStorage:
    """The durable state of one Raft node in ``directory`` (created if missing).

    Call :meth:`load` once, then :meth:`persist` for every Ready. ``persist(ready, sync=False)``
    followed by one :meth:`sync` lets a shell cover several Readies with one fsync.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._hard = HardState()
        self._pending_hard: HardState | None = None
        self._slots: list[_Slot] = []
        self._log: BufferedWriter | None = None  # open for appends once loaded
        self._log_dirty = False
        self._dir_dirty = False
        self._loaded = False

    # -- loading ---------------------------------------------------------------------------------

    def load(self) -> tuple[HardState, Snapshot | None, list[LogEntry]]:
        """Read everything back: hard state, the snapshot (None if none) and the log after it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in (HARD_STATE_FILE, SNAPSHOT_FILE, LOG_FILE):
            self.directory.joinpath(name + _TMP).unlink(missing_ok=True)
        self._hard = self._load_hard_state()
        snapshot = self._load_snapshot()
        entries = self._load_log(snapshot)
        self._loaded = True
        return self._hard, snapshot, entries

    def _load_hard_state(self) -> HardState:
        path = self.directory / HARD_STATE_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return HardState()
        try:
            doc = json.loads(raw)
            term, voted_for, crc = doc["term"], doc["voted_for"], doc["crc"]
            ok = (
                type(term) is int
                and term >= 0
                and (voted_for is None or isinstance(voted_for, str))
                and crc == _hard_crc(term, voted_for)
            )
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise StorageError(f"{path}: damaged hard state (term and vote); refusing to start")
        return HardState(term=term, voted_for=voted_for)

    def _load_snapshot(self) -> Snapshot | None:
        path = self.directory / SNAPSHOT_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) < _SNAP_HEAD.size:
            raise StorageError(f"{path}: snapshot header cut short ({len(raw)} bytes)")
        magic, index, term, length, crc = _SNAP_HEAD.unpack_from(raw)
        data = raw[_SNAP_HEAD.size :]
        if magic != _SNAP_MAGIC or length != len(data) or zlib.crc32(data) != crc:
            raise StorageError(f"{path}: damaged snapshot (bad magic, length or checksum)")
        return Snapshot(index=index, term=term, data=data)

    def _load_log(self, snapshot: Snapshot | None) -> list[LogEntry]:
        path = self.directory / LOG_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = b""
        entries: list[LogEntry] = []
        offsets: list[int] = []
        pos = 0
        while pos < len(raw):
            entry, end, why = _read_frame(raw, pos)
            if entry is None:
                if not _is_tail(raw, pos, end):
                    raise StorageError(f"{path}: {why} at offset {pos}, before more log data")
                log.warning(
                    "raft_log_torn_tail_cut", file=str(path), offset=pos, bytes=len(raw) - pos
                )
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
                raw = raw[:pos]
                break
            if entries and entry.index != entries[-1].index + 1:
                raise StorageError(
                    f"{path}: entry {entry.index} at offset {pos} follows entry "
                    f"{entries[-1].index} (indices must be contiguous)"
                )
            if entries and entry.term < entries[-1].term:
                raise StorageError(
                    f"{path}: entry {entry.index} has a lower term than the one before"
                )
            entries.append(entry)
            offsets.append(pos)
            pos = end
        kept = _after_snapshot(entries, snapshot)
        first = snapshot.index + 1 if snapshot is not None else 1
        if kept and kept[0].index != first:
            raise StorageError(
                f"{path}: the log starts at entry {kept[0].index}, expected {first} "
                "(entries are missing)"
            )
        if len(kept) != len(entries):  # a crash between a snapshot's install and the log rewrite
            self._rewrite_log(kept)
        else:
            self._slots = [_Slot(e.index, e.term, o) for e, o in zip(entries, offsets, strict=True)]
            self._log = open(path, "ab")  # noqa: SIM115 - kept open for appends
        return kept

    # -- persisting ------------------------------------------------------------------------------

    def persist(self, ready: Ready, *, sync: bool = True) -> None:
        """Make the durable parts of ``ready`` (hard state, snapshot, truncation, appends) stable,
        in that order. A Ready with none of them does no I/O. With ``sync=False`` the final
        fsyncs are left to the next :meth:`sync` (the data is written, not yet durable)."""
        if not self._loaded:
            raise RuntimeError("RaftStorage.load() must be called before persist()")
        if ready.hard_state is not None and ready.hard_state != (self._pending_hard or self._hard):
            self._pending_hard = ready.hard_state
        if ready.snapshot is not None:
            self._install_snapshot(ready.snapshot)
        if ready.truncate_after is not None:
            self._truncate_after(ready.truncate_after)
        if ready.append:
            self._append(ready.append)
        if sync:
            self.sync()

    def sync(self) -> None:
        """Make everything persisted so far durable; nothing pending: no I/O."""
        if self._pending_hard is not None:
            hard = self._pending_hard
            doc = {
                "term": hard.term,
                "voted_for": hard.voted_for,
                "crc": _hard_crc(hard.term, hard.voted_for),
            }
            _write_synced(self.directory / HARD_STATE_FILE, json.dumps(doc).encode())
            self._hard, self._pending_hard = hard, None
            self._dir_dirty = True
        if self._log_dirty:
            self._file().flush()
            os.fsync(self._file().fileno())
            self._log_dirty = False
        if self._dir_dirty:
            _fsync_dir(self.directory)
            self._dir_dirty = False

    def close(self) -> None:
        """Sync what is pending and close the log file."""
        if self._log is None:
            return
        self.sync()
        self._log.close()
        self._log = None
        self._loaded = False

    def _file(self) -> BufferedWriter:
        if self._log is None:
            raise RuntimeError("RaftStorage is not loaded (call load() first)")
        return self._log

    @property
    def hard_state(self) -> HardState:
        """The term and vote last made durable."""
        return self._hard

    @property
    def last_index(self) -> int:
        """Index of the last entry in the log file (0 when it is empty)."""
        return self._slots[-1].index if self._slots else 0

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        head = _SNAP_HEAD.pack(
            _SNAP_MAGIC,
            snapshot.index,
            snapshot.term,
            len(snapshot.data),
            zlib.crc32(snapshot.data),
        )
        _write_synced(self.directory / SNAPSHOT_FILE, head + snapshot.data)
        self._dir_dirty = True
        keep_from = _first_after(self._slots, snapshot)
        if keep_from == 0:
            return  # nothing at or below the snapshot (or no log at all): nothing to drop
        self._file().flush()
        start = self._slots[keep_from].offset if keep_from < len(self._slots) else None
        tail = b""
        if start is not None:
            with open(self.directory / LOG_FILE, "rb") as f:
                f.seek(start)
                tail = f.read()
        self._file().close()
        self._write_log(tail, [(s.index, s.term) for s in self._slots[keep_from:]])

    def _rewrite_log(self, entries: list[LogEntry]) -> None:
        if self._log is not None:
            self._log.close()
        frames = [_frame(e) for e in entries]
        slots: list[tuple[int, int]] = [(e.index, e.term) for e in entries]
        self._write_log(b"".join(frames), slots)
        _fsync_dir(self.directory)
        self._dir_dirty = False

    def _write_log(self, data: bytes, slots: list[tuple[int, int]]) -> None:
        """Replace log.bin with ``data``, the frames of the entries ``slots`` (index, term)."""
        path = self.directory / LOG_FILE
        _write_synced(path, data)
        self._dir_dirty = True
        self._slots = _scan_offsets(data, slots)
        self._log = open(path, "ab")  # noqa: SIM115 - kept open for appends
        self._log_dirty = False

    def _truncate_after(self, index: int) -> None:
        keep = sum(1 for s in self._slots if s.index <= index)
        if keep == len(self._slots):
            return
        offset = self._slots[keep].offset
        self._file().flush()
        self._file().truncate(offset)
        # Durable before new frames go where the old ones were: a crash in the next append must
        # leave a torn tail, never a mix of new and old frames that reads as damage mid-log.
        os.fsync(self._file().fileno())
        # Appends still land at the end, but the file position (which ``_append`` reads as the
        # next frame's offset) stays where it was before the cut: bring it to the new end.
        self._file().seek(offset)
        del self._slots[keep:]

    def _append(self, entries: list[LogEntry]) -> None:
        expected = self.last_index + 1
        if self._slots and entries[0].index != expected:
            raise StorageError(
                f"{self.directory / LOG_FILE}: appending entry {entries[0].index} after "
                f"{self.last_index}"
            )
        offset = self._file().tell()
        chunks: list[bytes] = []
        for entry in entries:
            frame = _frame(entry)
            self._slots.append(_Slot(entry.index, entry.term, offset))
            offset += len(frame)
            chunks.append(frame)
        self._file().write(b"".join(chunks))
        self._log_dirty = True


def _hard_crc(term: int, voted_for: str | None) -> int:
    return zlib.crc32(f"{term}\0{voted_for}".encode())


def _read_frame(raw: bytes, pos: int) -> tuple[LogEntry | None, int, str]:
    """The entry framed at ``pos``, the offset after it, and what is wrong if it is None."""
    if len(raw) - pos < _FRAME.size:
        return None, len(raw), "a cut frame header"
    length, crc = _FRAME.unpack_from(raw, pos)
    start = pos + _FRAME.size
    end = start + length
    if end > len(raw):
        return None, len(raw), "a frame longer than the file"
    payload = raw[start:end]
    if zlib.crc32(payload) != crc or length == 0:
        return None, end, "a frame with a bad checksum"
    try:
        return unpack_record(LogEntry, payload), end, ""
    except ProtocolError as exc:
        return None, end, f"an undecodable entry ({exc})"


def _is_tail(raw: bytes, pos: int, end: int) -> bool:
    """Is the bad frame at ``pos`` (ending at ``end``) a torn tail: nothing but it, or only
    zeros (space the file system allocated but never filled), from ``pos`` to the end?"""
    return end >= len(raw) or not raw[pos:].strip(b"\0")


def _after_snapshot(entries: list[LogEntry], snapshot: Snapshot | None) -> list[LogEntry]:
    if snapshot is None:
        return entries
    for i, entry in enumerate(entries):
        if entry.index == snapshot.index:
            return entries[i + 1 :] if entry.term == snapshot.term else []
    if entries and entries[0].index > snapshot.index:
        return entries
    return []


def _first_after(slots: list[_Slot], snapshot: Snapshot) -> int:
    """Position in ``slots`` of the first entry to keep after installing ``snapshot``."""
    for i, slot in enumerate(slots):
        if slot.index == snapshot.index:
            return i + 1 if slot.term == snapshot.term else len(slots)
    if slots and slots[0].index > snapshot.index:
        return 0
    return len(slots)


def _scan_offsets(data: bytes, slots: list[tuple[int, int]]) -> list[_Slot]:
    out: list[_Slot] = []
    pos = 0
    for index, term in slots:
        out.append(_Slot(index, term, pos))
        (length, _crc) = _FRAME.unpack_from(data, pos)
        pos += _FRAME.size + length
    return out
