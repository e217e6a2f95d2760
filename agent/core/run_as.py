"""Whom the agent runs a task as, and whether it may (defence in depth behind the master's ACL).

In the manner of Mesos's ``--switch_user`` and ``--[no-]root_submissions``: with switch-user on
(the default) a task runs as its command's user, else its custom executor's, else its framework's,
else the agent's ``--default-task-user``, else the agent's own user. With switch-user off every
task runs as the agent's own user. A task whose user is root (by name, or any name with uid 0)
is refused unless ``--allow-root-tasks``: nothing runs as root, the agent's own identity
included, by accident. Pure: the daemon fills in its own user and the names of uid 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from agora.sdk.messages import ExecutorInfo, TaskInfo

__all__ = ["TaskUsers"]


@dataclass(frozen=True, slots=True)
class TaskUsers:
    switch_user: bool = True
    allow_root_tasks: bool = False
    #: The user of a task and framework that name none ("": the agent's own user).
    default_task_user: str = ""
    #: The agent's own user name ("": unknown, taken as not root).
    agent_user: str = ""
    #: User names with uid 0 on this host.
    root_users: frozenset[str] = frozenset({"root"})

    def fallback(self, framework_user: str) -> str:
        """The user of a task and executor that name none ("": the agent's own)."""
        return framework_user or self.default_task_user

    def users_of(
        self, task: TaskInfo, executor: ExecutorInfo | None, framework_user: str
    ) -> tuple[str, ...]:
        """Every user ``task`` would run as here: its custom executor's and its command's."""
        if not self.switch_user:
            return (self.agent_user,)
        fallback = self.fallback(framework_user) or self.agent_user
        runner = executor or task.executor
        runner_user = (runner.command.user or fallback) if runner is not None else fallback
        users: list[str] = [runner_user] if runner is not None else []
        if task.command is not None:
            users.append(task.command.user or runner_user)
        return tuple(dict.fromkeys(users)) or (fallback,)

    def problem(
        self, task: TaskInfo, executor: ExecutorInfo | None, framework_user: str
    ) -> str | None:
        """Why the agent refuses to run ``task`` (None: it runs it)."""
        if self.allow_root_tasks:
            return None
        for user in self.users_of(task, executor, framework_user):
            if user in self.root_users:
                how = "" if self.switch_user else " (--no-switch-user: tasks run as the agent's)"
                return (
                    f"task {task.task_id} would run as root user {user!r}{how}; the agent "
                    "refuses root tasks without --allow-root-tasks"
                )
        return None
