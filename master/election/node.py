"""The asyncio shell around the sans-IO Raft core: disk, peer links, timers, the state machine.

One worker task owns the :class:`RaftNode`. Each turn it takes every peer message and proposal
that arrived since the last turn (and a tick when one is due), steps them into the core (the
proposals as one batch, so followers get them in a few AppendEntries), and carries out the
Readies in the order :mod:`agora.master.election.types` prescribes: everything durable of the
whole batch is written and covered by one fsync (in a thread, so the event loop keeps serving)
before any of the batch's messages leaves, and committed entries are applied last.

Requests (votes, appends, snapshots) leave through one DEALER per other member with a small
queue: a message that does not fit, or whose peer is down, is dropped; Raft sends it again. They
arrive through :meth:`ElectionNode.receive`, called by the master's ROUTER loop, together with a
way back over the connection they came in on: the answer takes it. So a leader reads its
followers' answers off its own DEALERs, in its own ZeroMQ context, and never off the ROUTER it
shares with thousands of agents and frameworks: a registration storm queued there must not delay
the acknowledgements that keep its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import structlog
import zmq.asyncio
from agora.master.election.raft import RaftNode
from agora.master.election.storage import RaftStorage
from agora.master.election.types import RaftConfig, Ready, Role, Snapshot
from agora.sdk.errors import ProtocolError
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
from agora.sdk.transport import Received, TransportClosed, ZmqClient
from msgspec.structs import replace

if TYPE_CHECKING:
    from agora.sdk.transport import CurveClient

__all__ = ["ElectionNode", "ElectionStatus", "MemberStatus", "NotLeader", "Reply"]

log = structlog.get_logger(__name__)

#: Messages queued per peer link before new ones are dropped.
PEER_HWM: Final = 64
#: Peer messages waiting for the worker beyond which new ones are dropped.
MAX_INBOX: Final = 10_000
_PEER_MESSAGES: Final = (
    VoteRequest,
    VoteReply,
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    SnapshotReply,
)
#: Requests: answered over the connection they came in on.
_REQUESTS: Final = (AppendEntries, VoteRequest, InstallSnapshot)
#: Answers: sent back the way their request came, when it is known.
_ANSWERS: Final = (AppendReply, VoteReply, SnapshotReply)
_STOP_GRACE: Final = 5.0

#: A way back to the member that sent a request: queue a message on that connection, without
#: waiting; False when it cannot (the connection is gone, or backed up).
Reply = Callable[[Message, int], bool]


class NotLeader(Exception):
    """This master does not lead (any more): ask ``leader`` (None: unknown) instead."""

    def __init__(self, leader: str | None, term: int) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'}, term {term})")
        self.leader = leader
        self.term = term


@dataclass(frozen=True, slots=True)
class MemberStatus:
    member: str
    #: Heard from within the election timeout T (always True for this master itself).
    reachable: bool
    #: Seconds since a message from it arrived; None: never since start.
    since_heard: float | None


@dataclass(frozen=True, slots=True)
class ElectionStatus:
    role: Role
    term: int
    leader: str | None
    commit_index: int
    members: tuple[MemberStatus, ...]


@dataclass(slots=True)
class _Proposal:
    data: bytes
    future: asyncio.Future[int]


class PeerLink(Protocol):
    """What a node needs of its link to another member: a send that never waits, and the answers
    that member sends back over it."""

    def try_send(self, message: Message, epoch: int = 0) -> bool: ...

    async def recv(self) -> Received: ...

    def close(self) -> None: ...


class ElectionNode:
    """One master's member of the Raft group. Create, then ``await start()``; ``await stop()``."""

    def __init__(
        self,
        config: RaftConfig,
        storage: RaftStorage,
        *,
        apply: Callable[[LogEntry], None],
        restore: Callable[[bytes], None],
        take_snapshot: Callable[[], bytes],
        on_role: Callable[[Role, int, str | None], None] | None = None,
        source_host: str | None = None,
        curve: CurveClient | None = None,
        snapshot_every: int = 1000,
        tick_interval: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        peer_link: Callable[[str], PeerLink] | None = None,
    ) -> None:
        """``peer_link``: how to reach another member instead of ZeroMQ, given its id (the
        in-process transport's ``hub.client(member)``, for a group in one process)."""
        if config.node_id not in config.members:
            raise ValueError(f"node_id {config.node_id!r} is not one of members {config.members}")
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be at least 1")
        self.config = config
        self._storage = storage
        self._apply_cb = apply
        self._restore_cb = restore
        self._take_snapshot = take_snapshot
        self._on_role = on_role
        self._source_host = source_host
        self._curve = curve
        self._snapshot_every = snapshot_every
        self._tick_interval = tick_interval
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._others = tuple(m for m in config.members if m != config.node_id)
        self._core: RaftNode | None = None
        self._context: zmq.asyncio.Context | None = None
        self._peer_link = peer_link
        self._peers: dict[str, PeerLink] = {}
        #: Per other member, the way back over the connection its latest request came in on.
        self._replies: dict[str, Reply] = {}
        self._listeners: list[asyncio.Task[None]] = []
        self._inbox: list[Message | _Proposal] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = False
        self._pending: dict[int, tuple[int, asyncio.Future[int]]] = {}
        self._heard: dict[str, float] = {}
        self._applied = 0
        self._applied_term = 0
        self._since_snapshot = 0
        self._seen: tuple[Role, int, str | None] = (Role.FOLLOWER, 0, None)
        self._next_tick = 0.0
        self._dropped = 0
        #: Why the node halted (a disk or state-machine failure), None while it runs.
        self.error: BaseException | None = None
        #: This master's operator HTTP API, sent to followers with every append ("": none).
        self.http_url = ""
        #: Each other master's HTTP API, as it said in its latest append ("": none).
        self._http_of: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the disk state, restore the snapshot, connect the peers and start the worker."""
        if self._core is not None:
            raise RuntimeError("ElectionNode already started")
        hard_state, snapshot, entries = await asyncio.to_thread(self._storage.load)
        if snapshot is not None:
            self._restore_cb(snapshot.data)
            self._applied, self._applied_term = snapshot.index, snapshot.term
        self._core = RaftNode(
            self.config,
            hard_state=hard_state,
            snapshot=snapshot,
            entries=entries,
            now=self._clock(),
            rng=self._rng,
        )
        self._seen = (self._core.role, self._core.term, self._core.leader_id)
        if self._peer_link is not None:
            for member in self._others:
                self._peers[member] = self._peer_link(member)
        else:
            self._context = zmq.asyncio.Context()
            for member in self._others:
                self._peers[member] = ZmqClient.connect(
                    self._peer_endpoint(member),
                    curve=self._curve,
                    context=self._context,
                    hwm=PEER_HWM,
                    immediate=True,  # Raft resends: a member back up needs no stale backlog
                )
        self._listeners = [
            asyncio.create_task(self._listen(member, link), name=f"election answers of {member}")
            for member, link in self._peers.items()
        ]
        self._next_tick = asyncio.get_running_loop().time()
        self._worker = asyncio.create_task(self._run(), name=f"election {self.config.node_id}")
        log.info(
            "election_node_started",
            node=self.config.node_id,
            term=hard_state.term,
            snapshot_index=self._applied,
            log_entries=len(entries),
        )

    async def stop(self) -> None:
        """Finish the current turn, fail pending proposals, close the peer links and the disk."""
        self._stopping = True
        self._wake.set()
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), _STOP_GRACE)
            except TimeoutError:
                self._worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._worker
            self._worker = None
        self._fail_pending(lambda _term: True)
        for listener in self._listeners:
            listener.cancel()
        for listener in self._listeners:
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        self._listeners = []
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        self._replies.clear()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None
        if self._core is not None:
            await asyncio.to_thread(self._storage.close)

    def _peer_endpoint(self, member: str) -> str:
        if self._source_host is None:
            return member
        if not member.startswith("tcp://"):
            raise ValueError(f"source_host needs tcp:// member endpoints, got {member!r}")
        source = self._source_host
        if ":" in source and not source.startswith("["):
            source = f"[{source}]"  # an IPv6 literal
        return f"tcp://{source}:0;{member.removeprefix('tcp://')}"  # libzmq: tcp://SRC;DST

    # -- the public face -------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return Role.FOLLOWER if self._core is None else self._core.role

    @property
    def term(self) -> int:
        return 0 if self._core is None else self._core.term

    @property
    def leader_id(self) -> str | None:
        return None if self._core is None else self._core.leader_id

    @property
    def commit_index(self) -> int:
        return 0 if self._core is None else self._core.commit_index

    @property
    def last_applied(self) -> int:
        return self._applied

    def lease_valid(self) -> bool:
        """May this master act as leader now (send offers, launches, kills)?"""
        core = self._core
        return core is not None and not self._halted() and core.lease_valid(self._clock())

    def lease_until(self) -> float | None:
        """When this leader's lease ends (on the node's clock), or None without one."""
        core = self._core
        return None if core is None or self._halted() else core.lease_until()

    def status(self) -> ElectionStatus:
        now = self._clock()
        timeout = self.config.election_timeout
        members = []
        for member in self.config.members:
            if member == self.config.node_id:
                members.append(MemberStatus(member, True, 0.0))
                continue
            heard = self._heard.get(member)
            since = None if heard is None else max(0.0, now - heard)
            members.append(MemberStatus(member, since is not None and since < timeout, since))
        return ElectionStatus(
            self.role, self.term, self.leader_id, self.commit_index, tuple(members)
        )

    def receive(self, message: Message, reply: Reply | None = None) -> None:
        """A peer message the master's ROUTER received; anything else is ignored. ``reply``: the
        way back over the connection it came in on, which the answer to a request takes."""
        if self._core is None or self._halted() or not isinstance(message, _PEER_MESSAGES):
            return
        if message.sender not in self._others:
            return
        if reply is not None and isinstance(message, _REQUESTS):
            self._replies[message.sender] = reply
        self._heard[message.sender] = self._clock()
        if isinstance(message, AppendEntries):
            self._http_of[message.sender] = message.leader_http
        if len(self._inbox) >= MAX_INBOX:
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.warning("election_inbox_full", dropped=self._dropped)
            return
        self._inbox.append(message)
        self._wake.set()

    async def propose(self, data: bytes, *, timeout: float) -> int:
        """Append ``data`` to the replicated log; the index once committed and applied here.

        Raises :class:`NotLeader` at once when this master does not lead, or when it loses the
        lead before the entry commits (the entry may still commit later under the new leader);
        ``TimeoutError`` when not applied within ``timeout`` seconds (likewise maybe later)."""
        core = self._core
        if core is None or self._halted() or core.role is not Role.LEADER:
            raise NotLeader(self.leader_id, self.term)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._inbox.append(_Proposal(data, future))
        self._wake.set()
        # A timer rather than asyncio.wait_for, which costs a task per proposal: a burst of
        # registrations makes thousands at once.
        timer = loop.call_later(timeout, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _halted(self) -> bool:
        return self._stopping or self.error is not None

    # -- the worker ------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                if not self._inbox:
                    delay = max(0.0, self._next_tick - loop.time())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                self._wake.clear()
                if self._stopping:
                    break
                await self._turn(loop.time())
        except Exception as exc:  # a disk or state-machine failure: going on could break Raft
            self.error = exc
            log.exception("election_halted", node=self.config.node_id)
            self._fail_pending(lambda _term: True)

    async def _turn(self, loop_now: float) -> None:
        core = self._core
        assert core is not None
        now = self._clock()
        readies: list[Ready] = []
        inbox, self._inbox = self._inbox, []
        proposals: list[_Proposal] = []
        for item in inbox:
            if isinstance(item, _Proposal):
                if not item.future.done():  # else timed out or cancelled while queued
                    proposals.append(item)
            else:
                readies.append(core.step(item, now))
        if proposals:
            # One append for the whole turn's proposals: the followers get them in a few
            # AppendEntries, not one message each.
            indexes, ready = core.propose_many([p.data for p in proposals], now)
            if indexes is None:
                for proposal in proposals:
                    proposal.future.set_exception(NotLeader(core.leader_id, core.term))
            else:
                for index, proposal in zip(indexes, proposals, strict=True):
                    self._pending[index] = (core.term, proposal.future)
            readies.append(ready)
        if loop_now >= self._next_tick:
            readies.append(core.tick(now))
            self._next_tick = loop_now + self._tick_interval
        await self._carry_out(readies)
        if self._since_snapshot >= self._snapshot_every:
            await self._compact()
        self._notice_role()

    async def _carry_out(self, readies: list[Ready]) -> None:
        readies = [r for r in readies if not r.empty()]
        durable = [r for r in readies if _has_durable(r)]
        if durable:
            await asyncio.to_thread(self._persist, durable)
        for ready in readies:
            for member, message in ready.messages:
                self._send(member, message)
        for ready in readies:
            snapshot = ready.snapshot
            if snapshot is not None and snapshot.index > self._applied:
                self._restore(snapshot)
            for entry in ready.committed:
                self._apply(entry)

    def _persist(self, readies: list[Ready]) -> None:
        for ready in readies:
            self._storage.persist(ready, sync=False)
        self._storage.sync()

    def leader_http(self) -> str | None:
        """The leader's operator HTTP API as it advertised it (None: not known, or none)."""
        leader = self.leader_id
        if leader is None:
            return None
        if leader == self.config.node_id:
            return self.http_url or None
        return self._http_of.get(leader) or None

    def _send(self, member: str, message: Message) -> None:
        peer = self._peers.get(member)
        if peer is None:
            return
        if self.http_url and isinstance(message, AppendEntries):
            message = replace(message, leader_http=self.http_url)
        try:
            if isinstance(message, _ANSWERS) and self._answer(member, message):
                return
            if not peer.try_send(message, epoch=self.term):
                log.debug("election_message_dropped", peer=member, message=message.NAME)
        except (ProtocolError, TransportClosed) as exc:
            log.warning("election_send_failed", peer=member, message=message.NAME, error=str(exc))

    def _answer(self, member: str, message: Message) -> bool:
        """Send an answer back the way ``member``'s request came; False when that way is not
        known or not open (the answer then takes this node's own link to ``member``)."""
        reply = self._replies.get(member)
        if reply is None:
            return False
        try:
            if reply(message, self.term):
                return True
        except TransportClosed:
            pass
        del self._replies[member]  # gone: the next request brings a new way back
        return False

    async def _listen(self, member: str, link: PeerLink) -> None:
        """Hand the node what ``member`` sends back over this node's own link to it: the answers
        to this node's requests. Only that member's answers count on its link."""
        while True:
            try:
                received = await link.recv()
            except TransportClosed:
                return
            message = received.message
            if isinstance(message, _ANSWERS) and message.sender == member:
                self.receive(message)

    def _restore(self, snapshot: Snapshot) -> None:
        self._restore_cb(snapshot.data)
        log.info("election_snapshot_restored", index=snapshot.index, term=snapshot.term)
        self._applied, self._applied_term = snapshot.index, snapshot.term
        self._since_snapshot = 0
        self._fail_pending(lambda _term: True)

    def _apply(self, entry: LogEntry) -> None:
        if entry.index <= self._applied:
            return
        if entry.index != self._applied + 1:
            raise RuntimeError(f"committed entry {entry.index} after applied {self._applied}")
        self._apply_cb(entry)
        self._applied, self._applied_term = entry.index, entry.term
        self._since_snapshot += 1
        pending = self._pending.pop(entry.index, None)
        if pending is None:
            return
        term, future = pending
        if future.done():
            return
        if entry.term == term:
            future.set_result(entry.index)
        else:  # another leader's entry took the index
            future.set_exception(NotLeader(self.leader_id, self.term))

    async def _compact(self) -> None:
        core = self._core
        assert core is not None
        snapshot = Snapshot(
            index=self._applied, term=self._applied_term, data=self._take_snapshot()
        )
        self._since_snapshot = 0
        await self._carry_out([core.compact(snapshot)])
        log.debug("election_compacted", index=snapshot.index, bytes=len(snapshot.data))

    def _notice_role(self) -> None:
        core = self._core
        assert core is not None
        seen = (core.role, core.term, core.leader_id)
        if core.role is not Role.LEADER:
            self._fail_pending(lambda _term: True)
        else:
            self._fail_pending(lambda term: term != core.term)
        if seen == self._seen:
            return
        old_role, old_term, old_leader = self._seen
        role, term, leader = seen
        self._seen = seen
        if role is Role.CANDIDATE and (old_role is not Role.CANDIDATE or term != old_term):
            log.info("election_started", node=self.config.node_id, term=term)
        if leader is not None and (leader, term) != (old_leader, old_term):
            log.info("leader_elected", node=self.config.node_id, term=term, leader=leader)
        if old_role is Role.LEADER and role is not Role.LEADER:
            log.info("stepped_down", node=self.config.node_id, term=term)
        if self._on_role is not None:
            try:
                self._on_role(role, term, leader)
            except Exception:
                log.exception("election_on_role_failed", node=self.config.node_id)

    def _fail_pending(self, which: Callable[[int], bool]) -> None:
        for index, (term, future) in list(self._pending.items()):
            if which(term):
                del self._pending[index]
                if not future.done():
                    future.set_exception(NotLeader(self.leader_id, self.term))


def _time_out(future: asyncio.Future[int]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _has_durable(ready: Ready) -> bool:
    return (
        ready.hard_state is not None
        or ready.snapshot is not None
        or ready.truncate_after is not None
        or bool(ready.append)
    )
