"""Messages between agents and the master (some also flow from an agent to its executors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages._record import MaxItems, Message, ShortStr, Uuid
from agora.sdk.messages.common import (
    AgentInfo,
    AgentTask,
    ExecutorInfo,
    FrameworkInfo,
    MasterInfo,
    StatusUpdate,
    TaskGroupInfo,
    TaskInfo,
)
from agora.sdk.messages.container import ContainerUsage

__all__ = [
    "MESSAGES",
    "AgentRegistered",
    "AgentReregistered",
    "ExecutorToFramework",
    "ExitedExecutor",
    "FrameworkToExecutor",
    "KillTask",
    "Ping",
    "Pong",
    "RegisterAgent",
    "ReregisterAgent",
    "RunTask",
    "RunTaskGroup",
    "ShutdownAgent",
    "ShutdownExecutor",
    "ShutdownFramework",
    "StatusUpdateAck",
    "StatusUpdateMessage",
    "UnregisterAgent",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterAgent(Message):
    NAME: ClassVar[str] = "REGISTER_AGENT"
    agent_info: AgentInfo
    version: ShortStr = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReregisterAgent(Message):
    NAME: ClassVar[str] = "REREGISTER_AGENT"
    agent_id: AgentID
    agent_info: AgentInfo
    tasks: tuple[AgentTask, ...] = ()
    executors: tuple[ExecutorInfo, ...] = ()
    frameworks: tuple[FrameworkInfo, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentRegistered(Message):
    NAME: ClassVar[str] = "AGENT_REGISTERED"
    agent_id: AgentID
    master_info: MasterInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentReregistered(Message):
    NAME: ClassVar[str] = "AGENT_REREGISTERED"
    agent_id: AgentID
    master_info: MasterInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    """Master -> agent liveness probe; ``connected`` tells the agent whether the master knows it."""

    NAME: ClassVar[str] = "PING"
    connected: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    NAME: ClassVar[str] = "PONG"
    #: What the agent's containers used, sampled since the last PONG (may be empty).
    usage: Annotated[tuple[ContainerUsage, ...], MaxItems(100_000)] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTask(Message):
    NAME: ClassVar[str] = "RUN_TASK"
    framework_info: FrameworkInfo
    framework_id: FrameworkID
    task: TaskInfo
    #: The role the task's resources were offered to; the agent reports it back on re-registration.
    role: ShortStr = "*"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTaskGroup(Message):
    NAME: ClassVar[str] = "RUN_TASK_GROUP"
    framework_info: FrameworkInfo
    framework_id: FrameworkID
    executor: ExecutorInfo
    task_group: TaskGroupInfo
    role: ShortStr = "*"


@dataclass(frozen=True, slots=True, kw_only=True)
class KillTask(Message):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "KILL_TASK"
    framework_id: FrameworkID
    task_id: TaskID
    #: The id of the KILL this carries out, logged at every hop ("" from an older sender).
    kill_id: ShortStr = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownExecutor(Message):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "SHUTDOWN_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownFramework(Message):
    NAME: ClassVar[str] = "SHUTDOWN_FRAMEWORK"
    framework_id: FrameworkID


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusUpdateMessage(Message):
    """Agent -> master, and executor -> agent."""

    NAME: ClassVar[str] = "STATUS_UPDATE"
    update: StatusUpdate


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusUpdateAck(Message):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "STATUS_UPDATE_ACK"
    framework_id: FrameworkID
    task_id: TaskID
    uuid: Uuid
    agent_id: AgentID | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkToExecutor(Message):
    NAME: ClassVar[str] = "FRAMEWORK_TO_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorToFramework(Message):
    NAME: ClassVar[str] = "EXECUTOR_TO_FRAMEWORK"
    framework_id: FrameworkID
    executor_id: ExecutorID
    data: bytes
    agent_id: AgentID | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitedExecutor(Message):
    NAME: ClassVar[str] = "EXITED_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    status: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterAgent(Message):
    NAME: ClassVar[str] = "UNREGISTER_AGENT"
    agent_id: AgentID


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownAgent(Message):
    NAME: ClassVar[str] = "SHUTDOWN_AGENT"
    message: str = ""


MESSAGES: tuple[type[Message], ...] = (
    RegisterAgent,
    ReregisterAgent,
    AgentRegistered,
    AgentReregistered,
    Ping,
    Pong,
    RunTask,
    RunTaskGroup,
    KillTask,
    ShutdownExecutor,
    ShutdownFramework,
    StatusUpdateMessage,
    StatusUpdateAck,
    FrameworkToExecutor,
    ExecutorToFramework,
    ExitedExecutor,
    UnregisterAgent,
    ShutdownAgent,
)
