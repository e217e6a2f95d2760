"""The master's I/O shell: the ROUTER socket and the timers on one side, ``Master`` on the other.

One task receives: it takes the frames already queued (``recv_nowait``, decoded by the transport),
hands election messages to the election worker at once and queues the rest in a backlog; then,
for a few milliseconds, it takes messages off the backlog, checks the ACL, calls
``Master.handle`` and sends the resulting actions at once, and yields. A second task ticks the
core every ``tick_interval`` seconds and reports peers silent for ``peer_timeout`` as
disconnected. Both go through one lock around "call the core, send its actions", so messages
leave in the order the core produced them.

The core is given wall-clock time (``time.time()``): it stamps task statuses with ``now`` and all
of its timers are relative. Peer liveness uses the monotonic clock.

Its parts: :mod:`~agora.master.server.inbox` (the backlog and held messages),
:mod:`~agora.master.server.gate` (the ACL and election-traffic checks),
:mod:`~agora.master.server.outbox` (sending the core's actions),
:mod:`~agora.master.server.peers` (liveness) and :mod:`~agora.master.server.local_calls` (the
operator HTTP API's in-process calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any, Final

import structlog
import zmq
from agora.master.core import Master, Send
from agora.master.core.actions import Propose
from agora.master.server.admission import RegistrationGate
from agora.master.server.commits import Commits, Decided
from agora.master.server.event_log import log_call
from agora.master.server.gate import Gate, error_to
from agora.master.server.inbox import Inbox
from agora.master.server.leadership import Leadership
from agora.master.server.local_calls import LOCAL_PEER, LocalCalls, NotActing
from agora.master.server.outbox import Outbox
from agora.master.server.peers import PeerTable
from agora.master.server.stats import BAD_FRAME_TOP_PEERS, DaemonStats
from agora.master.server.streams import STREAM_PEER, Streams
from agora.sdk.daemon.history import History
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import new_kill_id
from agora.sdk.messages import (
    AppendEntries,
    AppendReply,
    DetectLeader,
    ErrorCode,
    Heartbeat,
    InstallSnapshot,
    Kill,
    LeaderInfo,
    MasterMember,
    Message,
    RegisterAgent,
    ReregisterAgent,
    RetryRegistration,
    SnapshotReply,
    VoteReply,
    VoteRequest,
)
from agora.sdk.messages.batching import RETRY_REGISTRATION
from agora.sdk.transport import Acl, Received, Server
from msgspec.structs import replace

__all__ = ["LOCAL_PEER", "MasterDaemon", "NotActing"]

log = structlog.get_logger(__name__)

#: Frames handled per receive turn before yielding to the ticker.
MAX_BATCH: Final = 1024
#: Seconds one receive turn may spend taking frames off the socket, and again handling client
#: messages, before it yields: the election worker (which must answer and count its peers well
#: within the election timeout) and the ticker get the loop at least this often, however long a
#: burst of client messages is.
MAX_BATCH_SECONDS: Final = 0.005
#: Seconds the updates and acknowledgements an HTTP scheduler's calls make are held before they
#: leave, merged with those of the calls that follow (a Mesos framework acknowledges every
#: update with a call of its own). Launches and kills are not held.
STREAM_HOLD_SECONDS: Final = 0.01
_ELECTION: Final = (
    VoteRequest,
    VoteReply,
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    SnapshotReply,
)
_REGISTRATIONS: Final = (RegisterAgent, ReregisterAgent)


class MasterDaemon:
    """Moves messages between a :class:`Server` and a :class:`Master` until :meth:`stop`."""

    def __init__(
        self,
        core: Master | None,
        server: Server,
        *,
        tick_interval: float,
        peer_timeout: float,
        acl: Acl | None = None,
        authenticated: bool = False,
        electors: Collection[str] | None = None,
        clock: Callable[[], float] = time.time,
        debug: bool = False,
        stats: DaemonStats | None = None,
        leadership: Leadership | None = None,
        history: History | None = None,
        registrations: RegistrationGate | None = None,
    ) -> None:
        """``authenticated``: CURVE is on, so every frame carries the sender's principal.
        ``electors``: the principals whose election traffic counts then (None: the ACL's
        ``masters``). ``registrations``: the backpressure on agent registrations (by default
        :class:`RegistrationGate`'s bounds).

        With ``leadership`` the core is the one of the term this master leads (None while it
        stands by) and follows :meth:`leadership_changed`; without, ``core`` is fixed."""
        self._core = core
        self._leadership = leadership
        self._background: set[asyncio.Task[None]] = set()
        self._server = server
        self._tick_interval = tick_interval
        self._peer_timeout = peer_timeout
        self._gate = Gate(acl, authenticated=authenticated, electors=electors)
        self._clock = clock
        self._debug = debug
        #: Plain counters for the operator API's metrics, read at scrape time.
        self.stats = stats if stats is not None else DaemonStats()
        #: Client messages not handled yet: the backlog, and those held while it may not act.
        self._inbox = Inbox(self.stats)
        #: Agent registrations in the backlog: one per connection, put off beyond a bound.
        self._registrations = registrations if registrations is not None else RegistrationGate()
        self.stats.queue_size = lambda: len(self._inbox)
        #: Bad-frame warnings per peer: a few a second, the rest counted and summarised.
        self._bad_frame_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)
        self.stats.bad_frames_by_peer = lambda: self._bad_frame_log.counts(BAD_FRAME_TOP_PEERS)
        self._lock = asyncio.Lock()
        #: Registry changes the election group decided, taking effect a few ms at a time.
        self._commits = Commits(
            current=lambda: self._core,
            acting=self._acting_core,
            take_effect=self._take_effect,
            burst_done=self._end_burst,
            budget=MAX_BATCH_SECONDS,
        )
        self._stopped = asyncio.Event()
        #: Who was heard from when (monotonic), and which peers are other masters.
        self._peers = PeerTable()
        self._local = LocalCalls(
            acting=lambda: self._acting_core() is not None and not self._inbox.held,
            handle=self._handle,
            spawn=self._spawn,
        )
        #: Schedulers subscribed over HTTP (the Mesos scheduler API), one event stream each.
        self.streams = Streams()
        #: A release of what stream calls held is due (see STREAM_HOLD_SECONDS).
        self._stream_release_due = False
        self._outbox = Outbox(
            server,
            core=lambda: self._core,
            leadership=lambda: self._leadership,
            propose=self._start_proposal,
            answer_local=self._local.answer,
            deliver_stream=self.streams.deliver,
            stats=self.stats,
            history=history if history is not None else History(None, "master"),
            debug=debug,
        )

    def attach(self, leadership: Leadership) -> None:
        """Follow ``leadership``: the core becomes the one of the term this master leads."""
        self._leadership = leadership
        self._core = leadership.core

    def leader_json(self) -> dict[str, Any]:
        """Where the leader is, for the operator API."""
        if self._leadership is None:
            return {}
        info = self._leadership.leader_info()
        return {
            "leader": info.leader,
            # (None while this master has won but not yet activated: it is not serving yet)
            "leader_http": None if info.leader is None else self._leadership.node.leader_http(),
            "epoch": info.epoch,
            "masters": list(info.masters),
        }

    def members(self) -> tuple[MasterMember, ...]:
        """The election group as this master sees it (empty without one)."""
        return () if self._leadership is None else self._leadership.members()

    async def call(self, message: Message, principal: str | None, timeout: float) -> Message:
        """Make a call in-process, as if ``principal`` had sent ``message`` over the socket: the
        same ACL, the same core, in order with everything else. Returns the core's first answer
        (OPERATOR_DONE, STATE or ERROR). NotActing when this master cannot act now; TimeoutError
        when no answer came in ``timeout`` (a registry change may still take effect)."""
        return await self._local.call(message, principal, timeout)

    async def submit(
        self, peer: str, message: Message, principal: str | None, timeout: float
    ) -> None:
        """Hand the core ``message`` from ``peer``, an HTTP scheduler's stream (see
        :mod:`~agora.master.server.streams`), as if sent over the socket; returns once taken.
        NotActing when this master cannot act now; TimeoutError past ``timeout``."""
        await self._local.submit(peer, message, principal, timeout)

    @property
    def core(self) -> Master | None:
        """The core while this master leads (see :meth:`Leadership.leading`): None on a standby,
        before its term is active, and while its lease has lapsed. Whatever reports leadership
        (the HTTP API, its metrics) reads this, so it never claims more than it may act on."""
        return self._acting_core()

    def leadership_changed(self) -> None:
        """The leadership made a new core (activation) or dropped ours (lost the lead)."""
        assert self._leadership is not None
        new = self._leadership.core
        if new is self._core:
            return
        self._core = new
        # Streams were opened with the old term's core: their schedulers subscribe again (to
        # this master if it now leads, else redirected to the leader).
        self.streams.end_all("this master's leadership changed")
        self.streams.take_ended()  # peers of the old term's core, which the new one never knew
        if new is None:
            self._inbox.held.clear()  # what a lost term held is not ours to act on
        elif self._inbox.held:
            self._spawn(self._release_held(), "master-release-held")
        self._spawn(self._announce(), "master-announce")
        self._commits.poke()

    async def _announce(self) -> None:
        """Tell every client we know where the leader is now (a push, so they need not poll)."""
        assert self._leadership is not None
        core = self._core
        # A new leader's lease normally holds as its term becomes active (the round that commits
        # its no-op renews it); should it not yet, it announces itself once it does.
        while core is not None and core is self._core and self._acting_core() is None:
            await asyncio.sleep(self._tick_interval)
        if core is not self._core:
            return  # a newer change announces itself
        info = self._leadership.leader_info()
        epoch = self._leadership.node.term
        log.info("leader_announced", leader=info.leader, epoch=epoch)
        give_way = time.perf_counter() + MAX_BATCH_SECONDS
        for peer in self._peers.clients():
            with contextlib.suppress(ProtocolError, zmq.ZMQError):
                await self._server.send(peer, info, epoch)
            if time.perf_counter() >= give_way:  # thousands of clients: let the election run
                await asyncio.sleep(0)
                give_way = time.perf_counter() + MAX_BATCH_SECONDS

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` until done or until :meth:`run` returns."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from a signal handler)."""
        self._stopped.set()

    async def run(self) -> int:
        """Serve until :meth:`stop`; 0 on a requested stop, 1 if a loop died."""
        workers: list[asyncio.Task[None]] = [
            asyncio.create_task(self._receive_loop(), name="master-receive"),
            asyncio.create_task(self._tick_loop(), name="master-tick"),
            asyncio.create_task(self._commits.run(), name="master-commits"),
        ]
        stopper = asyncio.create_task(self._stopped.wait(), name="master-stop")
        everything: list[asyncio.Task[Any]] = [*workers, stopper]
        rc = 0
        try:
            done, _ = await asyncio.wait(everything, return_when=asyncio.FIRST_COMPLETED)
            for task in workers:
                if task in done:
                    exc = task.exception()
                    log.error("master_loop_died", loop=task.get_name(), exc_info=exc)
                    rc = 1
        finally:
            for task in [*everything, *self._background]:
                task.cancel()
            await asyncio.gather(*everything, *self._background, return_exceptions=True)
        return rc

    # ------------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        """Take frames off the socket and handle them, a few milliseconds of each at a time.

        The socket queues the frames of every peer together, so a master's Raft message sits
        behind whatever clients sent before it: thousands of (re-)registrations take seconds to
        handle, longer than the election timeout. Taking a frame off is far cheaper than
        handling it, so each turn first drains the socket, passing election messages to the
        election worker at once and keeping client messages (in order) in a backlog, then
        handles the backlog for a while and yields."""
        server = self._server
        inbox = self._inbox
        backlog = inbox.backlog
        clock = time.perf_counter
        while True:
            if not backlog:
                self._take(await server.recv())
            started = clock()
            give_way = started + MAX_BATCH_SECONDS
            while not inbox.full() and clock() < give_way:
                received = server.recv_nowait()
                if received is None:
                    break
                self._take(received)
            give_way = clock() + MAX_BATCH_SECONDS
            handled = 0
            self._outbox.in_burst = True
            try:
                while backlog and handled < MAX_BATCH and clock() < give_way:
                    await self._dispatch(backlog.popleft())
                    handled += 1
            finally:
                self._outbox.in_burst = False
            # One event-triggered allocation for the whole burst, not one per message.
            await self._end_burst(release=True)
            if backlog or clock() - started >= MAX_BATCH_SECONDS:
                await asyncio.sleep(0)  # let the election worker and the ticker run

    def _take(self, received: Received) -> None:
        """A frame off the socket: an election message goes to the worker now, anything else
        waits in the backlog."""
        message = received.message
        if received.relay is not None:
            refusal = self._gate.refuse_relayed(received, time.monotonic(), self._epoch())
            if refusal is not None:  # answered ERROR FORBIDDEN, and no further
                self.stats.messages_received += 1
                self._server.try_send(refusal.to, refusal.message, refusal.epoch)
                return
        if message is not None and isinstance(message, _ELECTION):
            self._note_peer(received.peer)
            self.stats.messages_received += 1
            self._election(received.peer, message, received.principal)
            return
        if isinstance(message, _REGISTRATIONS) and self._acting_core() is not None:
            delay = self._registrations.arrive(
                received.peer,
                time.perf_counter(),
                may_put_off=RETRY_REGISTRATION in message.features,
            )
            if delay is not None:
                self.stats.messages_received += 1
                if delay:  # more wait than it answers promptly: the agent comes back later
                    self.stats.registrations_put_off += 1
                    answer = RetryRegistration(retry_after=round(delay, 3))
                    self._server.try_send(received.peer, answer, self._epoch())
                else:  # a copy of the one it queued, re-sent by the agent's backoff
                    self.stats.registrations_coalesced += 1
                return
        self._inbox.queue(received)

    def _note_peer(self, peer: str) -> None:
        self._peers.heard(peer, time.monotonic())

    async def _dispatch(self, received: Received) -> None:
        peer = received.peer
        self._note_peer(peer)
        message = received.message
        if message is None:
            self.stats.bad_frames_received += 1
            await self._bad_frame(peer, received.error)
            return
        self.stats.messages_received += 1
        if type(message) is Heartbeat:
            return  # liveness only
        if isinstance(message, _REGISTRATIONS):
            self._registrations.handled(peer, time.perf_counter())
        if isinstance(message, _ELECTION):
            self._election(peer, message, received.principal)
            return
        if type(message) is DetectLeader:
            await self._answer_leader(peer)
            return
        if self._core is None:
            if self._leadership is not None and self._leadership.about_to_lead():
                self._inbox.hold(received)  # served once active (a no-op commit away)
            else:
                await self._answer_leader(peer)  # a standby serves no client call
            return
        if self._inbox.held or self._acting_core() is None:
            # The lease lapsed (act on it once renewed, or never), or older messages still wait
            # for that: they go first.
            self._inbox.hold(received)
            return
        await self._handle(received, message)

    def _acting_core(self) -> Master | None:
        """The core, if this master may act now: it leads and (in a group) holds its lease."""
        core = self._core
        if core is None or self._leadership is None:
            return core
        return core if self._leadership.leading() else None

    def _election(self, peer: str, message: Message, principal: str | None) -> None:
        if self._leadership is None:
            return
        if not self._gate.admits_election(peer, message, principal, time.monotonic()):
            return
        self._peers.electing(peer)
        self._leadership.receive(message, functools.partial(self._server.try_send, peer))

    def _may_elect(self, principal: str | None) -> bool:
        return self._gate.may_elect(principal)

    async def _answer_leader(self, peer: str) -> None:
        if self._leadership is not None:
            info = self._leadership.leader_info()
            epoch = self._leadership.node.term
        else:
            assert self._core is not None
            endpoint = self._core.address
            epoch = self._core.epoch
            info = LeaderInfo(responder=endpoint, leader=endpoint, epoch=epoch, masters=(endpoint,))
        with contextlib.suppress(ProtocolError, zmq.ZMQError):
            await self._server.send(peer, info, epoch)

    async def _release_held(self) -> None:
        """Act on client messages held while the lease had lapsed, now that it holds again.

        Thousands may be held (every agent re-registering at a lapse): yield every few
        milliseconds, or the election worker would starve and the lease lapse again."""
        give_way = time.perf_counter() + MAX_BATCH_SECONDS
        while self._inbox.held and self._acting_core() is not None:
            if time.perf_counter() >= give_way:
                await asyncio.sleep(0)
                give_way = time.perf_counter() + MAX_BATCH_SECONDS
                continue
            received = self._inbox.held.popleft()
            if received.message is not None:
                await self._handle(received, received.message)

    async def _handle(self, received: Received, message: Message) -> None:
        peer = received.peer
        core = self._core
        assert core is not None
        checked = self._gate.authorize(peer, message, received.principal, self._epoch())
        if isinstance(checked, Send):
            async with self._lock:
                await self._outbox.perform((checked,))
            return
        message = checked
        if self._debug:
            log.debug("received", peer=peer, message=message.NAME)
        if isinstance(message, Kill) and not message.kill_id:
            message = replace(message, kill_id=new_kill_id())  # from an older driver
        log_call(peer, message)
        self._outbox.batcher.heard(peer, message)
        from_stream = peer.startswith(STREAM_PEER)
        async with self._lock:
            try:
                actions = core.handle(peer, message, self._clock())
            except Exception:
                log.exception("core_failed", peer=peer, message=message.NAME)
                actions = [self._error(peer, ErrorCode.INTERNAL, f"{message.NAME} failed")]
            await self._outbox.perform(actions, release=not from_stream)
        if from_stream and not self._stream_release_due:
            self._stream_release_due = True
            self._spawn(self._release_stream_holds(), "master-stream-release")

    async def _release_stream_holds(self) -> None:
        try:
            await asyncio.sleep(STREAM_HOLD_SECONDS)
        finally:
            self._stream_release_due = False
        async with self._lock:
            await self._outbox.release_batches()

    async def _bad_frame(self, peer: str, error: ProtocolError | None) -> None:
        reason = str(error) if error is not None else "bad frame"
        if self._bad_frame_log.allow(peer, time.monotonic()):
            log.warning("bad_frame", peer=peer, error=reason)
        async with self._lock:
            await self._outbox.perform((self._error(peer, ErrorCode.BAD_REQUEST, reason),))

    def _error(self, peer: str, code: ErrorCode, text: str) -> Send:
        return error_to(peer, code, text, self._epoch())

    def _epoch(self) -> int:
        """The epoch of this master's answers: its core's, 0 without one."""
        return self._core.epoch if self._core is not None else 0

    # ------------------------------------------------------------------ timers

    async def _tick_loop(self) -> None:
        interval = self._tick_interval
        while True:
            await asyncio.sleep(interval)
            self._summarise_bad_frames()
            if self._leadership is not None and self._leadership.node.error is not None:
                # The election state could not be made durable: voting on would risk safety.
                raise RuntimeError(f"election halted: {self._leadership.node.error}")
            self._commits.poke()
            if self._inbox.held:
                await self._release_held()
            core = self._acting_core()
            if core is None:
                if self._core is None:
                    self._forget_silent_peers()
                # else: the lease lapsed; peers silent meanwhile are reported once it holds
                # again (a scheduler's failover clock must start, not be forgotten)
                continue
            async with self._lock:
                now = self._clock()
                started = time.perf_counter()
                try:
                    actions = core.tick(now)
                except Exception:
                    log.exception("core_tick_failed")
                    actions = []
                self.stats.observe_allocation(time.perf_counter() - started)
                await self._outbox.perform(actions)
                await self._expire_peers(core, now)
                await self._report_ended_streams(core, now)

    def _summarise_bad_frames(self) -> None:
        suppressed = self._bad_frame_log.summary(time.monotonic())
        if suppressed is not None:
            log.warning("bad_frames_suppressed", **suppressed.log_fields())
        self._gate.summarise_refusals(time.monotonic())

    def _forget_silent_peers(self) -> None:
        """On a standby, peers silent past the timeout are just forgotten."""
        for peer in self._peers.expire(time.monotonic() - self._peer_timeout):
            self._outbox.batcher.forget(peer)

    async def _report_ended_streams(self, core: Master, now: float) -> None:
        """HTTP schedulers whose streams ended are reported to the core as disconnected."""
        for peer in self.streams.take_ended():
            await self._report_disconnected(core, peer, now)

    async def _expire_peers(self, core: Master, now: float) -> None:
        """Peers silent past the timeout are reported to the core as disconnected."""
        for peer in self._peers.expire(time.monotonic() - self._peer_timeout):
            if self._debug:
                log.debug("peer_silent", peer=peer)
            self._outbox.batcher.forget(peer)
            await self._report_disconnected(core, peer, now)

    async def _report_disconnected(self, core: Master, peer: str, now: float) -> None:
        try:
            actions = core.disconnected(peer, now)
        except Exception:
            log.exception("core_disconnected_failed", peer=peer)
            return
        await self._outbox.perform(actions)

    # ------------------------------------------------------------------ sending

    def _start_proposal(self, action: Propose) -> None:
        self._spawn(self._propose(action), "master-propose")

    async def _propose(self, action: Propose) -> None:
        """Replicate one registry change; what the core that asked makes of the outcome takes
        effect through :attr:`_commits`, in order, under the lease."""
        assert self._leadership is not None
        core = self._core
        committed = await self._leadership.propose(action.op)
        if core is not None:
            self._commits.decided(Decided(core, action, committed))

    async def _take_effect(self, decided: Decided) -> None:
        async with self._lock:
            now = self._clock()
            core, seq = decided.core, decided.action.seq
            actions = core.committed(seq, now) if decided.committed else core.abandoned(seq, now)
            await self._outbox.perform(actions)

    async def _end_burst(self, *, release: bool = False) -> None:
        """One allocation for a burst of client messages, or of registry changes that just took
        effect: one per message would re-rank every framework thousands of times in a storm.
        With ``release``, what was held for peers that read batches leaves even when this
        master may not act now."""
        async with self._lock:
            core = self._acting_core()
            if core is not None:
                started = time.perf_counter()
                actions = core.end_burst(self._clock())
                self.stats.observe_allocation(time.perf_counter() - started)
                await self._outbox.perform(actions)
            elif release:
                await self._outbox.release_batches()
