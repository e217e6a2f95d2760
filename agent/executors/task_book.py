"""What the command executor knows of its tasks, and the status updates it sends about them.

One :class:`TaskEntry` per task from its launch to its terminal update (sent once, and then the
task is forgotten); the members of a task group fail together, whether they could not start or
cannot run; a default executor stops once it has no task left."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import structlog
from agora.agent.containers.cgroups import Totals
from agora.agent.executors.task_process import RunAs
from agora.sdk.executor import ExecutorDriver
from agora.sdk.ids import TaskID
from agora.sdk.messages import Reason, StatusSource, TaskInfo, TaskState, TaskStatus

if TYPE_CHECKING:
    from agora.agent.executors.health import HealthChecker

__all__ = ["LAUNCH_FAILED", "TaskBook", "TaskEntry", "TaskGroup"]

log = structlog.get_logger(__name__)

#: The reason of a task that could not be started.
LAUNCH_FAILED: Final = Reason.CONTAINER_LAUNCH_FAILED


@dataclass(eq=False, slots=True)
class TaskEntry:
    """What the executor knows of one of its tasks."""

    info: TaskInfo
    group: TaskGroup | None = None
    run_as: RunAs | None = None
    #: Fetching its URIs (before the spawn).
    preparing: asyncio.Task[None] | None = None
    health: HealthChecker | None = None
    healthy: bool | None = None
    #: Why the executor itself killed it (health, group failure), for its terminal update.
    kill_reason: tuple[Reason, str] | None = None
    #: ``preparing`` is its container's launch (not a fetch): a kill waits for its end.
    launching: bool = False
    #: A kill came while it was launching: it is killed (with its grace) once started.
    kill_pending: bool = False
    started: bool = False
    done: bool = False


@dataclass(eq=False, slots=True)
class TaskGroup:
    """The tasks of a task group (launched, and failing, together)."""

    tasks: list[TaskEntry] = field(default_factory=list)
    failed: bool = False


class TaskBook:
    """The executor's tasks by id, and its status updates (through ``driver``, set once the
    executor has one). ``exit_when_idle``: it is a task group's default executor, which stops
    once its tasks are over."""

    def __init__(self, exit_when_idle: bool) -> None:
        self.driver: ExecutorDriver | None = None
        self.tasks: dict[TaskID, TaskEntry] = {}
        self._exit_when_idle = exit_when_idle

    def fail_before_start(
        self,
        entries: list[TaskEntry],
        culprit: TaskEntry,
        error: str,
        reason: Reason,
        *,
        spawned: list[TaskEntry] | None = None,
    ) -> None:
        """``culprit`` could not start: it fails, and so does the rest of its group (the ones
        already spawned end when their processes exit, killed)."""
        self.end(culprit, TaskState.FAILED, error, reason=reason)
        for entry in entries:
            if entry is culprit or entry.done or (spawned and entry in spawned):
                continue
            self.end(
                entry,
                TaskState.FAILED,
                f"Task {culprit.info.task_id} of the group could not start: {error}",
                reason=Reason.TASK_GROUP_MEMBER_FAILED,
            )

    def fail_group_launch(self, group: TaskGroup, problems: dict[TaskID, str | None]) -> None:
        bad = next(tid for tid, problem in problems.items() if problem)
        for member in group.tasks:
            problem = problems[member.info.task_id]
            if problem:
                self.update(member.info.task_id, TaskState.FAILED, problem, reason=LAUNCH_FAILED)
            else:
                self.update(
                    member.info.task_id,
                    TaskState.FAILED,
                    f"Task {bad} of the group cannot run: {problems[bad]}",
                    reason=Reason.TASK_GROUP_MEMBER_FAILED,
                )
        self.stop_if_idle()

    def stop_if_idle(self) -> None:
        """A default executor's work is over once its group is: stop (the driver returns once
        the agent has acknowledged every update)."""
        if self._exit_when_idle and not self.tasks and self.driver is not None:
            log.info("default_executor_done")
            self.driver.stop()

    def end(
        self,
        entry: TaskEntry,
        state: TaskState,
        message: str,
        *,
        exit_code: int | None = None,
        reason: Reason | None = None,
        totals: Totals | None = None,
    ) -> None:
        """The task's terminal update; the executor forgets it."""
        if entry.done:
            return
        entry.done = True
        if entry.health is not None:
            entry.health.stop()
            entry.health = None
        self.tasks.pop(entry.info.task_id, None)
        self.update(
            entry.info.task_id,
            state,
            message,
            exit_code=exit_code,
            reason=reason,
            healthy=entry.healthy,
            totals=totals,
        )
        self.stop_if_idle()

    def update(
        self,
        task_id: TaskID,
        state: TaskState,
        message: str = "",
        exit_code: int | None = None,
        *,
        reason: Reason | None = None,
        healthy: bool | None = None,
        totals: Totals | None = None,
    ) -> None:
        assert self.driver is not None
        self.driver.send_status_update(
            TaskStatus(
                task_id=task_id,
                state=state,
                source=StatusSource.EXECUTOR,
                message=message,
                exit_code=exit_code,
                reason=reason,
                healthy=healthy,
                cpu_seconds=None if totals is None else totals.cpu_seconds,
                max_rss_bytes=None if totals is None else totals.max_rss_bytes,
            )
        )
