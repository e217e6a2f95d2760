"""The calls a scheduler makes on its driver, as a type: what a :class:`Scheduler`'s callbacks
are given as ``driver``, whichever driver runs them (the asyncio :class:`SchedulerDriver` or
the :class:`BlockingSchedulerDriver`). Annotate your callbacks with it to have a type checker
check your calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeAlias

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    ExecutorInfo,
    Filters,
    GangRequest,
    InverseOffer,
    MasterInfo,
    Offer,
    Operation,
    ReconcileTask,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.scheduler.spec import TaskSpec

__all__ = ["OfferRef", "Offers_", "SchedulerCalls"]

#: An offer, or its id.
OfferRef: TypeAlias = Offer | OfferID | str
#: One offer (or id), or several of one agent.
Offers_: TypeAlias = OfferRef | Sequence[OfferRef]


class SchedulerCalls(Protocol):
    """The driver as its scheduler's callbacks see it. Every call is safe from a callback; a
    call that could never be sent (a task id over 255 characters, a negative refuse_seconds)
    raises ValueError at once and uses up no offer."""

    @property
    def framework_id(self) -> FrameworkID | None: ...

    @property
    def master_info(self) -> MasterInfo | None: ...

    @property
    def subscribed(self) -> bool: ...

    def launch(
        self,
        offers: Offers_,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None: ...

    def launch_group(
        self,
        offers: Offers_,
        executor: ExecutorInfo,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None: ...

    def accept(
        self,
        offer_ids: Offers_,
        operations: Sequence[Operation],
        filters: Filters | None = None,
    ) -> None: ...

    def decline(self, offer_ids: Offers_, filters: Filters | None = None) -> None: ...

    def revive(self, roles: Sequence[str] = ()) -> None: ...

    def suppress(self, roles: Sequence[str] = ()) -> None: ...

    def kill(self, task_id: TaskID | str, agent_id: AgentID | str | None = None) -> str: ...

    def shutdown_executor(self, agent_id: AgentID | str, executor_id: ExecutorID | str) -> None: ...

    def acknowledge(self, status: TaskStatus) -> None: ...

    def reconcile(
        self, tasks: Sequence[TaskID | str | ReconcileTask | TaskStatus] = ()
    ) -> None: ...

    def message(
        self, agent_id: AgentID | str, executor_id: ExecutorID | str, data: bytes
    ) -> None: ...

    def request(self, gangs: Sequence[GangRequest]) -> None: ...

    def accept_inverse_offers(self, inverse_offers: Sequence[InverseOffer | str]) -> None: ...

    def decline_inverse_offers(self, inverse_offers: Sequence[InverseOffer | str]) -> None: ...

    def teardown(self) -> None: ...

    def stop(self, *, failover: bool = False) -> None: ...

    def abort(self) -> None: ...
