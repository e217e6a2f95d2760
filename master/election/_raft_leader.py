"""What a Raft leader keeps for one term: each follower's progress, the broadcast rounds that
renew its lease, and the AppendEntries or InstallSnapshot each follower needs next."""

from __future__ import annotations

from dataclasses import dataclass

from agora.master.election._raft_log import RaftLog
from agora.master.election.types import RaftConfig, Snapshot
from agora.sdk.messages import AppendEntries, InstallSnapshot

__all__ = ["Leader", "Progress"]

#: Rounds kept for lease renewal; acks this late could not renew a lease anyway.
_MAX_ROUNDS = 1024
#: The wire format's bound on entries in one AppendEntries.
_MAX_ENTRIES_ON_WIRE = 4096


@dataclass(slots=True)
class Progress:
    #: The next entry to send (optimistic: raised as soon as entries are sent).
    next_index: int
    #: The highest entry known to be replicated on the follower.
    match_index: int = 0
    #: When the follower last answered in this term (None: not yet).
    last_heard: float | None = None
    #: The newest broadcast round the follower has answered.
    acked_seq: int = 0


class Leader:
    def __init__(
        self, config: RaftConfig, term: int, peers: tuple[str, ...], log: RaftLog, now: float
    ) -> None:
        self.config = config
        self.term = term
        self.log = log
        self.progress = {peer: Progress(next_index=log.last_index + 1) for peer in peers}
        self.quorum = (len(peers) + 1) // 2 + 1
        self.since = now
        self.seq = 0
        #: Send time of every round newer than the one the lease is based on.
        self._rounds: dict[int, float] = {}
        self.lease_start: float | None = None

    # -- rounds, contact and the lease -------------------------------------------------------

    def new_round(self, now: float) -> None:
        self.seq += 1
        self._rounds[self.seq] = now
        if len(self._rounds) > _MAX_ROUNDS:
            del self._rounds[min(self._rounds)]
        if self.quorum == 1:
            self._renew(self.seq)

    def _heard(self, peer: str, seq: int, now: float) -> None:
        """``peer`` answered round ``seq`` (any answer in this term renews contact)."""
        prog = self.progress[peer]
        prog.last_heard = now
        if self.seq >= seq > prog.acked_seq:
            prog.acked_seq = seq
            acked = sorted((p.acked_seq for p in self.progress.values()), reverse=True)
            self._renew(acked[self.quorum - 2])

    def _renew(self, seq: int) -> None:
        """Round ``seq`` is acked by a majority: its send time becomes the lease's start."""
        sent = self._rounds.get(seq)
        if sent is None:
            return
        if self.lease_start is None or sent > self.lease_start:
            self.lease_start = sent
        for old in [s for s in self._rounds if s < seq]:
            del self._rounds[old]

    def active_quorum(self, now: float) -> bool:
        """Whether a majority (this leader included) was heard from within T; a follower not
        yet heard counts as heard when this leadership began."""
        active = 1
        for prog in self.progress.values():
            heard = prog.last_heard if prog.last_heard is not None else self.since
            if now - heard < self.config.election_timeout:
                active += 1
        return active >= self.quorum

    # -- replication -------------------------------------------------------------------------

    def commit_index(self, commit: int) -> int:
        """The commit index given the followers' matches: the highest index held by a majority,
        if it is of this term (an older entry is never committed by counting, §5.4.2)."""
        matches = [self.log.last_index, *(p.match_index for p in self.progress.values())]
        index = sorted(matches, reverse=True)[self.quorum - 1]
        if index > commit and self.log.term_at(index) == self.term:
            return index
        return commit

    def on_reply(
        self, peer: str, *, success: bool, index: int, seq: int, now: float
    ) -> tuple[bool, bool]:
        """A follower's answer; returns (its match index rose, it should be sent more now)."""
        self._heard(peer, seq, now)
        prog = self.progress[peer]
        if not success:
            # Its log ends (or stops matching) before what we sent: back off to its hint.
            if prog.match_index <= index < prog.next_index - 1:
                prog.next_index = index + 1
                return False, True
            return False, False
        if index > self.log.last_index:
            return False, False
        advanced = index > prog.match_index
        if advanced:
            prog.match_index = index
        prog.next_index = max(prog.next_index, index + 1)
        return advanced, prog.next_index <= self.log.last_index

    def message_for(
        self, peer: str, sender: str, commit: int, snapshot: Snapshot | None
    ) -> AppendEntries | InstallSnapshot:
        """What ``peer`` needs from its next index on: entries, an empty heartbeat, or the
        snapshot if those entries are compacted. Advances its next index optimistically."""
        prog = self.progress[peer]
        prev = prog.next_index - 1
        prev_term = self.log.term_at(prev)
        if prev_term is None and prev < self.log.snapshot_index and snapshot is not None:
            prog.next_index = snapshot.index + 1
            return InstallSnapshot(
                sender=sender,
                term=self.term,
                last_index=snapshot.index,
                last_term=snapshot.term,
                data=snapshot.data,
                seq=self.seq,
            )
        if prev_term is None:  # beyond our log (cannot happen): restart from our end
            prev, prev_term = self.log.last_index, self.log.last_term
        cfg = self.config
        limit = min(cfg.max_entries_per_append, _MAX_ENTRIES_ON_WIRE)
        entries = self.log.slice(prev + 1, limit, cfg.max_bytes_per_append)
        prog.next_index = prev + len(entries) + 1
        return AppendEntries(
            sender=sender,
            term=self.term,
            prev_log_index=prev,
            prev_log_term=prev_term,
            entries=tuple(entries),
            leader_commit=commit,
            seq=self.seq,
        )
