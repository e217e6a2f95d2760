"""A deterministic simulation of a group of :class:`RaftNode` cores on a faulty network.

One ``random.Random(seed)`` drives everything: message latency, loss, duplication, the ticks'
phases and each node's election timer. Nodes tick every 10 ms of simulated time. The network
delays every message independently (so messages overtake each other, on one link too), drops
and duplicates them, and cuts links (one-way or both ways); a message that meets a cut is dropped,
or with probability ``hold`` kept and delivered after the heal, as ZeroMQ queues across an
iptables DROP. A crashed node keeps exactly what it persisted through its Readys (hard state,
snapshot, log); its state machine is restored from its snapshot on restart.

Every event is followed by the safety checks (``SimViolation`` on failure): one leader per term,
terms never decrease (restarts included), entries with one index and term hold one payload, no
two nodes apply different things at one index, every committed entry is in each later leader's
log, and no two nodes hold a valid lease at once. ``check_log_matching`` compares whole logs.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from agora.master.election.raft import RaftNode
from agora.master.election.types import HardState, RaftConfig, Ready, Role, Snapshot
from agora.sdk import codec
from agora.sdk.messages import InstallSnapshot, LogEntry, Message, VoteReply, VoteRequest

__all__ = ["Faults", "RaftSim", "SimViolation"]

TICK = 0.010


class SimViolation(AssertionError):
    pass


@dataclass(slots=True)
class Faults:
    latency_min: float = 0.001
    latency_max: float = 0.010
    drop: float = 0.0
    duplicate: float = 0.0
    #: Chance that a message meeting a cut link is delivered after the heal instead of lost.
    hold: float = 0.0


@dataclass(slots=True)
class Member:
    name: str
    raft: RaftNode | None = None
    incarnation: int = 0
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    log: list[LogEntry] = field(default_factory=list)
    sm_index: int = 0
    sm_digest: bytes = b""
    max_term: int = 0


def _digest(previous: bytes, entry: LogEntry) -> bytes:
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(entry.index.to_bytes(8, "big") + entry.data)
    return h.digest()


class RaftSim:
    def __init__(
        self,
        n: int,
        seed: int,
        *,
        faults: Faults | None = None,
        wire: bool = False,
        compact_every: int = 0,
        **config: object,
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults or Faults()
        self.wire = wire
        self.compact_every = compact_every
        self.now = 0.0
        self.names = tuple(f"m{i}" for i in range(n))
        self.base = RaftConfig(node_id=self.names[0], members=self.names)
        self.base = replace(self.base, **config)  # type: ignore[arg-type]
        self.members = {name: Member(name) for name in self.names}
        self.cut: set[tuple[str, str]] = set()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._held: list[tuple[str, str, Message]] = []
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}
        self.digests: dict[int, bytes] = {}
        self.entry_ids: dict[tuple[int, int], bytes] = {}
        self._completeness_checked: set[int] = set()
        self.events = 0
        for name in self.names:
            self.restart(name)

    # -- queue -------------------------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, action))

    def run_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = self.now + timeout
        while not predicate():
            if not self._queue or self._queue[0][0] > deadline:
                self.now = deadline
                return predicate()
            when, _, action = heapq.heappop(self._queue)
            self.now = when
            action()
            self.events += 1
            self._check_leases()
        return True

    def run_for(self, seconds: float) -> None:
        self.run_until(lambda: False, seconds)

    # -- nodes -------------------------------------------------------------------------------

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.raft is not None]

    def leader(self) -> str | None:
        """The live leader of the highest term, if any."""
        best: tuple[int, str] | None = None
        for m in self.alive():
            assert m.raft is not None
            if m.raft.role is Role.LEADER and (best is None or m.raft.term > best[0]):
                best = (m.raft.term, m.name)
        return best[1] if best else None

    def crash(self, name: str) -> None:
        member = self.members[name]
        member.raft = None
        member.incarnation += 1

    def restart(self, name: str) -> None:
        member = self.members[name]
        member.incarnation += 1
        if member.hard_state.term < member.max_term:
            raise SimViolation(
                f"{name} persisted term {member.hard_state.term} < {member.max_term}"
            )
        member.raft = RaftNode(
            replace(self.base, node_id=name),
            hard_state=member.hard_state,
            snapshot=member.snapshot,
            entries=list(member.log),
            now=self.now,
            rng=random.Random(self.rng.random()),
        )
        member.sm_index = member.snapshot.index if member.snapshot else 0
        member.sm_digest = member.snapshot.data if member.snapshot else b""
        incarnation = member.incarnation
        self._at(self.now + self.rng.random() * TICK, lambda: self._tick(name, incarnation))

    def _tick(self, name: str, incarnation: int) -> None:
        member = self.members[name]
        if member.raft is None or member.incarnation != incarnation:
            return
        self._handle(member, member.raft.tick(self.now), from_leader=False)
        self._at(self.now + TICK, lambda: self._tick(name, incarnation))
        if self.compact_every and member.sm_index - self._snap_index(member) >= self.compact_every:
            self.compact(name)

    def _snap_index(self, member: Member) -> int:
        return member.snapshot.index if member.snapshot else 0

    def compact(self, name: str) -> None:
        member = self.members[name]
        if member.raft is None or member.sm_index <= self._snap_index(member):
            return
        term = next(e.term for e in member.log if e.index == member.sm_index)
        snap = Snapshot(index=member.sm_index, term=term, data=member.sm_digest)
        self._handle(member, member.raft.compact(snap), from_leader=False)

    def propose(self, data: bytes) -> int | None:
        name = self.leader()
        if name is None:
            return None
        member = self.members[name]
        assert member.raft is not None
        index, ready = member.raft.propose(data, self.now)
        self._handle(member, ready, from_leader=False)
        return index

    # -- network -----------------------------------------------------------------------------

    def isolate(self, name: str) -> None:
        self.partition([[name], [n for n in self.names if n != name]])

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        side = {n: i for i, group in enumerate(groups) for n in group}
        self.cut = {(a, b) for a in self.names for b in self.names if side.get(a) != side.get(b)}

    def cut_link(self, src: str, dst: str) -> None:
        self.cut.add((src, dst))

    def heal(self) -> None:
        self.cut.clear()
        held, self._held = self._held, []
        for src, dst, msg in held:
            self._at(self.now + self._latency(), functools.partial(self._arrive, src, dst, msg))

    def _latency(self) -> float:
        return self.rng.uniform(self.faults.latency_min, self.faults.latency_max)

    def _send(self, src: str, dst: str, msg: Message) -> None:
        if self.wire:
            msg = codec.decode(codec.encode(msg)).message
        copies = 1 + (self.rng.random() < self.faults.duplicate)
        for _ in range(copies):
            if self.rng.random() < self.faults.drop:
                continue
            self._at(self.now + self._latency(), lambda: self._arrive(src, dst, msg))

    def _arrive(self, src: str, dst: str, msg: Message) -> None:
        if (src, dst) in self.cut:
            if self.rng.random() < self.faults.hold:
                self._held.append((src, dst, msg))
            return
        member = self.members[dst]
        if member.raft is not None:
            ready = member.raft.step(msg, self.now)
            self._handle(member, ready, from_leader=isinstance(msg, InstallSnapshot))

    # -- carrying out a Ready, then checking -------------------------------------------------

    def _handle(self, member: Member, ready: Ready, *, from_leader: bool) -> None:
        if ready.hard_state is not None:
            member.hard_state = ready.hard_state
        if ready.snapshot is not None:
            self._install(member, ready.snapshot, restore=from_leader)
        if ready.truncate_after is not None:
            member.log = [e for e in member.log if e.index <= ready.truncate_after]
        for entry in ready.append:
            last = member.log[-1].index if member.log else self._snap_index(member)
            if entry.index != last + 1:
                raise SimViolation(f"{member.name} appends {entry.index} after {last}")
            known = self.entry_ids.setdefault((entry.index, entry.term), entry.data)
            if known != entry.data:
                raise SimViolation(f"two payloads at index {entry.index} term {entry.term}")
            member.log.append(entry)
        for to, msg in ready.messages:
            self._check_persisted_before(member, to, msg)
            self._send(member.name, to, msg)
        for entry in ready.committed:
            self._apply(member, entry)
        self._check_node(member)

    def _check_persisted_before(self, member: Member, to: str, msg: Message) -> None:
        """What a message claims (its term, a vote) must be durable before it leaves."""
        hard = member.hard_state
        if isinstance(msg, VoteRequest | VoteReply) and msg.pre_vote:
            return
        term: int = getattr(msg, "term", 0)
        if term > hard.term:
            raise SimViolation(f"{member.name} sends term {term} with {hard.term} persisted")
        if isinstance(msg, VoteReply) and msg.granted and hard.voted_for != to:
            raise SimViolation(f"{member.name} grants {to} a vote it has not persisted")

    def _install(self, member: Member, snap: Snapshot, *, restore: bool) -> None:
        if self.digests.get(snap.index) != snap.data:
            raise SimViolation(f"{member.name} got a snapshot at {snap.index} nobody applied")
        keep = any(e.index == snap.index and e.term == snap.term for e in member.log)
        member.log = [e for e in member.log if e.index > snap.index] if keep else []
        member.snapshot = snap
        if restore:
            if snap.index <= member.sm_index:
                raise SimViolation(f"{member.name} restores an older snapshot {snap.index}")
            member.sm_index, member.sm_digest = snap.index, snap.data

    def _apply(self, member: Member, entry: LogEntry) -> None:
        if entry.index != member.sm_index + 1:
            raise SimViolation(f"{member.name} applies {entry.index} after {member.sm_index}")
        member.sm_index = entry.index
        member.sm_digest = _digest(member.sm_digest, entry)
        if self.committed.setdefault(entry.index, (entry.term, entry.data)) != (
            entry.term,
            entry.data,
        ):
            raise SimViolation(f"{member.name} applies a different entry at {entry.index}")
        if self.digests.setdefault(entry.index, member.sm_digest) != member.sm_digest:
            raise SimViolation(f"{member.name} state diverges at {entry.index}")

    def _check_node(self, member: Member) -> None:
        raft = member.raft
        if raft is None:
            return
        if raft.term < member.max_term:
            raise SimViolation(f"{member.name} term went from {member.max_term} to {raft.term}")
        member.max_term = raft.term
        if raft.role is Role.LEADER:
            holder = self.leaders.setdefault(raft.term, member.name)
            if holder != member.name:
                raise SimViolation(f"two leaders in term {raft.term}: {holder}, {member.name}")
            if raft.term not in self._completeness_checked:
                self._completeness_checked.add(raft.term)
                self._check_completeness(member)

    def _check_completeness(self, member: Member) -> None:
        assert member.raft is not None
        held = {e.index: (e.term, e.data) for e in member.log}
        base = self._snap_index(member)
        for index, entry in self.committed.items():
            if index > base and held.get(index) != entry:
                raise SimViolation(f"leader {member.name} lacks committed entry {index}")

    def _check_leases(self) -> None:
        holders = [m.name for m in self.alive() if m.raft and m.raft.lease_valid(self.now)]
        if len(holders) > 1:
            raise SimViolation(f"overlapping leases at {self.now:.3f}: {holders}")

    def check_log_matching(self) -> None:
        """If two logs hold an entry with the same index and term, they agree up to it."""
        logs = {m.name: {e.index: e for e in m.log} for m in self.members.values()}
        names = list(logs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                common = sorted(set(logs[a]) & set(logs[b]), reverse=True)
                same = next((x for x in common if logs[a][x].term == logs[b][x].term), None)
                if same is None:
                    continue
                for x in common:
                    if x <= same and logs[a][x] != logs[b][x]:
                        raise SimViolation(f"{a} and {b} agree at {same} but differ at {x}")
