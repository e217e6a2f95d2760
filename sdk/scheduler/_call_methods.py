"""The calls a scheduler makes, written once for both drivers.

:class:`CallMethods` gives the asyncio :class:`~agora.sdk.scheduler.SchedulerDriver` and the
:class:`~agora.sdk.scheduler.BlockingSchedulerDriver` their public calls. Each builds its
message through the driver's :class:`~agora.sdk.scheduler.core.SchedulerCore` (which checks it,
queues it and marks the offers it uses) by way of the driver's ``_call``, which also wakes the
sender. A call that could never be sent raises ValueError at once and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agora.sdk.ids import AgentID, ExecutorID, TaskID, new_kill_id
from agora.sdk.messages import (
    ExecutorInfo,
    Filters,
    GangRequest,
    InverseOffer,
    Message,
    Operation,
    ReconcileTask,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.scheduler._guard import SafeLog
from agora.sdk.scheduler.calls import Offers_
from agora.sdk.scheduler.core import SchedulerCore
from agora.sdk.scheduler.spec import TaskSpec

__all__ = ["CallMethods"]

log = SafeLog("agora.sdk.scheduler.driver")


class CallMethods:
    """The public calls, over the driver's ``_core``, ``_call`` and ``stop``."""

    _core: SchedulerCore

    if TYPE_CHECKING:  # what the class using these calls provides

        def _call(self, name: str, make: Callable[..., Message], *args: Any) -> None: ...

        def stop(self, *, failover: bool = False) -> None: ...

    def launch(
        self,
        offers: Offers_,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT ``offers`` (one agent's) with one LAUNCH of ``tasks``; what they leave unused
        is declined with ``filters``. TaskSpecs are placed on the offers (ValueError when they
        do not fit); an offer given by id must be one the driver still holds for that."""
        self._call("launch", self._core.launch, offers, tasks, filters)

    def launch_group(
        self,
        offers: Offers_,
        executor: ExecutorInfo,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT with one LAUNCH_GROUP: ``tasks`` start together under ``executor``."""
        self._call("launch_group", self._core.launch_group, offers, executor, tasks, filters)

    def accept(
        self,
        offer_ids: Offers_,
        operations: Sequence[Operation],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT with explicit operations (LAUNCH, LAUNCH_GROUP, RESERVE, UNRESERVE)."""
        self._call("accept", self._core.accept, offer_ids, operations, filters)

    def decline(self, offer_ids: Offers_, filters: Filters | None = None) -> None:
        """DECLINE: the offers' resources are not offered again for ``filters.refuse_seconds``
        (at least the master's floor, ``--min-refuse-seconds``)."""
        self._call("decline", self._core.decline, offer_ids, filters)

    def revive(self, roles: Sequence[str] = ()) -> None:
        """Clear filters and resume offers for ``roles`` (() = all the framework's roles)."""
        self._call("revive", self._core.revive, roles)

    def suppress(self, roles: Sequence[str] = ()) -> None:
        """Stop offers for ``roles`` (() = all); kept across re-subscription."""
        self._call("suppress", self._core.suppress, roles)

    def kill(self, task_id: TaskID | str, agent_id: AgentID | str | None = None) -> str:
        """KILL a task; returns the kill's id (``kill_id`` in the logs of every hop)."""
        kill_id = new_kill_id()
        log.info(
            "kill_requested", framework_id=self._core.framework_id, task_id=task_id, kill_id=kill_id
        )
        self._call("kill", self._core.kill, task_id, agent_id, kill_id)
        return kill_id

    def shutdown_executor(self, agent_id: AgentID | str, executor_id: ExecutorID | str) -> None:
        """SHUTDOWN: stop one executor (its tasks become LOST/KILLED)."""
        self._call("shutdown_executor", self._core.shutdown_executor, agent_id, executor_id)

    def acknowledge(self, status: TaskStatus) -> None:
        """Acknowledge an update (only needed without implicit acknowledgements)."""
        self._call("acknowledge", self._core.acknowledge, status)

    def reconcile(self, tasks: Sequence[TaskID | str | ReconcileTask | TaskStatus] = ()) -> None:
        """RECONCILE: () asks for every task the master knows (implicit); otherwise the latest
        state of each named task (a TaskStatus names its task and agent)."""
        self._call("reconcile", self._core.reconcile, tasks)

    def message(self, agent_id: AgentID | str, executor_id: ExecutorID | str, data: bytes) -> None:
        """MESSAGE: opaque bytes to one executor (best effort)."""
        self._call("message", self._core.message, agent_id, executor_id, data)

    def accept_inverse_offers(self, inverse_offers: Sequence[InverseOffer | str]) -> None:
        """ACCEPT_INVERSE_OFFERS: the framework will vacate those agents before their windows."""
        self._call("accept_inverse_offers", self._core.answer_inverse_offers, inverse_offers, True)

    def decline_inverse_offers(self, inverse_offers: Sequence[InverseOffer | str]) -> None:
        """DECLINE_INVERSE_OFFERS: the framework will not vacate those agents in time."""
        self._call(
            "decline_inverse_offers", self._core.answer_inverse_offers, inverse_offers, False
        )

    def request(self, gangs: Sequence[GangRequest]) -> None:
        """REQUEST gangs (the allocator offers each whole, as one bundle)."""
        self._call("request", self._core.request, gangs)

    def teardown(self) -> None:
        """Tear the framework down (its tasks are killed) and stop: ``stop(failover=False)``."""
        self.stop(failover=False)
