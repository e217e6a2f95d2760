"""A sans-IO Raft node: election (Pre-Vote, leader stickiness, CheckQuorum), log replication,
snapshots and a leader lease.

The node does no I/O and reads no clock: the shell passes the monotonic time into every call
and carries out the returned :class:`~agora.master.election.types.Ready` in field order (persist,
then send, then apply). Rules follow the Raft paper and Ongaro's thesis; the invariants the
group keeps are checked on real processes by the fault suite (``tests/fault/README.md``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import structlog
from agora.master.election._raft_checks import well_formed
from agora.master.election._raft_leader import Leader
from agora.master.election._raft_log import RaftLog
from agora.master.election.types import HardState, RaftConfig, Ready, Role, Snapshot
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
from agora.sdk.messages.election import MAX_ENTRY_BYTES

__all__ = ["RaftNode"]

log = structlog.get_logger(__name__)

#: Most AppendEntries one batch of proposals sends a follower at once (well under the peer
#: queue's bound); a follower's successful reply pulls whatever is left.
_MAX_APPENDS_PER_PROPOSAL = 4


class RaftNode:
    def __init__(
        self,
        config: RaftConfig,
        *,
        hard_state: HardState,
        snapshot: Snapshot | None,
        entries: Sequence[LogEntry],
        now: float,
        rng: random.Random,
    ) -> None:
        if config.node_id not in config.members:
            raise ValueError(f"{config.node_id!r} is not one of the members {config.members}")
        self._config = config
        self._id = config.node_id
        self._peers = tuple(m for m in dict.fromkeys(config.members) if m != self._id)
        self._quorum = (len(self._peers) + 1) // 2 + 1
        self._rng = rng
        self._snapshot = snapshot
        base_index = snapshot.index if snapshot is not None else 0
        self._log = RaftLog(base_index, snapshot.term if snapshot is not None else 0, entries)
        self._term = max(hard_state.term, self._log.last_term)
        self._voted_for = hard_state.voted_for if self._term == hard_state.term else None
        self._role = Role.FOLLOWER
        self._leader_id: str | None = None
        self._commit = base_index
        self._applied = base_index
        # A (re)started node acts as if it had just heard from a leader: it refuses votes for T,
        # since it cannot know whether it acknowledged a leader's lease before it went down.
        self._heard_leader_at = now
        self._election_due = now
        self._reset_election_timer(now)
        self._heartbeat_due = now
        self._leader: Leader | None = None
        #: Per follower, the hint and round of the last resend after a refused AppendEntries.
        self._backed_off: dict[str, tuple[int, int]] = {}
        self._votes: dict[str, bool] = {}
        self._ready = Ready()
        self._hard_before = (self._term, self._voted_for)

    # -- read-only state ---------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @property
    def commit_index(self) -> int:
        return self._commit

    @property
    def last_index(self) -> int:
        return self._log.last_index

    def lease_valid(self, now: float) -> bool:
        if self._role is not Role.LEADER or self._leader is None:
            return False
        start = self._leader.lease_start
        if start is None:
            return False
        cfg = self._config
        return now < start + cfg.election_timeout * (1 - cfg.drift_bound) - cfg.lease_margin

    def lease_until(self) -> float | None:
        """When the current lease ends (monotonic seconds), or None without one."""
        if self._role is not Role.LEADER or self._leader is None:
            return None
        start = self._leader.lease_start
        if start is None:
            return None
        cfg = self._config
        return start + cfg.election_timeout * (1 - cfg.drift_bound) - cfg.lease_margin

    def contact(self, now: float) -> dict[str, float | None]:
        if self._role is not Role.LEADER or self._leader is None:
            return {}
        return {
            peer: None if prog.last_heard is None else now - prog.last_heard
            for peer, prog in self._leader.progress.items()
        }

    # -- inputs ------------------------------------------------------------------------------

    def step(self, message: Message, now: float) -> Ready:
        msg = well_formed(message)
        if msg is None or msg.sender not in self._peers:
            return Ready()
        self._begin()
        if msg.term > self._term:
            if isinstance(msg, VoteRequest):
                if self._sticky(now):
                    self._reject_vote(msg)
                    return self._finish()
                if not msg.pre_vote:
                    self._become_follower(msg.term, None, now)
            elif not (isinstance(msg, VoteReply) and msg.pre_vote and msg.granted):
                leads = isinstance(msg, AppendEntries | InstallSnapshot)
                self._become_follower(msg.term, msg.sender if leads else None, now)
        elif msg.term < self._term:
            self._on_stale(msg)
            return self._finish()
        if isinstance(msg, VoteRequest):
            self._on_vote_request(msg, now)
        elif isinstance(msg, VoteReply):
            self._on_vote_reply(msg, now)
        elif isinstance(msg, AppendEntries):
            self._on_append(msg, now)
        elif isinstance(msg, InstallSnapshot):
            self._on_snapshot(msg, now)
        else:
            self._on_reply(msg, now)
        return self._finish()

    def tick(self, now: float) -> Ready:
        self._begin()
        if self._role is Role.LEADER and self._leader is not None:
            if self._config.check_quorum and not self._leader.active_quorum(now):
                log.info("raft_leader_lost_quorum", node=self._id, term=self._term)
                self._become_follower(self._term, None, now)
            elif now >= self._heartbeat_due:
                self._broadcast(now)
        elif not self._peers:
            self._campaign(now)
        elif now >= self._election_due:
            if self._config.pre_vote:
                self._pre_campaign(now)
            else:
                self._campaign(now)
        return self._finish()

    def propose(self, data: bytes, now: float) -> tuple[int | None, Ready]:
        """Append ``data`` as a new entry if this node leads; raises ValueError if too large."""
        indexes, ready = self.propose_many((data,), now)
        return (None if indexes is None else indexes[0]), ready

    def propose_many(self, batch: Sequence[bytes], now: float) -> tuple[list[int] | None, Ready]:
        """Append every item of ``batch`` as a new entry if this node leads (None otherwise),
        and send each follower the new entries in as few AppendEntries as they fit in: one
        message per entry would overflow the small peer queues under a burst of proposals, and
        every drop costs a rejection and a resend. Raises ValueError if an item is too large."""
        for data in batch:
            if len(data) > MAX_ENTRY_BYTES:
                raise ValueError(f"entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
        if self._role is not Role.LEADER or self._leader is None:
            return None, Ready()
        self._begin()
        indexes = [self._append_own(data) for data in batch]
        if indexes:
            for peer in self._peers:
                progress = self._leader.progress[peer]
                # A follower still catching up gets one message; its replies pull the rest.
                sends = _MAX_APPENDS_PER_PROPOSAL if progress.next_index >= indexes[0] else 1
                for _ in range(sends):
                    if progress.next_index > indexes[-1]:
                        break
                    self._send_append(peer)
        self._maybe_commit()
        return indexes, self._finish()

    def compact(self, snapshot: Snapshot) -> Ready:
        """Drop the log up to ``snapshot.index``, which the shell has applied; ignored unless it
        is newer than the current snapshot and not beyond what this node has handed out."""
        if not self._log.snapshot_index < snapshot.index <= self._applied:
            return Ready()
        term = self._log.term_at(snapshot.index)
        if term is None or term != snapshot.term:
            log.warning("raft_compact_term_mismatch", node=self._id, index=snapshot.index)
            return Ready()
        self._begin()
        self._log.compact(snapshot.index, snapshot.term)
        self._snapshot = snapshot
        self._ready.snapshot = snapshot
        return self._finish()

    # -- Ready bookkeeping -------------------------------------------------------------------

    def _begin(self) -> None:
        self._ready = Ready()
        self._hard_before = (self._term, self._voted_for)

    def _finish(self) -> Ready:
        ready = self._ready
        if (self._term, self._voted_for) != self._hard_before:
            ready.hard_state = HardState(term=self._term, voted_for=self._voted_for)
        while self._applied < self._commit:
            self._applied += 1
            ready.committed.append(self._log.entry(self._applied))
        self._ready = Ready()
        return ready

    def _send(self, to: str, message: Message) -> None:
        self._ready.messages.append((to, message))

    def _append_entry(self, entry: LogEntry) -> None:
        self._log.append(entry)
        self._ready.append.append(entry)

    def _truncate(self, after: int) -> None:
        self._log.truncate_after(after)
        ready = self._ready
        ready.truncate_after = (
            after if ready.truncate_after is None else min(ready.truncate_after, after)
        )
        ready.append = [e for e in ready.append if e.index <= after]

    # -- roles -------------------------------------------------------------------------------

    def _reset_election_timer(self, now: float) -> None:
        timeout = self._config.election_timeout
        self._election_due = now + timeout + self._rng.random() * timeout

    def _sticky(self, now: float) -> bool:
        """Whether to refuse votes because a leader was heard within T (thesis §4.2.3)."""
        if self._role is Role.LEADER:
            return self._config.check_quorum
        return now - self._heard_leader_at < self._config.election_timeout

    def _become_follower(self, term: int, leader: str | None, now: float) -> None:
        if term > self._term:
            self._term = term
            self._voted_for = None
        if self._role is not Role.FOLLOWER or self._leader_id != leader:
            log.info("raft_follower", node=self._id, term=term, leader=leader)
        self._role = Role.FOLLOWER
        self._leader_id = leader
        self._leader = None
        self._votes = {}
        self._reset_election_timer(now)

    def _pre_campaign(self, now: float) -> None:
        self._role = Role.PRE_CANDIDATE
        self._leader_id = None
        self._votes = {self._id: True}
        self._reset_election_timer(now)
        self._request_votes(self._term + 1, pre_vote=True)

    def _campaign(self, now: float) -> None:
        self._term += 1
        self._voted_for = self._id
        self._role = Role.CANDIDATE
        self._leader_id = None
        self._leader = None
        self._votes = {self._id: True}
        self._reset_election_timer(now)
        log.info("raft_campaign", node=self._id, term=self._term)
        if self._quorum == 1:
            self._become_leader(now)
        else:
            self._request_votes(self._term, pre_vote=False)

    def _request_votes(self, term: int, *, pre_vote: bool) -> None:
        last_index, last_term = self._log.last_index, self._log.last_term
        request = VoteRequest(
            sender=self._id,
            term=term,
            last_log_index=last_index,
            last_log_term=last_term,
            pre_vote=pre_vote,
        )
        for peer in self._peers:
            self._send(peer, request)

    def _become_leader(self, now: float) -> None:
        log.info("raft_leader", node=self._id, term=self._term)
        self._role = Role.LEADER
        self._leader_id = self._id
        self._votes = {}
        self._leader = Leader(self._config, self._term, self._peers, self._log, now)
        self._backed_off = {}
        self._append_own(b"")  # commits every earlier entry once replicated (paper §8)
        self._broadcast(now)
        self._maybe_commit()

    # -- elections ---------------------------------------------------------------------------

    def _reject_vote(self, msg: VoteRequest) -> None:
        reply = VoteReply(sender=self._id, term=self._term, granted=False, pre_vote=msg.pre_vote)
        self._send(msg.sender, reply)

    def _on_vote_request(self, msg: VoteRequest, now: float) -> None:
        if self._sticky(now):
            self._reject_vote(msg)
            return
        free = self._voted_for == msg.sender or (
            self._voted_for is None and self._leader_id is None
        )
        up_to_date = self._log.is_up_to_date(msg.last_log_term, msg.last_log_index)
        if msg.pre_vote:
            if (msg.term > self._term or free) and up_to_date:
                self._send(
                    msg.sender,
                    VoteReply(sender=self._id, term=msg.term, granted=True, pre_vote=True),
                )
            else:
                self._reject_vote(msg)
            return
        if free and up_to_date:
            self._voted_for = msg.sender
            self._reset_election_timer(now)
            self._send(msg.sender, VoteReply(sender=self._id, term=self._term, granted=True))
        else:
            self._reject_vote(msg)

    def _on_vote_reply(self, msg: VoteReply, now: float) -> None:
        if msg.pre_vote:
            if self._role is not Role.PRE_CANDIDATE:
                return
            if msg.term != (self._term + 1 if msg.granted else self._term):
                return
        elif self._role is not Role.CANDIDATE or msg.term != self._term:
            return
        self._votes[msg.sender] = msg.granted
        granted = sum(self._votes.values())
        if granted >= self._quorum:
            if msg.pre_vote:
                self._campaign(now)
            else:
                self._become_leader(now)
        elif len(self._votes) - granted >= self._quorum:
            self._become_follower(self._term, None, now)

    def _on_stale(self, msg: Message) -> None:
        """A message from an older term: tell its sender our term, so a deposed leader or a
        stale candidate steps down."""
        if isinstance(msg, VoteRequest):
            self._reject_vote(msg)
        elif isinstance(msg, AppendEntries):
            self._reply_append(msg, False, self._log.last_index)
        elif isinstance(msg, InstallSnapshot):
            self._send(msg.sender, SnapshotReply(sender=self._id, term=self._term, match_index=0))

    # -- replication: follower ---------------------------------------------------------------

    def _follow(self, leader: str, now: float) -> bool:
        """A leader of our term spoke; False if that cannot be (this node leads the term)."""
        if self._role is Role.LEADER:
            log.error("raft_two_leaders", node=self._id, term=self._term, other=leader)
            return False
        if self._role is not Role.FOLLOWER or self._leader_id != leader:
            self._become_follower(self._term, leader, now)
        self._heard_leader_at = now
        self._reset_election_timer(now)
        return True

    def _reply_append(self, msg: AppendEntries, success: bool, index: int) -> None:
        reply = AppendReply(
            sender=self._id, term=self._term, success=success, match_index=index, seq=msg.seq
        )
        self._send(msg.sender, reply)

    def _on_append(self, msg: AppendEntries, now: float) -> None:
        if not self._follow(msg.sender, now):
            return
        prev, prev_term, entries = msg.prev_log_index, msg.prev_log_term, msg.entries
        if prev < self._commit:
            # Everything up to our commit index is committed, hence in the leader's log too.
            entries = entries[self._commit - prev :]
            prev = self._commit
            prev_term = self._log.term_at(prev) or 0
        if self._log.term_at(prev) != prev_term:
            if prev > self._log.last_index:
                hint = self._log.last_index
            else:
                hint = self._log.conflict_hint(prev, prev_term, self._commit)
            self._reply_append(msg, False, hint)
            return
        new = self._log.first_new(entries)
        if new < len(entries):
            if entries[new].index <= self._log.last_index:
                self._truncate(entries[new].index - 1)
            for entry in entries[new:]:
                self._append_entry(entry)
        last_new = prev + len(entries)
        if msg.leader_commit > self._commit:
            self._commit = max(self._commit, min(msg.leader_commit, last_new))
        self._reply_append(msg, True, last_new)

    def _on_snapshot(self, msg: InstallSnapshot, now: float) -> None:
        if not self._follow(msg.sender, now):
            return
        if msg.last_index > self._commit:
            snapshot = Snapshot(index=msg.last_index, term=msg.last_term, data=msg.data)
            self._log.compact(snapshot.index, snapshot.term)
            self._snapshot = snapshot
            self._ready.snapshot = snapshot
            self._commit = self._applied = snapshot.index
            log.info("raft_snapshot_installed", node=self._id, index=snapshot.index)
        reply = SnapshotReply(
            sender=self._id, term=self._term, match_index=self._commit, seq=msg.seq
        )
        self._send(msg.sender, reply)

    # -- replication: leader -----------------------------------------------------------------

    def _append_own(self, data: bytes) -> int:
        entry = LogEntry(term=self._term, index=self._log.last_index + 1, data=data)
        self._append_entry(entry)
        return entry.index

    def _broadcast(self, now: float) -> None:
        assert self._leader is not None
        self._leader.new_round(now)
        self._heartbeat_due = now + self._config.heartbeat_interval
        for peer in self._peers:
            self._send_append(peer)

    def _send_append(self, peer: str) -> None:
        assert self._leader is not None
        self._send(peer, self._leader.message_for(peer, self._id, self._commit, self._snapshot))

    def _maybe_commit(self) -> None:
        assert self._leader is not None
        self._commit = self._leader.commit_index(self._commit)

    def _on_reply(self, msg: AppendReply | SnapshotReply, now: float) -> None:
        if self._role is not Role.LEADER or self._leader is None:
            return
        success = msg.success if isinstance(msg, AppendReply) else True
        progress = self._leader.progress[msg.sender]
        sent_up_to = progress.next_index
        advanced, more = self._leader.on_reply(
            msg.sender, success=success, index=msg.match_index, seq=msg.seq, now=now
        )
        if advanced:
            self._maybe_commit()
        if success:
            self._backed_off.pop(msg.sender, None)
        elif more:
            # Every message sent past a gap is refused with the same hint. Resend from it once
            # per broadcast round, not once per refusal (a resend may carry many entries): a
            # refusal from a round no newer than the resend's is stale. Should the resend be
            # lost, the next round's heartbeat is refused too and resends.
            last = self._backed_off.get(msg.sender)
            if last is not None and last[0] == msg.match_index and msg.seq <= last[1]:
                more = False
                progress.next_index = max(progress.next_index, sent_up_to)
            else:
                self._backed_off[msg.sender] = (msg.match_index, self._leader.seq)
        if more:
            self._send_append(msg.sender)
