"""Scheduler calls (framework -> master) and events (master -> framework)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages._record import MaxItems, Message, Range, ShortStr, Uuid
from agora.sdk.messages.common import (
    MAX_BATCH_ITEMS,
    Features,
    Filters,
    FrameworkInfo,
    GangRequest,
    MasterInfo,
    Offer,
    Operation,
    ReconcileTask,
    TaskStatus,
)
from agora.sdk.messages.enums import ErrorCode

__all__ = [
    "MESSAGES",
    "Accept",
    "Acknowledge",
    "Acknowledgements",
    "Decline",
    "Error",
    "Failure",
    "FrameworkMessage",
    "GangExpired",
    "Heartbeat",
    "Kill",
    "Offers",
    "Reconcile",
    "Request",
    "Rescind",
    "Revive",
    "SendMessage",
    "Shutdown",
    "Subscribe",
    "Subscribed",
    "Suppress",
    "Teardown",
    "Update",
    "Updates",
]

_DEFAULT_FILTERS = Filters()  # refuse for 5 s
_Roles = Annotated[tuple[ShortStr, ...], MaxItems(1024)]

# ---- calls ---------------------------------------------------------------------------------------


class Subscribe(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "SUBSCRIBE"
    framework_info: FrameworkInfo
    suppressed_roles: _Roles = ()
    #: What this driver understands beyond the base protocol (``UPDATES`` with "batches").
    features: Features = ()


class Teardown(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "TEARDOWN"
    framework_id: FrameworkID


class Accept(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "ACCEPT"
    framework_id: FrameworkID
    offer_ids: tuple[OfferID, ...]
    operations: tuple[Operation, ...] = ()
    filters: Filters = _DEFAULT_FILTERS


class Decline(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "DECLINE"
    framework_id: FrameworkID
    offer_ids: tuple[OfferID, ...]
    filters: Filters = _DEFAULT_FILTERS


class Revive(Message, frozen=True, kw_only=True):
    """Clear filters and un-suppress ``roles`` (() = every role of the framework)."""

    NAME: ClassVar[str] = "REVIVE"
    framework_id: FrameworkID
    roles: _Roles = ()


class Suppress(Message, frozen=True, kw_only=True):
    """Stop offers for ``roles`` (() = every role of the framework)."""

    NAME: ClassVar[str] = "SUPPRESS"
    framework_id: FrameworkID
    roles: _Roles = ()


class Kill(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "KILL"
    framework_id: FrameworkID
    task_id: TaskID
    agent_id: AgentID | None = None
    #: Names this kill in the logs of the master, the agent and the executor (``kill_id=``);
    #: the scheduler driver mints one (:func:`agora.sdk.ids.new_kill_id`), the master one if empty.
    kill_id: ShortStr = ""


class Shutdown(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "SHUTDOWN"
    framework_id: FrameworkID
    executor_id: ExecutorID
    agent_id: AgentID


class Acknowledge(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "ACKNOWLEDGE"
    framework_id: FrameworkID
    agent_id: AgentID
    task_id: TaskID
    uuid: Uuid


class Acknowledgements(Message, frozen=True, kw_only=True):
    """Several ACKNOWLEDGE calls in one message, in order; sent only to a master announcing
    the "batches" feature."""

    NAME: ClassVar[str] = "ACKNOWLEDGEMENTS"
    acks: Annotated[tuple[Acknowledge, ...], MaxItems(MAX_BATCH_ITEMS)]


class Reconcile(Message, frozen=True, kw_only=True):
    """Explicit reconciliation of ``tasks``; () asks for every task the master knows."""

    NAME: ClassVar[str] = "RECONCILE"
    framework_id: FrameworkID
    tasks: tuple[ReconcileTask, ...] = ()


class SendMessage(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "MESSAGE"
    framework_id: FrameworkID
    agent_id: AgentID
    executor_id: ExecutorID
    data: bytes


class Request(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "REQUEST"
    framework_id: FrameworkID
    gangs: Annotated[tuple[GangRequest, ...], MaxItems(1024)]


# ---- events --------------------------------------------------------------------------------------


class Subscribed(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "SUBSCRIBED"
    framework_id: FrameworkID
    heartbeat_interval_seconds: Annotated[float, Range(0, 86_400)]
    master_info: MasterInfo


class Offers(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "OFFERS"
    offers: tuple[Offer, ...]


class Rescind(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RESCIND"
    offer_id: OfferID


class Update(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "UPDATE"
    status: TaskStatus


class Updates(Message, frozen=True, kw_only=True):
    """Several UPDATE events in one message, in order; sent only to a framework that subscribed
    with the "batches" feature."""

    NAME: ClassVar[str] = "UPDATES"
    statuses: Annotated[tuple[TaskStatus, ...], MaxItems(MAX_BATCH_ITEMS)]


class FrameworkMessage(Message, frozen=True, kw_only=True):
    """The MESSAGE event: opaque bytes from an executor."""

    NAME: ClassVar[str] = "FRAMEWORK_MESSAGE"
    agent_id: AgentID
    executor_id: ExecutorID
    data: bytes


class Failure(Message, frozen=True, kw_only=True):
    """An agent was lost (no ``executor_id``) or an executor exited with ``status``."""

    NAME: ClassVar[str] = "FAILURE"
    agent_id: AgentID
    executor_id: ExecutorID | None = None
    status: int | None = None


class Error(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "ERROR"
    message: str
    code: ErrorCode = ErrorCode.BAD_REQUEST


class Heartbeat(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "HEARTBEAT"


class GangExpired(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "GANG_EXPIRED"
    gang_id: GangID
    message: str = ""


MESSAGES: tuple[type[Message], ...] = (
    Subscribe,
    Teardown,
    Accept,
    Decline,
    Revive,
    Suppress,
    Kill,
    Shutdown,
    Acknowledge,
    Acknowledgements,
    Reconcile,
    SendMessage,
    Request,
    Subscribed,
    Offers,
    Rescind,
    Update,
    Updates,
    FrameworkMessage,
    Failure,
    Error,
    Heartbeat,
    GangExpired,
)
