"""Scheduler calls (framework -> master) and events (master -> framework)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages._record import MaxItems, Message, Range, ShortStr, Uuid
from agora.sdk.messages.common import (
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
]

_DEFAULT_FILTERS = Filters()  # refuse for 5 s
_Roles = Annotated[tuple[ShortStr, ...], MaxItems(1024)]

# ---- calls ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Message):
    NAME: ClassVar[str] = "SUBSCRIBE"
    framework_info: FrameworkInfo
    suppressed_roles: _Roles = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Teardown(Message):
    NAME: ClassVar[str] = "TEARDOWN"
    framework_id: FrameworkID


@dataclass(frozen=True, slots=True, kw_only=True)
class Accept(Message):
    NAME: ClassVar[str] = "ACCEPT"
    framework_id: FrameworkID
    offer_ids: tuple[OfferID, ...]
    operations: tuple[Operation, ...] = ()
    filters: Filters = _DEFAULT_FILTERS


@dataclass(frozen=True, slots=True, kw_only=True)
class Decline(Message):
    NAME: ClassVar[str] = "DECLINE"
    framework_id: FrameworkID
    offer_ids: tuple[OfferID, ...]
    filters: Filters = _DEFAULT_FILTERS


@dataclass(frozen=True, slots=True, kw_only=True)
class Revive(Message):
    """Clear filters and un-suppress ``roles`` (() = every role of the framework)."""

    NAME: ClassVar[str] = "REVIVE"
    framework_id: FrameworkID
    roles: _Roles = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Suppress(Message):
    """Stop offers for ``roles`` (() = every role of the framework)."""

    NAME: ClassVar[str] = "SUPPRESS"
    framework_id: FrameworkID
    roles: _Roles = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Kill(Message):
    NAME: ClassVar[str] = "KILL"
    framework_id: FrameworkID
    task_id: TaskID
    agent_id: AgentID | None = None
    #: Names this kill in the logs of the master, the agent and the executor (``kill_id=``);
    #: the scheduler driver mints one (:func:`agora.sdk.ids.new_kill_id`), the master one if empty.
    kill_id: ShortStr = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown(Message):
    NAME: ClassVar[str] = "SHUTDOWN"
    framework_id: FrameworkID
    executor_id: ExecutorID
    agent_id: AgentID


@dataclass(frozen=True, slots=True, kw_only=True)
class Acknowledge(Message):
    NAME: ClassVar[str] = "ACKNOWLEDGE"
    framework_id: FrameworkID
    agent_id: AgentID
    task_id: TaskID
    uuid: Uuid


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconcile(Message):
    """Explicit reconciliation of ``tasks``; () asks for every task the master knows."""

    NAME: ClassVar[str] = "RECONCILE"
    framework_id: FrameworkID
    tasks: tuple[ReconcileTask, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessage(Message):
    NAME: ClassVar[str] = "MESSAGE"
    framework_id: FrameworkID
    agent_id: AgentID
    executor_id: ExecutorID
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Request(Message):
    NAME: ClassVar[str] = "REQUEST"
    framework_id: FrameworkID
    gangs: Annotated[tuple[GangRequest, ...], MaxItems(1024)]


# ---- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribed(Message):
    NAME: ClassVar[str] = "SUBSCRIBED"
    framework_id: FrameworkID
    heartbeat_interval_seconds: Annotated[float, Range(0, 86_400)]
    master_info: MasterInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class Offers(Message):
    NAME: ClassVar[str] = "OFFERS"
    offers: tuple[Offer, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rescind(Message):
    NAME: ClassVar[str] = "RESCIND"
    offer_id: OfferID


@dataclass(frozen=True, slots=True, kw_only=True)
class Update(Message):
    NAME: ClassVar[str] = "UPDATE"
    status: TaskStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkMessage(Message):
    """The MESSAGE event: opaque bytes from an executor."""

    NAME: ClassVar[str] = "FRAMEWORK_MESSAGE"
    agent_id: AgentID
    executor_id: ExecutorID
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(Message):
    """An agent was lost (no ``executor_id``) or an executor exited with ``status``."""

    NAME: ClassVar[str] = "FAILURE"
    agent_id: AgentID
    executor_id: ExecutorID | None = None
    status: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Message):
    NAME: ClassVar[str] = "ERROR"
    message: str
    code: ErrorCode = ErrorCode.BAD_REQUEST


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Message):
    NAME: ClassVar[str] = "HEARTBEAT"


@dataclass(frozen=True, slots=True, kw_only=True)
class GangExpired(Message):
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
    Reconcile,
    SendMessage,
    Request,
    Subscribed,
    Offers,
    Rescind,
    Update,
    FrameworkMessage,
    Failure,
    Error,
    Heartbeat,
    GangExpired,
)
