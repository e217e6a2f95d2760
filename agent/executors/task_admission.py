"""Whether the command executor can run a task, and as whom: a command to run, a task id that can
name a sandbox directory, a user it may switch to, the container and health check it asks for.
Nothing is started here; the only I/O is looking users up in the password database."""

from __future__ import annotations

import os
import pwd
from typing import TYPE_CHECKING, Final

from agora.agent.executors.health import health_check_problem
from agora.agent.executors.task_process import RunAs
from agora.sdk.messages import HealthCheckKind, TaskInfo

if TYPE_CHECKING:
    from agora.agent.executors.containment import TaskContainers

__all__ = ["TaskAdmission"]

_BAD_TASK_IDS: Final = frozenset({"", ".", ".."})


class TaskAdmission:
    """The executor's rules for its tasks. ``default_user``: whom a command naming no user runs
    as; ``switch_user`` False: every task runs as this executor's user."""

    def __init__(self, default_user: str | None, switch_user: bool) -> None:
        self._default_user = default_user
        self._switch_user = switch_user
        #: This executor's user name (looked up on first use).
        self._user: str | None = None

    def admit(
        self, task: TaskInfo, containers: TaskContainers | None
    ) -> tuple[str | None, RunAs | None]:
        """Why ``task`` cannot run here (None: it can), and whom to run it as."""
        problem, run_as = self.check(task)
        if problem is None and containers is not None:
            problem = containers.problem(task)
        if problem is None and task.health_check is not None:
            problem = health_check_problem(task.health_check)
            isolated = task.container is not None and task.container.network_isolation
            if (
                problem is None
                and isolated
                and task.health_check.kind is not HealthCheckKind.COMMAND
            ):
                problem = (
                    "HTTP and TCP health checks cannot reach a network-isolated task yet: "
                    "use a COMMAND check (it runs inside the task's container)"
                )
        return problem, run_as

    def check(self, task: TaskInfo) -> tuple[str | None, RunAs | None]:
        """Why ``task``'s command cannot run (None: it can), and whom to run it as."""
        task_id = task.task_id
        if task_id in _BAD_TASK_IDS or "/" in task_id or "\0" in task_id:
            return f"Task id {task_id!r} cannot name a sandbox directory", None
        command = task.command
        if command is None:
            return "The task has no command (the command executor runs command tasks)", None
        if command.shell and not command.value:
            return "The task's command has no value to run through the shell", None
        if not command.shell and not command.argv:
            return "The task's command has no argv", None
        wanted = (command.user or self._default_user) if self._switch_user else None
        if wanted is None:
            return None, None
        if self._user is None:
            self._user = pwd.getpwuid(os.geteuid()).pw_name
        if wanted == self._user:
            return None, None
        if os.geteuid() != 0:
            return (
                f"Cannot run the command as user {wanted!r}: the command executor runs as "
                f"{self._user!r}, not root",
                None,
            )
        try:
            entry = pwd.getpwnam(wanted)
        except KeyError:
            return f"Cannot run the command as user {wanted!r}: no such user", None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return None, RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)
