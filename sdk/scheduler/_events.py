"""What the scheduler driver does with each event from the master: the core's decision, then
the scheduler's callbacks, in order. Written as a part of :class:`SchedulerDriver` (it uses the
driver's core, its callbacks and its wake-ups), kept apart to keep each file readable."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agora.sdk.messages import (
    Error,
    Failure,
    FrameworkMessage,
    GangExpired,
    Heartbeat,
    InverseOffers,
    Offers,
    Rescind,
    RescindInverseOffer,
    Subscribed,
    Update,
    Updates,
)
from agora.sdk.scheduler._guard import DriverError, SafeLog
from agora.sdk.scheduler.core import ErrorVerdict, SchedulerCore

if TYPE_CHECKING:
    from agora.sdk.messages import Filters
    from agora.sdk.scheduler.calls import Offers_

__all__ = ["EventHandlers"]

log = SafeLog("agora.sdk.scheduler.driver")


class EventHandlers:
    """The master's events, handled: one ``_on_<event>`` each (see ``handlers``)."""

    _core: SchedulerCore
    _silence_limit: float | None
    _need_subscribe: bool
    _subscribe_wake: asyncio.Event
    _subscribed_evt: asyncio.Event
    _send_wake: asyncio.Event

    if TYPE_CHECKING:  # what the driver provides

        async def _invoke(self, name: str, *args: Any) -> bool: ...

        def _lost(self, reason: str) -> None: ...

        def _fail(self, error: DriverError) -> None: ...

        def decline(self, offer_ids: Offers_, filters: Filters | None = None) -> None: ...

    def handlers(self) -> dict[type[Any], Any]:
        return {
            Subscribed: self._on_subscribed,
            Offers: self._on_offers,
            Rescind: self._on_rescind,
            Update: self._on_update,
            Updates: self._on_updates,
            FrameworkMessage: self._on_framework_message,
            Failure: self._on_failure,
            Error: self._on_error,
            Heartbeat: self._on_heartbeat,
            GangExpired: self._on_gang_expired,
            InverseOffers: self._on_inverse_offers,
            RescindInverseOffer: self._on_rescind_inverse_offer,
        }

    async def _on_subscribed(self, m: Subscribed) -> None:
        first, again, voided = self._core.on_subscribed(m)
        hb = m.heartbeat_interval_seconds
        self._silence_limit = 3 * hb if hb > 0 else None
        self._need_subscribe = False
        self._subscribe_wake.set()
        for offer_id in voided:
            await self._invoke("offer_rescinded", offer_id)
        if first:
            log.info("framework_registered", framework_id=m.framework_id)
            await self._invoke("registered", m.framework_id, m.master_info)
        elif again:
            log.info("framework_reregistered", framework_id=m.framework_id)
            await self._invoke("reregistered", m.master_info)
        self._subscribed_evt.set()
        if self._core.outbox:
            self._send_wake.set()

    async def _on_offers(self, m: Offers) -> None:
        offers = list(m.offers)
        self._core.on_offers(offers)
        if not await self._invoke("offers", offers):
            # What the failed callback left held would stay out of every framework's reach.
            left = self._core.still_held(offers)
            if left:
                log.warning("offers_declined_after_callback_failed", offers=len(left))
                self.decline(left)

    async def _on_rescind(self, m: Rescind) -> None:
        self._core.on_rescind(m.offer_id)
        await self._invoke("offer_rescinded", m.offer_id)

    async def _on_inverse_offers(self, m: InverseOffers) -> None:
        inverse_offers = list(m.inverse_offers)
        self._core.on_inverse_offers(inverse_offers)
        await self._invoke("inverse_offers", inverse_offers)

    async def _on_rescind_inverse_offer(self, m: RescindInverseOffer) -> None:
        self._core.on_rescind_inverse_offer(m.inverse_offer_id)
        await self._invoke("inverse_offer_rescinded", m.inverse_offer_id)

    async def _on_updates(self, m: Updates) -> None:
        for status in m.statuses:
            await self._on_update(Update(status=status))

    async def _on_update(self, m: Update) -> None:
        await self._invoke("status_update", m.status)
        before = len(self._core.outbox)
        self._core.acknowledged(m.status)
        if len(self._core.outbox) != before:
            self._send_wake.set()

    async def _on_framework_message(self, m: FrameworkMessage) -> None:
        await self._invoke("framework_message", m.agent_id, m.executor_id, m.data)

    async def _on_failure(self, m: Failure) -> None:
        if m.executor_id is None:
            await self._invoke("agent_lost", m.agent_id)
        else:
            await self._invoke("executor_lost", m.agent_id, m.executor_id, m.status)

    async def _on_heartbeat(self, _m: Heartbeat) -> None:
        return None

    async def _on_gang_expired(self, m: GangExpired) -> None:
        await self._invoke("gang_expired", m.gang_id, m.message)

    async def _on_error(self, m: Error) -> None:
        verdict = self._core.error_verdict(m)
        if verdict is ErrorVerdict.STALE:
            # Refused on a new connection before we re-subscribed on it: a stale call.
            log.info("call_refused_after_reconnect", error=m.message)
            self._lost("master refused a call from a new connection")
            return
        if verdict is ErrorVerdict.RESUBSCRIBE:
            log.info("master_forgot_framework", error=m.message, code=m.code.value)
            self._lost(f"master: {m.message}")
            return
        log.warning("master_error", error=m.message, code=m.code.value)
        await self._invoke("error", m.message)
        if verdict is ErrorVerdict.FATAL:
            self._fail(DriverError(m.message, m.code))
