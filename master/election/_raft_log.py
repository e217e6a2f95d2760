"""The in-memory Raft log of :class:`~agora.master.election.raft.RaftNode`: a compacted prefix
(the snapshot's index and term) followed by contiguous entries."""

from __future__ import annotations

from collections.abc import Sequence

from agora.sdk.messages import LogEntry

__all__ = ["RaftLog"]


class RaftLog:
    def __init__(
        self, snapshot_index: int, snapshot_term: int, entries: Sequence[LogEntry]
    ) -> None:
        expected = snapshot_index + 1
        last_term = snapshot_term
        for entry in entries:
            if entry.index != expected:
                raise ValueError(f"log entry {entry.index} where {expected} was expected")
            if entry.term < last_term:
                raise ValueError(f"log entry {entry.index} has a term lower than the one before")
            expected += 1
            last_term = entry.term
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self._entries: list[LogEntry] = list(entries)

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index``; None if compacted away or beyond the end."""
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.snapshot_index or index > self.last_index:
            return None
        return self._entries[index - self.snapshot_index - 1].term

    def entry(self, index: int) -> LogEntry:
        """The entry at ``index``, which must be held (above the snapshot, at most the last)."""
        return self._entries[index - self.snapshot_index - 1]

    def slice(self, start: int, max_entries: int, max_bytes: int) -> list[LogEntry]:
        """Entries from ``start`` on: at most ``max_entries`` and ``max_bytes`` of data, but at
        least one if any is held."""
        lo = start - self.snapshot_index - 1
        if lo < 0 or lo >= len(self._entries):
            return []
        out: list[LogEntry] = []
        size = 0
        for entry in self._entries[lo : lo + max(1, max_entries)]:
            size += len(entry.data)
            if out and size > max_bytes:
                break
            out.append(entry)
        return out

    def first_new(self, entries: Sequence[LogEntry]) -> int:
        """The position in ``entries`` of the first one this log does not hold as is."""
        for pos, entry in enumerate(entries):
            if self.term_at(entry.index) != entry.term:
                return pos
        return len(entries)

    def append(self, entry: LogEntry) -> None:
        self._entries.append(entry)

    def truncate_after(self, index: int) -> None:
        del self._entries[max(0, index - self.snapshot_index) :]

    def compact(self, index: int, term: int) -> None:
        """Drop entries up to ``index``; keep what follows it only if the log holds ``index`` in
        ``term`` (otherwise the whole log goes)."""
        if self.term_at(index) == term and index <= self.last_index:
            del self._entries[: index - self.snapshot_index]
        else:
            self._entries = []
        self.snapshot_index = index
        self.snapshot_term = term

    def is_up_to_date(self, last_term: int, last_index: int) -> bool:
        """Whether a log ending at (``last_term``, ``last_index``) is at least as up to date."""
        return (last_term, last_index) >= (self.last_term, self.last_index)

    def conflict_hint(self, prev_index: int, prev_term: int, floor: int) -> int:
        """Where a leader should retry after our entry at ``prev_index`` did not match
        ``prev_term``: the last index not above ``prev_index - 1`` whose term is at most
        ``prev_term`` (entries of a later term cannot match), but not below ``floor``."""
        hint = min(self.last_index, prev_index - 1)
        while hint > floor:
            term = self.term_at(hint)
            if term is None or term <= prev_term:
                break
            hint -= 1
        return max(hint, floor)
