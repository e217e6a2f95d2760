"""A task's terminal state, reason and message from how its process ended: its exit status, the
kill that ended it (and whether the grace ran out), a container limit it hit, or the executor's
own reason to kill it (a failed health check, a failed member of its group). Pure."""

from __future__ import annotations

from agora.agent.executors.outcome import exit_message, kill_message
from agora.agent.executors.task_process import TaskProcess
from agora.sdk.messages import Reason, TaskState

__all__ = ["terminal_state"]


def terminal_state(
    process: TaskProcess,
    limitation: tuple[Reason, str] | None,
    kill_reason: tuple[Reason, str] | None,
) -> tuple[TaskState, Reason | None, str]:
    """The terminal update of the task whose (reaped) ``process`` this is. ``limitation``: the
    container limit that ended it; ``kill_reason``: why the executor itself killed it."""
    reason: Reason | None = None
    if process.killed:
        message = kill_message(process.returncode, process.grace, process.escalated)
    else:
        message = exit_message(process.returncode)
    if limitation is not None:
        state = TaskState.FAILED
        reason, message = limitation
    elif kill_reason is not None:
        state = TaskState.KILLED if process.killed else TaskState.FAILED
        reason, why = kill_reason
        message = f"{why} ({message})"
    elif process.killed:
        state = TaskState.KILLED
    elif process.exit_code == 0:
        state = TaskState.FINISHED
    else:
        state = TaskState.FAILED
    return state, reason, message
