"""Operator calls (CLI, console, scripts -> master) and the master's answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages._record import MaxItems, Message, Range, Record, ShortStr, Timestamp
from agora.sdk.messages.common import MasterInfo
from agora.sdk.messages.container import ContainerUsage
from agora.sdk.messages.enums import Reason, TaskState
from agora.sdk.resources import Resources

__all__ = [
    "MESSAGES",
    "AgentSummary",
    "FrameworkSummary",
    "GetState",
    "MasterMember",
    "OperatorKill",
    "StateReply",
    "TaskSummary",
]

_MANY = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSummary(Record):
    agent_id: AgentID
    hostname: ShortStr
    port: Annotated[int, Range(0, 65_535)] = 0
    #: The agent's HTTP API (``agora logs`` reads task files there) at ``address:http_port``;
    #: http_port 0: the agent serves no HTTP.
    http_port: Annotated[int, Range(0, 65_535)] = 0
    address: ShortStr = ""
    #: ACTIVE or UNREACHABLE.
    status: ShortStr
    resources: Resources
    #: What tasks, executors and outstanding offers hold of ``resources``.
    allocated: Resources = field(default_factory=Resources)
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkSummary(Record):
    framework_id: FrameworkID
    name: str
    roles: tuple[ShortStr, ...] = ()
    #: False once torn down or failed over past its timeout (then kept as a completed framework).
    active: bool = True
    connected: bool = True
    user: ShortStr = ""
    principal: ShortStr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSummary(Record):
    task_id: TaskID
    framework_id: FrameworkID
    agent_id: AgentID
    name: str = ""
    state: TaskState
    reason: Reason | None = None
    message: str = ""
    exit_code: int | None = None
    resources: Resources = field(default_factory=Resources)
    timestamp: Timestamp = 0.0
    #: The latest usage of the task's container, as its agent reported it.
    usage: ContainerUsage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetState(Message):
    NAME: ClassVar[str] = "GET_STATE"


@dataclass(frozen=True, slots=True, kw_only=True)
class MasterMember(Record):
    """One master of the group as the leader sees it."""

    address: ShortStr
    #: "leader" or "standby".
    role: ShortStr
    #: The leader heard from it within an election timeout.
    reachable: bool = True
    #: Seconds since the leader last heard from it (0 for the leader itself; None: never).
    last_contact: Annotated[float, Range(0)] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StateReply(Message):
    NAME: ClassVar[str] = "STATE"
    master_info: MasterInfo
    agents: Annotated[tuple[AgentSummary, ...], MaxItems(_MANY)] = ()
    frameworks: Annotated[tuple[FrameworkSummary, ...], MaxItems(_MANY)] = ()
    #: Live tasks, then the completed ones the master still remembers.
    tasks: Annotated[tuple[TaskSummary, ...], MaxItems(_MANY)] = ()
    #: The election group (empty from a master that runs without one).
    masters: Annotated[tuple[MasterMember, ...], MaxItems(16)] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorKill(Message):
    """Kill a task as if its framework had asked; ``framework_id`` disambiguates a shared id."""

    NAME: ClassVar[str] = "OPERATOR_KILL"
    task_id: TaskID
    framework_id: FrameworkID | None = None


MESSAGES: tuple[type[Message], ...] = (GetState, StateReply, OperatorKill)
