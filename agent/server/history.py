"""What an agent writes to the fault suite's history (``--history``; see
``agora.sdk.daemon.history``).

Only what the checker needs: the highest master epoch as it rises, each task it accepts to run
(with the epoch of the master that asked), each status update it sends (by uuid), each task's end
(when its state in the agent turns final, not when that update leaves) and what it offers.
Reading the core's state after each stimulus keeps the core free of any knowledge of histories.
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.agent.core import Task
from agora.sdk.daemon.history import History
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    Message,
    RunTask,
    RunTaskGroup,
    StatusUpdateMessage,
    is_terminal,
)
from agora.sdk.resources import Resources

__all__ = ["AgentHistory"]


class AgentHistory:
    def __init__(self, history: History, resources: Resources) -> None:
        self._history = history
        self._resources = resources
        self._epoch = 0
        #: Tasks launched and not yet seen final in the agent's own state.
        self._live: set[tuple[FrameworkID, TaskID]] = set()

    @property
    def enabled(self) -> bool:
        return self._history.enabled

    def from_master(self, message: Message, epoch: int, newest_before: int) -> None:
        """A message the core was given; ``newest_before``: its highest epoch before it."""
        history = self._history
        if epoch < newest_before:
            return  # the core drops it: nothing happens
        if epoch > self._epoch:
            self._epoch = epoch
            history.record("epoch", epoch=epoch)
        if isinstance(message, AgentRegistered | AgentReregistered):
            history.record("total", resources=self._resources.to_text())
        elif isinstance(message, RunTask):
            self._launch(message.framework_id, message.task.task_id, message.task.resources, epoch)
        elif isinstance(message, RunTaskGroup):
            for task in message.task_group.tasks:
                self._launch(message.framework_id, task.task_id, task.resources, epoch)

    def _launch(
        self, framework_id: FrameworkID, task_id: TaskID, resources: Resources, epoch: int
    ) -> None:
        self._live.add((framework_id, task_id))
        self._history.record(
            "launch",
            task=task_id,
            framework=framework_id,
            epoch=epoch,
            resources=resources.to_text(),
        )

    def to_master(self, message: Message) -> None:
        if not isinstance(message, StatusUpdateMessage):
            return
        update = message.update
        status = update.status
        if status.uuid is None:
            return
        self._history.record(
            "update",
            task=status.task_id,
            framework=update.framework_id,
            uuid=status.uuid.hex(),
            state=status.state.value,
        )

    def recovered(self, tasks: Mapping[tuple[FrameworkID, TaskID], Task]) -> None:
        """After a restart: the tasks taken back from the checkpoint were launched (and their
        launch recorded) by the agent's previous run; their end is recorded here when it comes
        (again, harmlessly, for one that had ended before the restart)."""
        self._live.update(tasks)

    def settled(self, tasks: Mapping[tuple[FrameworkID, TaskID], Task]) -> None:
        """After each stimulus: a task whose state in the agent turned final has ended *now*,
        which may be well before its final update leaves (updates go one at a time, each
        acknowledged before the next)."""
        for key in [k for k in self._live if k not in tasks or is_terminal(tasks[k].state)]:
            self._live.discard(key)
            task = tasks.get(key)
            state = task.state.value if task is not None else "GONE"
            self._history.record("end", task=key[1], framework=key[0], state=state)
