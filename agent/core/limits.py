"""Limits the agent enforces itself: the decisions of the ``disk/du`` isolator.

In the manner of Mesos's ``disk/du`` isolator: every ``--container-disk-watermark-interval`` the
shell measures the sandbox of every running container (:func:`disk_targets` says which) and
feeds the sizes to ``Agent.disk_usage``; :func:`enforce_disk` decides. A command task's container
is its task sandbox (``<executor sandbox>/tasks/<task id>``), limited by the task's ``disk``; a
custom executor's container is its whole sandbox, limited by the ``disk`` of the executor and of
its live tasks. A container without ``disk`` is measured (for the usage report) but not limited.

Over the limit, a command task is killed through the usual kill path (KILL_TASK to its executor)
and its final update, whatever the executor reports, becomes TASK_FAILED with reason
CONTAINER_LIMITATION_DISK and a message with the usage and the limit; a custom executor is shut
down and its tasks end the same way. Pure: sizes in, kills out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agora.agent.core.executors import shutdown_executor
from agora.agent.core.state import AgentState, Executor, ExecutorState, Task, is_final
from agora.agent.core.tasks import on_kill_task
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import KillTask, Reason
from agora.sdk.resources import Resources

__all__ = [
    "MIB",
    "DiskKey",
    "DiskTarget",
    "disk_limit_bytes",
    "disk_message",
    "disk_targets",
    "enforce_disk",
    "limit_executor",
    "limit_task",
]

#: A ``disk`` resource is in MB of 2^20 bytes, as in Mesos.
MIB = 1 << 20

#: A container measured by the disk isolator: (framework, executor, task or None for a custom
#: executor's own container).
DiskKey = tuple[FrameworkID, ExecutorID, TaskID | None]

_MEASURED = (ExecutorState.RUNNING, ExecutorState.RECOVERING)


@dataclass(frozen=True, slots=True)
class DiskTarget:
    """One container's sandbox to measure, relative to the work dir, and its limit."""

    framework_id: FrameworkID
    executor_id: ExecutorID
    task_id: TaskID | None
    sandbox: str
    #: 0: no ``disk`` resource, measured but not limited.
    limit_bytes: int

    @property
    def key(self) -> DiskKey:
        return (self.framework_id, self.executor_id, self.task_id)


def disk_limit_bytes(resources: Resources) -> int:
    return int(resources.scalar("disk") * MIB)


def disk_message(used: int, limit: int) -> str:
    return f"Disk usage ({_mb(used)}) exceeds quota ({_mb(limit)})"


def _mb(size: int) -> str:
    return f"{size / MIB:.1f} MB"


def disk_targets(st: AgentState) -> list[DiskTarget]:
    """The containers to measure now: launched live command tasks, and custom executors, of
    running (or recovering) executors; none already being killed for a limit."""
    targets: list[DiskTarget] = []
    for ex in st.executors.values():
        if ex.state not in _MEASURED:
            continue
        if ex.builtin:
            for tid in sorted(ex.live):
                task = st.tasks.get((ex.framework_id, tid))
                if task is None or not task.launched or task.limitation is not None:
                    continue
                targets.append(
                    DiskTarget(
                        ex.framework_id,
                        ex.executor_id,
                        tid,
                        f"{ex.sandbox}/tasks/{tid}",
                        disk_limit_bytes(task.info.resources),
                    )
                )
        elif ex.exit_reason is None:
            limit = disk_limit_bytes(ex.info.resources)
            for tid in sorted(ex.live):
                task = st.tasks.get((ex.framework_id, tid))
                if task is not None:
                    limit += disk_limit_bytes(task.info.resources)
            targets.append(DiskTarget(ex.framework_id, ex.executor_id, None, ex.sandbox, limit))
    return targets


def enforce_disk(st: AgentState, used: Mapping[DiskKey, int], now: float) -> list[DiskTarget]:
    """Kill every container whose measured size is over its limit; returns those killed.
    Sizes of containers that are no longer targets (ended meanwhile) are ignored."""
    over = []
    for target in disk_targets(st):
        size = used.get(target.key)
        if size is None or target.limit_bytes <= 0 or size <= target.limit_bytes:
            continue
        message = disk_message(size, target.limit_bytes)
        if target.task_id is not None:
            task = st.tasks[(target.framework_id, target.task_id)]
            limit_task(st, task, Reason.CONTAINER_LIMITATION_DISK, message, now)
        else:
            ex = st.executors[(target.framework_id, target.executor_id)]
            limit_executor(st, ex, Reason.CONTAINER_LIMITATION_DISK, message, now)
        over.append(target)
    return over


def limit_task(st: AgentState, task: Task, reason: Reason, message: str, now: float) -> None:
    """Kill a task for exceeding a limit: it ends TASK_FAILED with ``reason`` and ``message``."""
    if is_final(task.state) or task.limitation is not None:
        return
    task.limitation = (reason, message)
    st.touch(task)
    on_kill_task(st, KillTask(framework_id=task.framework_id, task_id=task.info.task_id), now)


def limit_executor(st: AgentState, ex: Executor, reason: Reason, message: str, now: float) -> None:
    """Shut down a custom executor for exceeding a limit: its tasks end TASK_FAILED with
    ``reason`` and ``message``, whatever it reports for them."""
    if ex.exit_reason is not None:
        return
    ex.exit_reason, ex.exit_message = reason, message
    for tid in sorted(ex.live):
        task = st.tasks.get((ex.framework_id, tid))
        if task is not None and task.limitation is None:
            task.limitation = (reason, message)
            st.touch(task)
    shutdown_executor(st, ex, now, requested=False)
