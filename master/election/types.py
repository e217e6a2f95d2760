"""The election core's data: settings, durable state and what one step asks its shell to do.

The core (:mod:`agora.master.election.raft`) is sans-IO: the shell feeds it peer messages,
proposals and ticks with the monotonic time, and gets back a :class:`Ready`. The shell must carry
out a ``Ready`` in the order of its fields: make ``hard_state``, the log changes and ``snapshot``
durable (fsync) *before* sending ``messages``, then apply ``committed``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from agora.sdk.messages import LogEntry, Message

__all__ = ["HardState", "RaftConfig", "Ready", "Role", "Snapshot"]


@dataclass(frozen=True, slots=True)
class RaftConfig:
    #: This master's name: its client endpoint exactly as in ``members``.
    node_id: str
    #: Every master of the group, this one included (static membership: 1, 3 or 5 of them).
    members: tuple[str, ...]
    #: A leader sends AppendEntries (maybe empty) to every follower this often.
    heartbeat_interval: float = 0.1
    #: T: a follower that hears no leader for a random time in [T, 2T) starts an election.
    election_timeout: float = 1.0
    #: Bound on clock drift between masters (rho) used by the leader lease.
    drift_bound: float = 0.05
    #: Safety margin (epsilon, seconds) subtracted from the lease.
    lease_margin: float = 0.05
    #: Most entries and bytes of entry data in one AppendEntries.
    max_entries_per_append: int = 512
    max_bytes_per_append: int = 1024 * 1024
    pre_vote: bool = True
    check_quorum: bool = True


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class HardState:
    """What must survive a crash before the node may reply: its term and its vote in that term."""

    term: int = 0
    voted_for: str | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The applied state machine (the whole registry, encoded) up to and including ``index``."""

    index: int
    term: int
    data: bytes


@dataclass(slots=True)
class Ready:
    """What one call into the core produced, in the order the shell must carry it out."""

    #: 1. Persist (fsync) this term and vote, if not None.
    hard_state: HardState | None = None
    #: 2. Install this snapshot durably: it replaces every log entry up to ``snapshot.index``
    #:    (and the whole log, if the log does not hold an entry with its index and term). When the
    #:    snapshot came from the leader, the shell also restores its state machine from it.
    snapshot: Snapshot | None = None
    #: 3. Drop every log entry with an index above this one (a conflict with the leader's log),
    #:    then append ``append`` (fsync).
    truncate_after: int | None = None
    append: list[LogEntry] = field(default_factory=list)
    #: 4. Only after 1-3 are durable: send each message to the named member.
    messages: list[tuple[str, Message]] = field(default_factory=list)
    #: 5. Apply these newly committed entries to the state machine, in order.
    committed: list[LogEntry] = field(default_factory=list)

    def empty(self) -> bool:
        return (
            self.hard_state is None
            and self.snapshot is None
            and self.truncate_after is None
            and not self.append
            and not self.messages
            and not self.committed
        )
