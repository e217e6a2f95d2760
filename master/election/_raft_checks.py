"""Shape checks on peer messages before the Raft core looks at them: anything that could not
come from a correct peer (wrong types, numbers out of range, a non-contiguous batch) is dropped."""

from __future__ import annotations

from agora.sdk.messages import (
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    LogEntry,
    Message,
    SnapshotReply,
    VoteReply,
    VoteRequest,
)

__all__ = ["PeerMessage", "well_formed"]

PeerMessage = (
    VoteRequest | VoteReply | AppendEntries | AppendReply | InstallSnapshot | SnapshotReply
)

_MAX = 2**63 - 1


def _num(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX


def _entries_ok(msg: AppendEntries) -> bool:
    if not isinstance(msg.entries, tuple):
        return False
    index, term = msg.prev_log_index, msg.prev_log_term
    for entry in msg.entries:
        if not isinstance(entry, LogEntry) or not isinstance(entry.data, bytes):
            return False
        if not (_num(entry.index) and _num(entry.term)):
            return False
        if entry.index != index + 1 or not term <= entry.term <= msg.term:
            return False
        index, term = entry.index, entry.term
    return True


def well_formed(msg: Message) -> PeerMessage | None:
    """``msg`` as a peer message if it is one that makes sense, else None."""
    if not isinstance(
        msg, VoteRequest | VoteReply | AppendEntries | AppendReply | InstallSnapshot | SnapshotReply
    ):
        return None
    if not isinstance(msg.sender, str) or not _num(msg.term):
        return None
    if isinstance(msg, VoteRequest):
        ok = (
            _num(msg.last_log_index)
            and _num(msg.last_log_term)
            and isinstance(msg.pre_vote, bool)
            and msg.last_log_term <= msg.term
        )
    elif isinstance(msg, VoteReply):
        ok = isinstance(msg.granted, bool) and isinstance(msg.pre_vote, bool)
    elif isinstance(msg, AppendEntries):
        ok = (
            _num(msg.prev_log_index)
            and _num(msg.prev_log_term)
            and _num(msg.leader_commit)
            and _num(msg.seq)
            and msg.prev_log_term <= msg.term
            and _entries_ok(msg)
        )
    elif isinstance(msg, AppendReply):
        ok = isinstance(msg.success, bool) and _num(msg.match_index) and _num(msg.seq)
    elif isinstance(msg, InstallSnapshot):
        ok = (
            _num(msg.last_index)
            and _num(msg.last_term)
            and _num(msg.seq)
            and isinstance(msg.data, bytes)
            and msg.last_term <= msg.term
            and msg.last_index > 0
        )
    else:
        ok = _num(msg.match_index) and _num(msg.seq)
    return msg if ok else None
