"""Messages between agents and the master (some also flow from an agent to its executors)."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages._record import MaxItems, Message, Range, ShortStr, Uuid
from agora.sdk.messages.common import (
    MAX_BATCH_ITEMS,
    AgentInfo,
    AgentTask,
    ExecutorInfo,
    Features,
    FrameworkInfo,
    MasterInfo,
    PersistentVolume,
    StatusUpdate,
    TaskGroupInfo,
    TaskInfo,
)
from agora.sdk.messages.container import ContainerUsage
from agora.sdk.messages.enums import Reason
from agora.sdk.resources import Resources

__all__ = [
    "MESSAGES",
    "AgentRegistered",
    "AgentReregistered",
    "CheckpointResources",
    "ExecutorToFramework",
    "ExitedExecutor",
    "ExitedExecutorAck",
    "FrameworkToExecutor",
    "KillTask",
    "Ping",
    "Pong",
    "ReconcileTasks",
    "RegisterAgent",
    "ReregisterAgent",
    "RetryRegistration",
    "RunTask",
    "RunTaskGroup",
    "ShutdownAgent",
    "ShutdownExecutor",
    "ShutdownFramework",
    "StatusUpdateAck",
    "StatusUpdateAcks",
    "StatusUpdateMessage",
    "StatusUpdates",
    "UnregisterAgent",
]


class RegisterAgent(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "REGISTER_AGENT"
    agent_info: AgentInfo
    version: ShortStr = ""
    #: What this agent understands beyond the base protocol (see ``agora.sdk.messages.batching``).
    features: Features = ()
    #: The dynamic reservations it checkpointed (the last CHECKPOINT_RESOURCES): the master
    #: admits it with them applied to ``agent_info.resources`` (empty from an older agent).
    checkpointed_resources: Resources = msgspec.field(default_factory=Resources)
    #: The persistent volumes it keeps (the last CHECKPOINT_RESOURCES's ``volumes``).
    checkpointed_volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(4096)] = ()


class ReregisterAgent(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "REREGISTER_AGENT"
    agent_id: AgentID
    agent_info: AgentInfo
    tasks: tuple[AgentTask, ...] = ()
    executors: tuple[ExecutorInfo, ...] = ()
    frameworks: tuple[FrameworkInfo, ...] = ()
    features: Features = ()
    #: As in REGISTER_AGENT.
    checkpointed_resources: Resources = msgspec.field(default_factory=Resources)
    checkpointed_volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(4096)] = ()


class AgentRegistered(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "AGENT_REGISTERED"
    agent_id: AgentID
    master_info: MasterInfo


class AgentReregistered(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "AGENT_REREGISTERED"
    agent_id: AgentID
    master_info: MasterInfo


class RetryRegistration(Message, frozen=True, kw_only=True):
    """Master -> agent: the master has more registrations waiting than it answers promptly;
    send this (re-)registration again after ``retry_after`` seconds (the agent spreads it over
    up to twice that), instead of on its own backoff. Nothing about the agent changed."""

    NAME: ClassVar[str] = "RETRY_REGISTRATION"
    retry_after: Annotated[float, Range(0.0, 600.0)]


class CheckpointResources(Message, frozen=True, kw_only=True):
    """Master -> agent, after every change to the agent's dynamic reservations (RESERVE,
    UNRESERVE): all of them, reserved to their roles (not a delta). The agent checkpoints them
    and reports them when it (re-)registers, so that they survive its restart and a master
    failover (Mesos: CheckpointResourcesMessage). Its static reservations (``--resources``)
    are not in it."""

    NAME: ClassVar[str] = "CHECKPOINT_RESOURCES"
    resources: Resources = msgspec.field(default_factory=Resources)
    #: The agent's persistent volumes (all of them; each is ``volumes(role):{id}`` in
    #: ``resources``, its disk no longer there). The agent keeps a directory for each.
    volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(4096)] = ()


class Ping(Message, frozen=True, kw_only=True):
    """Master -> agent liveness probe; ``connected`` tells the agent whether the master knows it."""

    NAME: ClassVar[str] = "PING"
    connected: bool = True


class Pong(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "PONG"
    #: What the agent's containers used, sampled since the last PONG (may be empty).
    usage: Annotated[tuple[ContainerUsage, ...], MaxItems(100_000)] = ()


class RunTask(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RUN_TASK"
    framework_info: FrameworkInfo
    framework_id: FrameworkID
    task: TaskInfo
    #: The role the task's resources were offered to; the agent reports it back on re-registration.
    role: ShortStr = "*"


class RunTaskGroup(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "RUN_TASK_GROUP"
    framework_info: FrameworkInfo
    framework_id: FrameworkID
    executor: ExecutorInfo
    task_group: TaskGroupInfo
    role: ShortStr = "*"


class KillTask(Message, frozen=True, kw_only=True):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "KILL_TASK"
    framework_id: FrameworkID
    task_id: TaskID
    #: The id of the KILL this carries out, logged at every hop ("" from an older sender).
    kill_id: ShortStr = ""
    #: Master -> agent: the framework is partition-aware, so a task the agent never heard of
    #: (its RUN_TASK was lost) ends DROPPED rather than LOST (False from an older master).
    partition_aware: bool = False
    #: Why the master stops the task when it is not its framework's KILL (TASK_PREEMPTED,
    #: RESOURCES_REVOKED): the agent gives the task's KILLED update this reason.
    reason: Reason | None = None


class ReconcileTasks(Message, frozen=True, kw_only=True):
    """Master -> agent, after a re-registration from an agent the master kept active: tasks of
    one framework the master has on the agent that the agent did not report. Their RUN_TASK was
    sent while the agent was down (a quick restart) and never arrived, or crossed the
    re-registration on the way. The agent answers each it does not know on its status update
    stream, DROPPED for a partition-aware framework and LOST otherwise, reason TASK_UNKNOWN; a
    task it knows (its launch arrived meanwhile) needs no answer. (Mesos: ReconcileTasksMessage
    from reconcileKnownSlave.)"""

    NAME: ClassVar[str] = "RECONCILE_TASKS"
    framework_id: FrameworkID
    task_ids: tuple[TaskID, ...]
    partition_aware: bool = False


class ShutdownExecutor(Message, frozen=True, kw_only=True):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "SHUTDOWN_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID


class ShutdownFramework(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "SHUTDOWN_FRAMEWORK"
    framework_id: FrameworkID


class StatusUpdateMessage(Message, frozen=True, kw_only=True):
    """Agent -> master, and executor -> agent."""

    NAME: ClassVar[str] = "STATUS_UPDATE"
    update: StatusUpdate


class StatusUpdateAck(Message, frozen=True, kw_only=True):
    """Master -> agent, and agent -> executor."""

    NAME: ClassVar[str] = "STATUS_UPDATE_ACK"
    framework_id: FrameworkID
    task_id: TaskID
    uuid: Uuid
    agent_id: AgentID | None = None


class StatusUpdates(Message, frozen=True, kw_only=True):
    """Several STATUS_UPDATE messages in one, in order: agent -> a master announcing "batches"."""

    NAME: ClassVar[str] = "STATUS_UPDATES"
    updates: Annotated[tuple[StatusUpdate, ...], MaxItems(MAX_BATCH_ITEMS)]


class StatusUpdateAcks(Message, frozen=True, kw_only=True):
    """Several STATUS_UPDATE_ACK messages in one, in order: master -> an agent that registered
    with "batches"."""

    NAME: ClassVar[str] = "STATUS_UPDATE_ACKS"
    acks: Annotated[tuple[StatusUpdateAck, ...], MaxItems(MAX_BATCH_ITEMS)]


class FrameworkToExecutor(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "FRAMEWORK_TO_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    data: bytes


class ExecutorToFramework(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "EXECUTOR_TO_FRAMEWORK"
    framework_id: FrameworkID
    executor_id: ExecutorID
    data: bytes
    agent_id: AgentID | None = None


class ExitedExecutor(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "EXITED_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    status: int


class ExitedExecutorAck(Message, frozen=True, kw_only=True):
    """Master -> agent: EXITED_EXECUTOR arrived; the agent stops sending it again."""

    NAME: ClassVar[str] = "EXITED_EXECUTOR_ACK"
    framework_id: FrameworkID
    executor_id: ExecutorID


class UnregisterAgent(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "UNREGISTER_AGENT"
    agent_id: AgentID


class ShutdownAgent(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "SHUTDOWN_AGENT"
    message: str = ""


MESSAGES: tuple[type[Message], ...] = (
    RegisterAgent,
    ReregisterAgent,
    AgentRegistered,
    AgentReregistered,
    RetryRegistration,
    CheckpointResources,
    Ping,
    Pong,
    RunTask,
    RunTaskGroup,
    KillTask,
    ReconcileTasks,
    ShutdownExecutor,
    ShutdownFramework,
    StatusUpdateMessage,
    StatusUpdateAck,
    StatusUpdates,
    StatusUpdateAcks,
    FrameworkToExecutor,
    ExecutorToFramework,
    ExitedExecutor,
    ExitedExecutorAck,
    UnregisterAgent,
    ShutdownAgent,
)
