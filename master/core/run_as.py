"""Who may run tasks as whom: the ACL's ``[run_as]`` rule (Mesos's ``run_tasks`` ACL), pure.

The master checks each task of an ACCEPT against the policy of its framework's principal. A
task's effective user is its command's user (its executor's, for a task on a custom executor),
else its framework's ``user``, else the principal's default user from the ACL. A task whose
effective user the principal may not run as, or that has none at all, ends TASK_ERROR with
reason TASK_UNAUTHORIZED; the other tasks of the ACCEPT are not affected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agora.sdk.messages import ExecutorInfo, TaskInfo

__all__ = ["ANY", "RunAsPolicy", "effective_users"]

#: In a list: any user; as a principal key: the rule for principals not listed.
ANY = "*"


@dataclass(frozen=True, slots=True)
class RunAsPolicy:
    """``users``: principal -> the Unix users its tasks may run as (``"*"``: any user), the
    ``"*"`` key applying to principals not listed; a principal matching no key may run as
    nobody. ``defaults``: principal (or ``"*"``) -> the user of tasks that name none.

    A None principal (CURVE off) matches only the ``"*"`` keys."""

    users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)

    def _key(self, table: Mapping[str, object], principal: str | None) -> str | None:
        if principal is not None and principal in table:
            return principal
        return ANY if ANY in table else None

    def allowed(self, principal: str | None) -> tuple[str, ...]:
        key = self._key(self.users, principal)
        return self.users[key] if key is not None else ()

    def default_user(self, principal: str | None) -> str | None:
        """The user for a task and framework that name none: the ``defaults`` entry, else the
        principal's first allowed user unless that is ``"*"``; None when there is neither."""
        key = self._key(self.defaults, principal)
        if key is not None:
            return self.defaults[key]
        allowed = self.allowed(principal)
        return allowed[0] if allowed and allowed[0] != ANY else None

    def problem(self, principal: str | None, user: str | None) -> str | None:
        """Why ``principal`` may not run a task as ``user`` (None: it may). A None user is one
        no task, framework or default names: never allowed, so nothing runs as whoever the agent
        happens to be."""
        who = "no principal (CURVE off)" if principal is None else f"principal {principal!r}"
        if user is None:
            return (
                f"ACL run_as: the task names no user, nor does its framework, and the ACL has no "
                f"default_user for {who}"
            )
        allowed = self.allowed(principal)
        if ANY in allowed or user in allowed:
            return None
        listed = ", ".join(repr(u) for u in allowed) if allowed else "none"
        return f"ACL run_as: {who} may not run tasks as user {user!r} (allowed: {listed})"


def effective_users(
    task: TaskInfo, executor: ExecutorInfo | None, fallback: str | None
) -> tuple[str | None, ...]:
    """Whom ``task`` runs as: its custom executor's user (if it has one) and its command's user,
    each falling back on ``fallback`` (the framework's user, else the principal's default)."""
    runner = executor or task.executor
    runner_user = (runner.command.user or fallback) if runner is not None else fallback
    users: list[str | None] = []
    if runner is not None:
        users.append(runner_user)
    if task.command is not None:
        users.append(task.command.user or runner_user)
    return tuple(dict.fromkeys(users)) or (fallback,)
