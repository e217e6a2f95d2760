"""The callbacks a framework scheduler implements: override what you need.

Every callback may be a plain method or an ``async def``; the driver awaits coroutines in
order, on its event loop, one event at a time. A callback that raises is logged with its
innermost frames and the driver carries on; the offers an ``offers`` callback left held when it
raised are declined (default filters), so they go back to the cluster. ``driver`` is the driver
that delivered the event (a :class:`SchedulerDriver`, or a :class:`BlockingSchedulerDriver`
when that one runs the scheduler), typed as :class:`~agora.sdk.scheduler.calls.SchedulerCalls`;
its calls are safe to make from inside a callback.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID
from agora.sdk.messages import InverseOffer, MasterInfo, Offer, TaskStatus

if TYPE_CHECKING:
    from agora.sdk.scheduler.calls import SchedulerCalls

__all__ = ["Scheduler"]


class Scheduler:
    """No-op base of a framework scheduler."""

    def registered(
        self, driver: SchedulerCalls, framework_id: FrameworkID, master_info: MasterInfo
    ) -> Awaitable[None] | None:
        """The driver's first SUBSCRIBED, with the framework's id (new or the one reused)."""
        return None

    def reregistered(
        self, driver: SchedulerCalls, master_info: MasterInfo
    ) -> Awaitable[None] | None:
        """SUBSCRIBED again after :meth:`disconnected` (same framework id)."""
        return None

    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> Awaitable[None] | None:
        """New offers: launch on them, or decline them (else they stay held until rescinded)."""
        return None

    def offer_rescinded(self, driver: SchedulerCalls, offer_id: OfferID) -> Awaitable[None] | None:
        """``offer_id`` may no longer be used (also sent for offers voided by a re-subscription)."""
        return None

    def inverse_offers(
        self, driver: SchedulerCalls, inverse_offers: list[InverseOffer]
    ) -> Awaitable[None] | None:
        """Agents where the framework has tasks will be down for maintenance (each from ``start``
        for ``duration`` seconds). Answer with ``driver.accept_inverse_offers`` (you will move
        your tasks off in time) or ``driver.decline_inverse_offers``; the answer is only shown
        to operators: at the window's start the agent drains anyway, and what still runs at its
        end is killed (reason AGENT_DRAINING). Ignoring them is allowed (the default)."""
        return None

    def inverse_offer_rescinded(
        self, driver: SchedulerCalls, inverse_offer_id: str
    ) -> Awaitable[None] | None:
        """The maintenance behind ``inverse_offer_id`` was cancelled."""
        return None

    def status_update(self, driver: SchedulerCalls, status: TaskStatus) -> Awaitable[None] | None:
        """A task's new status. With implicit acknowledgements the driver acknowledges it after
        this returns; otherwise call ``driver.acknowledge(status)``."""
        return None

    def framework_message(
        self, driver: SchedulerCalls, agent_id: AgentID, executor_id: ExecutorID, data: bytes
    ) -> Awaitable[None] | None:
        """Opaque bytes from one of the framework's executors (best effort)."""
        return None

    def agent_lost(self, driver: SchedulerCalls, agent_id: AgentID) -> Awaitable[None] | None:
        """An agent was removed or became unreachable (task updates follow separately)."""
        return None

    def executor_lost(
        self, driver: SchedulerCalls, agent_id: AgentID, executor_id: ExecutorID, status: int | None
    ) -> Awaitable[None] | None:
        """An executor exited with ``status`` (negative: killed by that signal)."""
        return None

    def gang_expired(
        self, driver: SchedulerCalls, gang_id: GangID, message: str
    ) -> Awaitable[None] | None:
        """A gang REQUEST was not satisfied within its hold timeout."""
        return None

    def error(self, driver: SchedulerCalls, message: str) -> Awaitable[None] | None:
        """The master refused something. When the error is fatal (subscription forbidden,
        framework removed, replaced by another scheduler) the driver stops after this."""
        return None

    def disconnected(self, driver: SchedulerCalls) -> Awaitable[None] | None:
        """The link to the master was lost; the driver re-subscribes on its own."""
        return None
