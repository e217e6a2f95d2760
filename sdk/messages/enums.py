"""Enumerations carried on the wire; each member's value is its name, which the codec sends."""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "TERMINAL_STATES",
    "ErrorCode",
    "FrameworkCapability",
    "Placement",
    "Reason",
    "StatusSource",
    "TaskState",
    "is_final",
    "is_terminal",
]


@enum.unique
class TaskState(enum.Enum):
    STAGING = "STAGING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    KILLING = "KILLING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    ERROR = "ERROR"
    LOST = "LOST"
    DROPPED = "DROPPED"
    UNREACHABLE = "UNREACHABLE"
    GONE = "GONE"
    GONE_BY_OPERATOR = "GONE_BY_OPERATOR"
    UNKNOWN = "UNKNOWN"


# LOST is deliberately absent: it is "not always" terminal (the task may come back RUNNING when its
# agent re-registers); the master decides case by case.
TERMINAL_STATES: Final[frozenset[TaskState]] = frozenset(
    {
        TaskState.FINISHED,
        TaskState.FAILED,
        TaskState.KILLED,
        TaskState.ERROR,
        TaskState.DROPPED,
        TaskState.GONE,
    }
)


# The values, for the checks below: a str's hash is cached, an Enum member's is computed in
# Python on every lookup (these run several times per task an agent reports).
_TERMINAL_VALUES: Final[frozenset[str]] = frozenset(s._value_ for s in TERMINAL_STATES)
_FINAL_VALUES: Final[frozenset[str]] = _TERMINAL_VALUES | {TaskState.LOST._value_}


def is_terminal(state: TaskState) -> bool:
    """True for states a task never leaves (see TERMINAL_STATES; LOST is not one)."""
    return state._value_ in _TERMINAL_VALUES


def is_final(state: TaskState) -> bool:
    """True for states after which the task no longer runs where it was: the terminal ones,
    and LOST as an agent reports it (Mesos's ``isTerminalState``). A master that calls a task
    LOST because its agent is out of reach cannot know that, so the master core treats its own
    LOST apart; everything else asks this one function."""
    return state._value_ in _FINAL_VALUES


@enum.unique
class StatusSource(enum.Enum):
    MASTER = "MASTER"
    AGENT = "AGENT"
    EXECUTOR = "EXECUTOR"


@enum.unique
class Reason(enum.Enum):
    AGENT_DISCONNECTED = "AGENT_DISCONNECTED"
    AGENT_REMOVED = "AGENT_REMOVED"
    AGENT_REMOVED_BY_OPERATOR = "AGENT_REMOVED_BY_OPERATOR"
    AGENT_RESTARTED = "AGENT_RESTARTED"
    AGENT_UNKNOWN = "AGENT_UNKNOWN"
    AGENT_REREGISTERED = "AGENT_REREGISTERED"
    EXECUTOR_REGISTRATION_TIMEOUT = "EXECUTOR_REGISTRATION_TIMEOUT"
    EXECUTOR_REREGISTRATION_TIMEOUT = "EXECUTOR_REREGISTRATION_TIMEOUT"
    EXECUTOR_TERMINATED = "EXECUTOR_TERMINATED"
    EXECUTOR_UNREGISTERED = "EXECUTOR_UNREGISTERED"
    FRAMEWORK_REMOVED = "FRAMEWORK_REMOVED"
    CONTAINER_LAUNCH_FAILED = "CONTAINER_LAUNCH_FAILED"
    CONTAINER_LIMITATION = "CONTAINER_LIMITATION"
    CONTAINER_LIMITATION_MEMORY = "CONTAINER_LIMITATION_MEMORY"
    CONTAINER_LIMITATION_DISK = "CONTAINER_LIMITATION_DISK"
    CONTAINER_PREEMPTED = "CONTAINER_PREEMPTED"
    FETCHER_FAILED = "FETCHER_FAILED"
    INVALID_OFFERS = "INVALID_OFFERS"
    RECONCILIATION = "RECONCILIATION"
    TASK_INVALID = "TASK_INVALID"
    TASK_UNAUTHORIZED = "TASK_UNAUTHORIZED"
    TASK_UNKNOWN = "TASK_UNKNOWN"
    TASK_KILLED_DURING_LAUNCH = "TASK_KILLED_DURING_LAUNCH"
    TASK_HEALTH_CHECK_STATUS_UPDATED = "TASK_HEALTH_CHECK_STATUS_UPDATED"
    TASK_GROUP_MEMBER_FAILED = "TASK_GROUP_MEMBER_FAILED"
    COMMAND_EXECUTOR_FAILED = "COMMAND_EXECUTOR_FAILED"
    MAX_COMPLETED_TASKS = "MAX_COMPLETED_TASKS"
    GANG_INCOMPLETE = "GANG_INCOMPLETE"
    TIMEOUT = "TIMEOUT"
    #: Killed by the master to give a role below its guarantee what it is owed.
    TASK_PREEMPTED = "TASK_PREEMPTED"
    #: Killed by the master because the revocable resources it ran on were taken back.
    RESOURCES_REVOKED = "RESOURCES_REVOKED"
    #: Killed by the master: still running on a draining agent at the drain's deadline.
    AGENT_DRAINING = "AGENT_DRAINING"


@enum.unique
class FrameworkCapability(enum.Enum):
    PARTITION_AWARE = "PARTITION_AWARE"
    TASK_KILLING_STATE = "TASK_KILLING_STATE"
    MULTI_ROLE = "MULTI_ROLE"
    GANG = "GANG"
    #: Offered resources lent from another role's unused guarantee (``Offer.revocable``); a
    #: task on them is the first to be stopped when the owner reclaims them.
    REVOCABLE_RESOURCES = "REVOCABLE_RESOURCES"


@enum.unique
class Placement(enum.Enum):
    """Where the slots of a gang may land: one per agent, as few agents as possible, or anywhere."""

    DISTINCT = "DISTINCT"
    PACK = "PACK"
    ANY = "ANY"


@enum.unique
class ErrorCode(enum.Enum):
    BAD_REQUEST = "BAD_REQUEST"
    NOT_SUBSCRIBED = "NOT_SUBSCRIBED"
    FORBIDDEN = "FORBIDDEN"
    NOT_LEADER = "NOT_LEADER"
    UNKNOWN_FRAMEWORK = "UNKNOWN_FRAMEWORK"
    UNKNOWN_OFFER = "UNKNOWN_OFFER"
    UNKNOWN_AGENT = "UNKNOWN_AGENT"
    UNKNOWN_TASK = "UNKNOWN_TASK"
    FRAMEWORK_REMOVED = "FRAMEWORK_REMOVED"
    AGENT_REMOVED = "AGENT_REMOVED"
    INTERNAL = "INTERNAL"
