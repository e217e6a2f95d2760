"""Messages between masters (Raft election and log replication) and leader detection.

Masters are named by their client endpoint as written in ``--masters`` (``tcp://host:port``); every
master-to-master message carries its ``sender``: a request's answer goes back over the
connection the request came in on, or, when that is gone, over the replier's own link.
Entries of the replicated log carry opaque bytes: an encoded registry operation, or nothing for the
no-op a new leader commits in its term.

Any client may ask any master ``DETECT_LEADER``; a master answers ``LEADER`` with what it knows. A
client switches to a new leader only when that master itself says it leads (``leader ==
responder``) at an epoch higher than the one the client follows.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from agora.sdk.messages._record import MaxItems, MaxLen, Message, Range, Record, ShortStr

__all__ = [
    "MESSAGES",
    "AppendEntries",
    "AppendReply",
    "DetectLeader",
    "InstallSnapshot",
    "LeaderInfo",
    "LogEntry",
    "SnapshotReply",
    "VoteReply",
    "VoteRequest",
]

_Index = Annotated[int, Range(0, 2**63 - 1)]
_Term = Annotated[int, Range(0, 2**63 - 1)]

#: Largest payload of one log entry (a registry operation is a few hundred bytes).
MAX_ENTRY_BYTES = 1024 * 1024
#: Largest snapshot carried in one message (the whole registry).
MAX_SNAPSHOT_BYTES = 12 * 1024 * 1024


class LogEntry(Record, frozen=True, kw_only=True):
    """One entry of the replicated log; empty ``data`` is a leader's no-op."""

    term: _Term
    index: _Index
    data: Annotated[bytes, MaxLen(MAX_ENTRY_BYTES)] = b""


class VoteRequest(Message, frozen=True, kw_only=True):
    """Raft RequestVote; ``pre_vote`` asks "would you vote?" without anyone changing term."""

    NAME: ClassVar[str] = "RAFT_VOTE"
    sender: ShortStr
    term: _Term
    last_log_index: _Index
    last_log_term: _Term
    pre_vote: bool = False


class VoteReply(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RAFT_VOTE_REPLY"
    sender: ShortStr
    #: The term of the request for a granted pre-vote; otherwise the voter's current term.
    term: _Term
    granted: bool
    pre_vote: bool = False


class AppendEntries(Message, frozen=True, kw_only=True):
    """Raft AppendEntries (a heartbeat when ``entries`` is empty); ``seq`` numbers the leader's
    rounds so replies can renew its lease."""

    NAME: ClassVar[str] = "RAFT_APPEND"
    sender: ShortStr
    term: _Term
    prev_log_index: _Index
    prev_log_term: _Term
    entries: Annotated[tuple[LogEntry, ...], MaxItems(4096)] = ()
    leader_commit: _Index = 0
    seq: _Index = 0
    #: The leader's operator HTTP API ("": none), so a standby can redirect operators there.
    leader_http: ShortStr = ""


class AppendReply(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RAFT_APPEND_REPLY"
    sender: ShortStr
    term: _Term
    success: bool
    #: On success the index the follower now matches; on failure its last log index (a hint).
    match_index: _Index
    seq: _Index = 0


class InstallSnapshot(Message, frozen=True, kw_only=True):
    """The leader's whole state machine up to ``last_index``, for a follower too far behind."""

    NAME: ClassVar[str] = "RAFT_SNAPSHOT"
    sender: ShortStr
    term: _Term
    last_index: _Index
    last_term: _Term
    data: Annotated[bytes, MaxLen(MAX_SNAPSHOT_BYTES)]
    seq: _Index = 0


class SnapshotReply(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RAFT_SNAPSHOT_REPLY"
    sender: ShortStr
    term: _Term
    match_index: _Index
    seq: _Index = 0


class DetectLeader(Message, frozen=True, kw_only=True):
    """Which master leads? Any client may ask any master."""

    NAME: ClassVar[str] = "DETECT_LEADER"


class LeaderInfo(Message, frozen=True, kw_only=True):
    """A master's answer to DETECT_LEADER, also pushed by a new leader to every client it knows."""

    NAME: ClassVar[str] = "LEADER"
    #: The master answering (its endpoint as in ``--masters``).
    responder: ShortStr
    #: The leader's endpoint, or None while no leader is known (an election is under way).
    leader: ShortStr | None = None
    #: The newest term the responder knows; a leader's epoch.
    epoch: _Term = 0
    #: Every master of the group, leader included.
    masters: Annotated[tuple[ShortStr, ...], MaxItems(16)] = ()


MESSAGES: tuple[type[Message], ...] = (
    VoteRequest,
    VoteReply,
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    SnapshotReply,
    DetectLeader,
    LeaderInfo,
)
