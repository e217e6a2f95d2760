"""Running counts of the master's tasks by state, kept as tasks come, change state and go, so
the views that report them (``/metrics``, ``/state/summary``, the console's partial state) cost
the same at 100 tasks as at 100,000. :class:`~agora.master.core.state.MasterState` keeps one and
moves every count itself (``add_task``, ``set_task_state``, ``forget_task``, ``keep_completed``);
the simulation checks it against a recount after every step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from agora.sdk.messages import TaskState

__all__ = ["TaskTally"]


class _Counted(Protocol):
    @property
    def state(self) -> TaskState: ...


@dataclass(slots=True)
class TaskTally:
    """Tasks by state: ``live`` (the master's current tasks) and ``done`` (the bounded histories
    of completed tasks, of frameworks and of removed frameworks)."""

    live: Counter[TaskState] = field(default_factory=Counter)
    done: Counter[TaskState] = field(default_factory=Counter)

    def by_state(self) -> dict[str, int]:
        """Every state's count, live and completed together (zero for none)."""
        live, done = self.live, self.done
        return {state.value: live[state] + done[state] for state in TaskState}

    def total(self) -> int:
        return sum(self.live.values()) + sum(self.done.values())

    def forget_done(self, tasks: Iterable[_Counted]) -> None:
        """``tasks`` left the completed histories."""
        for task in tasks:
            self.done[task.state] -= 1
