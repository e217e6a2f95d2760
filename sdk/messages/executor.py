"""Messages between an agent and its executors.

KILL_TASK, SHUTDOWN_EXECUTOR, STATUS_UPDATE, STATUS_UPDATE_ACK and FRAMEWORK_TO_EXECUTOR also flow
on this link; they are defined once, in ``agent.py``.
"""

from __future__ import annotations

from typing import ClassVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID
from agora.sdk.messages._record import Message, ShortStr
from agora.sdk.messages.common import (
    AgentInfo,
    ExecutorInfo,
    FrameworkInfo,
    StatusUpdate,
    TaskGroupInfo,
    TaskInfo,
)

__all__ = [
    "MESSAGES",
    "ExecutorRegistered",
    "ExecutorReregistered",
    "LaunchTask",
    "LaunchTaskGroup",
    "RegisterExecutor",
    "ReregisterExecutor",
]


class RegisterExecutor(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "REGISTER_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    #: The per-executor secret the agent gave the process (AGORA_EXECUTOR_SECRET): the agent
    #: refuses a registration without the right one.
    secret: ShortStr = ""


class ExecutorRegistered(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "EXECUTOR_REGISTERED"
    executor_info: ExecutorInfo
    framework_id: FrameworkID
    framework_info: FrameworkInfo
    agent_id: AgentID
    agent_info: AgentInfo


class ReregisterExecutor(Message, frozen=True, kw_only=True):
    """A reconnecting executor re-sends its unacknowledged tasks and updates."""

    NAME: ClassVar[str] = "REREGISTER_EXECUTOR"
    framework_id: FrameworkID
    executor_id: ExecutorID
    tasks: tuple[TaskInfo, ...] = ()
    updates: tuple[StatusUpdate, ...] = ()
    #: As in REGISTER_EXECUTOR: without the right secret, the agent changes nothing.
    secret: ShortStr = ""


class ExecutorReregistered(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "EXECUTOR_REREGISTERED"
    agent_id: AgentID
    agent_info: AgentInfo


class LaunchTask(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "LAUNCH_TASK"
    framework_id: FrameworkID
    task: TaskInfo


class LaunchTaskGroup(Message, frozen=True, kw_only=True):
    """The LAUNCH_GROUP message (the class name avoids clashing with the LaunchGroup operation)."""

    NAME: ClassVar[str] = "LAUNCH_GROUP"
    framework_id: FrameworkID
    executor: ExecutorInfo
    task_group: TaskGroupInfo


MESSAGES: tuple[type[Message], ...] = (
    RegisterExecutor,
    ExecutorRegistered,
    ReregisterExecutor,
    ExecutorReregistered,
    LaunchTask,
    LaunchTaskGroup,
)
