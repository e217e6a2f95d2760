"""A running task's health check, run as the task runs (in its container, as its user, with its
environment), and what its verdicts do: a RUNNING update with ``healthy`` set when the task's
health changes, a kill (reason TASK_HEALTH_CHECK_STATUS_UPDATED) once it has failed too often."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog
from agora.agent.executors.health import HealthChecker
from agora.agent.executors.task_book import TaskBook, TaskEntry
from agora.sdk.ids import TaskID
from agora.sdk.messages import Reason, TaskState

__all__ = ["watch_health"]

log = structlog.get_logger(__name__)


def watch_health(
    entry: TaskEntry,
    book: TaskBook,
    *,
    sandbox: str,
    env: Mapping[str, str],
    command_prefix: Sequence[str],
    kill: Callable[[TaskID], object],
) -> None:
    """Start checking the health of ``entry``'s task, if it has a check (its checker is
    ``entry.health``, stopped with the task's terminal update); ``kill`` kills the task."""
    check = entry.info.health_check
    if check is None:
        return
    task_id = entry.info.task_id

    def changed(healthy: bool) -> None:
        if entry.done or entry.healthy is healthy:
            return
        entry.healthy = healthy
        book.update(
            task_id,
            TaskState.RUNNING,
            "healthy" if healthy else "unhealthy",
            reason=Reason.TASK_HEALTH_CHECK_STATUS_UPDATED,
            healthy=healthy,
        )

    def unhealthy(why: str) -> None:
        if entry.done:
            return
        entry.healthy = False
        entry.kill_reason = (Reason.TASK_HEALTH_CHECK_STATUS_UPDATED, why)
        log.info("task_unhealthy", task_id=task_id, why=why)
        kill(task_id)

    entry.health = HealthChecker(
        check,
        sandbox=sandbox,
        env=env,
        on_change=changed,
        on_unhealthy=unhealthy,
        command_prefix=command_prefix,
        user=entry.run_as,
    )
    entry.health.start()
