"""A simulated group of masters: the real election core, registry and master core of each.

Each member does what ``agora-master``'s leadership (``master/server/leadership.py``) does
around its cores, with simulated I/O:

* its :class:`~agora.master.election.raft.RaftNode` ticks every ``raft_tick`` seconds, and what
  a ``Ready`` asks is carried out in order: the term, vote and log made durable (kept across a
  crash), then the messages sent on the simulated network, then the committed entries applied to
  the member's :class:`~agora.master.registry.Registry` replica;
* a leader becomes active once the no-op of its term is applied: a fresh :class:`Master` core of
  epoch = term, made from the replica (frameworks, tasks and offers are soft state, rebuilt from
  re-registering agents and re-subscribing frameworks); it acts only while its lease holds, and
  is dropped when it steps down or crashes;
* the core's ``Propose`` goes into the log, and ``committed``/``abandoned`` come back when the
  entry applies or the proposal times out.

Clients reach the group as ``agora.sdk.transport.MasterLink`` does: each follows the acting
member of the highest epoch it can reach, found by a probe every ``probe_interval`` seconds; a
switch is a disconnect then a connect (the agent core re-registers, the scheduler driver
re-subscribes), and frames from any member but the one followed are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agora.master.core import Master, MasterConfig, Send
from agora.master.core.actions import Propose
from agora.master.election.raft import RaftNode
from agora.master.election.types import HardState, RaftConfig, Ready, Role
from agora.master.registry import Registry, decode_operation, encode_operation
from agora.sdk.messages import LogEntry, Message

from support.sim.clock import EventQueue
from support.sim.network import MASTER, SimNetwork

__all__ = ["GroupConfig", "MasterGroup"]


@dataclass(slots=True)
class GroupConfig:
    size: int = 3
    raft_tick: float = 0.05
    heartbeat_interval: float = 0.25
    election_timeout: float = 1.5
    #: How often a client's link looks for the acting leader.
    probe_interval: float = 1.0
    #: A registry change not committed in this long is given up (Master.abandoned).
    propose_timeout: float = 8.0


@dataclass(eq=False)
class Member:
    name: str
    raft: RaftNode | None = None
    incarnation: int = 0
    #: What survives a crash: the term and vote, and the log.
    hard_state: HardState = field(default_factory=HardState)
    log: list[LogEntry] = field(default_factory=list)
    registry: Registry = field(default_factory=Registry)
    core: Master | None = None
    #: Log index -> the core's proposal sequence number, for the core of the current term.
    pending: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Client:
    """A client's link: whom it follows, and what to tell it when that changes."""

    connected: Callable[[], None]
    disconnected: Callable[[], None]
    following: str | None = None
    epoch: int = 0


class MasterGroup:
    def __init__(
        self,
        base: MasterConfig,
        config: GroupConfig,
        queue: EventQueue,
        net: SimNetwork,
        rng: random.Random,
        *,
        observe: Callable[[Master, list[Send]], None],
    ) -> None:
        self.base = base
        self.config = config
        self.queue = queue
        self.net = net
        self.rng = rng
        self._observe = observe
        self.names = tuple(f"m{i}" for i in range(config.size))
        self.raft_config = RaftConfig(
            node_id=self.names[0],
            members=self.names,
            heartbeat_interval=config.heartbeat_interval,
            election_timeout=config.election_timeout,
        )
        self.members = {name: Member(name) for name in self.names}
        self.clients: dict[str, Client] = {}
        self.activations = 0
        self.step_downs = 0
        self.crashes = 0
        self.client_switches = 0
        self.dropped_no_leader = 0
        net.attach(MASTER, self._from_client)
        net.gate = self._gate
        for name in self.names:
            net.attach(name, lambda sender, msg, _epoch, name=name: self._from_peer(name, msg))

    @property
    def now(self) -> float:
        return self.queue.clock.now

    # --- clients -----------------------------------------------------------------------------
    def add_client(
        self, name: str, connected: Callable[[], None], disconnected: Callable[[], None]
    ) -> None:
        self.clients[name] = Client(connected, disconnected)
        offset = self.rng.uniform(0.0, self.config.probe_interval)
        self.queue.later(offset, lambda: self._probe(name), f"{name} probe")

    def _probe(self, name: str) -> None:
        client = self.clients[name]
        self._follow(name, client)
        self.queue.later(self.config.probe_interval, lambda: self._probe(name), f"{name} probe")

    def _follow(self, name: str, client: Client) -> None:
        if name in self.net.cut:
            return  # cut off: it hears no one, and keeps what it had
        best = self.acting_member(reachable_from=name)
        best_epoch = best.core.epoch if best is not None and best.core is not None else 0
        current = self.members.get(client.following) if client.following else None
        if (
            current is not None
            and current.raft is not None
            and current.core is not None
            and current.core.epoch == client.epoch
            and best_epoch <= client.epoch
        ):
            return  # still the leader of its term (its lease may lapse and come back)
        if client.following is not None:
            client.following = None
            client.disconnected()
        if best is not None and best_epoch >= client.epoch:
            client.following, client.epoch = best.name, best_epoch
            self.client_switches += 1
            client.connected()

    def _gate(self, src: str, dst: str) -> bool:
        """A client reads frames of the master it follows only (MasterLink's ``recv``)."""
        client = self.clients.get(dst)
        return client is None or src not in self.members or client.following == src

    def _from_client(self, sender: str, message: Message, epoch: int) -> None:
        assert epoch == 0, f"{message.NAME} from {sender} claims a master epoch ({epoch})"
        client = self.clients.get(sender)
        member = self.members.get(client.following) if client and client.following else None
        if member is None or member.name in self.net.cut or not self._acting(member):
            self.dropped_no_leader += 1  # a deposed master answers nothing its link keeps
            return
        assert member.core is not None
        self._perform(member, member.core.handle(sender, message, self.now))

    def disconnected(self, peer: str) -> None:
        """The transport saw a client's connection drop (the acting core is told)."""
        client = self.clients.get(peer)
        member = self.members.get(client.following) if client and client.following else None
        if member is not None and member.core is not None:
            self._perform(member, member.core.disconnected(peer, self.now))

    # --- the acting core ---------------------------------------------------------------------
    def _acting(self, member: Member) -> bool:
        return (
            member.core is not None
            and member.raft is not None
            and member.raft.lease_valid(self.now)
        )

    def acting_member(self, reachable_from: str | None = None) -> Member | None:
        """The member that acts now with the highest epoch (reachable from a client, if named)."""
        best: Member | None = None
        for member in self.members.values():
            if not self._acting(member):
                continue
            if reachable_from is not None and member.name in self.net.cut:
                continue
            assert member.core is not None
            if best is None or member.core.epoch > (best.core.epoch if best.core else 0):
                best = member
        return best

    def acting_core(self) -> Master | None:
        member = self.acting_member()
        return member.core if member is not None else None

    def _perform(self, member: Member, actions: list[Send | Propose]) -> None:
        core = member.core
        if core is None:
            return
        self._observe(core, [a for a in actions if isinstance(a, Send)])
        for action in actions:
            if isinstance(action, Send):
                self.net.send(member.name, action.to, action.message, action.epoch)
            elif isinstance(action, Propose):
                self._propose(member, core, action)

    def _propose(self, member: Member, core: Master, action: Propose) -> None:
        assert member.raft is not None
        index, ready = member.raft.propose(encode_operation(action.op), self.now)
        if index is None:
            self._perform(member, core.abandoned(action.seq, self.now))
            return
        member.pending[index] = action.seq
        self._ready(member, ready)

        def give_up() -> None:
            if member.core is core and member.pending.pop(index, None) is not None:
                self._perform(member, core.abandoned(action.seq, self.now))

        self.queue.later(self.config.propose_timeout, give_up, f"{member.name} propose timeout")

    def _core_tick(self, member: Member, core: Master) -> None:
        if member.core is not core:
            return
        if self._acting(member):
            self._perform(member, core.tick(self.now))
        self.queue.later(self.base.allocation_interval / 2, lambda: self._core_tick(member, core))

    # --- election ------------------------------------------------------------------------------
    def start(self) -> None:
        for name in self.names:
            self.restart(name)

    def crash(self, name: str) -> None:
        member = self.members[name]
        if member.raft is None:
            return
        self.crashes += 1
        member.raft = None
        member.core = None
        member.pending.clear()
        member.incarnation += 1

    def restart(self, name: str) -> None:
        member = self.members[name]
        if member.raft is not None:
            return
        member.incarnation += 1
        member.registry = Registry()  # rebuilt as the log's committed entries apply again
        member.raft = RaftNode(
            replace(self.raft_config, node_id=name),
            hard_state=member.hard_state,
            snapshot=None,
            entries=list(member.log),
            now=self.now,
            rng=random.Random(self.rng.random()),
        )
        incarnation = member.incarnation
        start = self.rng.uniform(0.0, self.config.raft_tick)
        self.queue.later(start, lambda: self._raft_tick(member, incarnation), f"{name} raft")

    def _raft_tick(self, member: Member, incarnation: int) -> None:
        if member.raft is None or member.incarnation != incarnation:
            return
        self._ready(member, member.raft.tick(self.now))
        self.queue.later(
            self.config.raft_tick, lambda: self._raft_tick(member, incarnation), "raft tick"
        )

    def _from_peer(self, name: str, message: Message) -> None:
        member = self.members[name]
        if member.raft is not None:
            self._ready(member, member.raft.step(message, self.now))

    def _ready(self, member: Member, ready: Ready) -> None:
        """Carry out a Ready in order: durable state, then messages, then the applied entries."""
        if ready.hard_state is not None:
            member.hard_state = ready.hard_state
        if ready.truncate_after is not None:
            member.log = [e for e in member.log if e.index <= ready.truncate_after]
        member.log.extend(ready.append)
        for to, message in ready.messages:
            self.net.send(member.name, to, message)
        for entry in ready.committed:
            self._apply(member, entry)
        raft = member.raft
        if member.core is not None and (raft is None or raft.role is not Role.LEADER):
            self.step_downs += 1
            member.core = None
            member.pending.clear()

    def _apply(self, member: Member, entry: LogEntry) -> None:
        member.registry.applied_index = entry.index
        if entry.data:
            member.registry.apply(decode_operation(entry.data))
            seq = member.pending.pop(entry.index, None)
            if seq is not None and member.core is not None:
                self._perform(member, member.core.committed(seq, self.now))
            return
        raft = member.raft
        if (
            raft is not None
            and raft.role is Role.LEADER
            and entry.term == raft.term
            and member.core is None
        ):
            config = replace(self.base, epoch=entry.term, replicated=True, address=member.name)
            member.core = Master(config, registry=member.registry, now=self.now)
            member.pending.clear()
            self.activations += 1
            core = member.core
            self.queue.later(0.0, lambda: self._core_tick(member, core), f"{member.name} core")
