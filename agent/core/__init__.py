"""The agent's state machine: stimuli in (``from_master``, ``from_executor``, ``tick``, ...),
actions out. Pure: no I/O, no clock, no randomness but the injected executor-secret source.
See ``agent.py`` for the shell's contract."""

from agora.agent.core.actions import (
    Action,
    CreateVolume,
    DestroyVolume,
    ExecutorRefused,
    GpusUnavailable,
    LaunchExecutor,
    LinkVolumes,
    ResizeExecutor,
    SignalExecutor,
    Terminate,
    ToExecutor,
    ToMaster,
)
from agora.agent.core.agent import Agent
from agora.agent.core.checkpoint import CheckpointError, Delete, Put
from agora.agent.core.config import AgentConfig
from agora.agent.core.executors import (
    LAUNCH_FAILED_STATUS,
    UNKNOWN_EXIT_STATUS,
    command_executor_info,
)
from agora.agent.core.state import (
    COMMAND_EXECUTOR_ID,
    AgentState,
    Executor,
    ExecutorKey,
    ExecutorState,
    Framework,
    Task,
    TaskKey,
)
from agora.agent.core.status_updates import StatusUpdateManager, is_final

__all__ = [
    "COMMAND_EXECUTOR_ID",
    "LAUNCH_FAILED_STATUS",
    "UNKNOWN_EXIT_STATUS",
    "Action",
    "Agent",
    "AgentConfig",
    "AgentState",
    "CheckpointError",
    "CreateVolume",
    "Delete",
    "DestroyVolume",
    "Executor",
    "ExecutorKey",
    "ExecutorRefused",
    "ExecutorState",
    "Framework",
    "GpusUnavailable",
    "LaunchExecutor",
    "LinkVolumes",
    "Put",
    "ResizeExecutor",
    "SignalExecutor",
    "StatusUpdateManager",
    "Task",
    "TaskKey",
    "Terminate",
    "ToExecutor",
    "ToMaster",
    "command_executor_info",
    "is_final",
]
