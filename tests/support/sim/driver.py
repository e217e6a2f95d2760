"""The scheduler driver in the simulation: the real driver core
(``agora.sdk.scheduler.core.SchedulerCore``) in a shell made of simulated time and network.

It does what the asyncio driver's shell does with the core (``agora.sdk.scheduler.driver`` and
its event handlers): drops frames of a deposed master's epoch, takes batches apart, feeds each
message to the core and runs the scheduler's callbacks in the same order, acknowledges updates
implicitly once the callback has seen them, re-subscribes when the link drops or the master
forgot the framework, and sends whatever the core queued, acknowledgements coalesced. Only the
retry timing is the simulation's (a fixed ``subscribe_retry``, where the real driver backs off
with jitter).
"""

from __future__ import annotations

from typing import Protocol

from agora.sdk.ids import AgentID, FrameworkID, GangID, OfferID
from agora.sdk.messages import (
    Error,
    Failure,
    FrameworkInfo,
    GangExpired,
    Heartbeat,
    Message,
    Offer,
    Offers,
    Rescind,
    Subscribed,
    TaskStatus,
    Update,
)
from agora.sdk.messages.batching import unbatch
from agora.sdk.scheduler.core import ErrorVerdict, SchedulerCore

from support.sim.clock import EventQueue
from support.sim.network import MASTER, SimNetwork

__all__ = ["SchedulerCallbacks", "SimDriver"]


class SchedulerCallbacks(Protocol):
    """The callbacks of ``agora.sdk.Scheduler`` that the simulated frameworks use."""

    def registered(self, framework_id: FrameworkID) -> None: ...
    def reregistered(self) -> None: ...
    def disconnected(self) -> None: ...
    def offers(self, offers: list[Offer]) -> None: ...
    def status_update(self, status: TaskStatus) -> None: ...
    def gang_expired(self, gang_id: GangID) -> None: ...
    def error(self, message: Error) -> None: ...


class SimDriver:
    def __init__(
        self,
        name: str,
        info: FrameworkInfo,
        scheduler: SchedulerCallbacks,
        queue: EventQueue,
        net: SimNetwork,
        *,
        subscribe_retry: float,
        implicit_acknowledgements: bool = True,
    ) -> None:
        self.name = name
        self.core = SchedulerCore(info, implicit_acknowledgements=implicit_acknowledgements)
        self.scheduler = scheduler
        self.queue = queue
        self.net = net
        self.subscribe_retry = subscribe_retry
        #: The master said FRAMEWORK_REMOVED (or refused the subscription): the driver stopped.
        self.stopped = False
        self.heartbeats = 0
        self.failures = 0
        self._subscribing = False
        net.attach(name, self.receive)

    # --- the link ------------------------------------------------------------------------
    def start(self) -> None:
        self._subscribe()

    def connection_lost(self) -> None:
        """The transport reports the connection to the master gone: re-subscribe."""
        if self.stopped:
            return
        if self.core.connection_lost():
            self.scheduler.disconnected()
        self._subscribe()

    def link_up(self) -> None:
        """The link follows a (new) leader: subscribe with it now."""
        if not self.core.subscribed and not self.stopped:
            self._send(self.core.subscribe())
        self._subscribe()

    def link_down(self) -> None:
        """The leader the link followed is gone (the driver re-subscribes on the next one)."""
        self.connection_lost()

    def _subscribe(self) -> None:
        if not self._subscribing:
            self._subscribing = True
            self._subscribe_attempt()

    def _subscribe_attempt(self) -> None:
        if self.core.subscribed or self.stopped:
            self._subscribing = False
            return
        self._send(self.core.subscribe())
        self.queue.later(self.subscribe_retry, self._subscribe_attempt, f"{self.name} subscribe")

    def _lost(self) -> None:
        if self.core.lost():
            self.scheduler.disconnected()
        self._subscribe()

    # --- sending ---------------------------------------------------------------------------
    def _send(self, message: Message) -> None:
        if not self.stopped:
            self.net.send(self.name, MASTER, message)

    def flush(self) -> None:
        """Send the calls the core has queued, once subscribed (the real driver's sender task:
        calls made meanwhile wait for the subscription)."""
        while self.core.subscribed and (call := self.core.next_call()) is not None:
            self._send(call)

    # --- receiving -----------------------------------------------------------------------
    def receive(self, _sender: str, message: Message, epoch: int) -> None:
        if self.stopped or not self.core.fresh(epoch):
            return
        for one in unbatch(message):
            self._dispatch(one)
            if self.stopped:
                return
        self.flush()

    def _dispatch(self, m: Message) -> None:
        core = self.core
        if isinstance(m, Subscribed):
            first, again, _voided = core.on_subscribed(m)
            if first:
                self.scheduler.registered(m.framework_id)
            elif again:
                self.scheduler.reregistered()
        elif isinstance(m, Offers):
            offers = list(m.offers)
            core.on_offers(offers)
            self.scheduler.offers(offers)
        elif isinstance(m, Rescind):
            core.on_rescind(m.offer_id)
        elif isinstance(m, Update):
            self.scheduler.status_update(m.status)
            core.acknowledged(m.status)
        elif isinstance(m, Error):
            self._on_error(m)
        elif isinstance(m, GangExpired):
            self.scheduler.gang_expired(m.gang_id)
        elif isinstance(m, Failure):
            self.failures += 1
        elif isinstance(m, Heartbeat):
            self.heartbeats += 1

    def _on_error(self, m: Error) -> None:
        verdict = self.core.error_verdict(m)
        if verdict in (ErrorVerdict.STALE, ErrorVerdict.RESUBSCRIBE):
            self._lost()
            return
        self.scheduler.error(m)
        if verdict is ErrorVerdict.FATAL:
            self.stopped = True
            self.core.lost()

    # --- views -----------------------------------------------------------------------------
    @property
    def framework_id(self) -> FrameworkID | None:
        return self.core.framework_id

    def held(self, agent_id: AgentID) -> list[Offer]:
        """The offers of one agent the framework holds (neither used nor declined)."""
        return [o for o in self.core.offers.values() if o.agent_id == agent_id]

    def holds(self, offer_id: OfferID) -> bool:
        return offer_id in self.core.offers
