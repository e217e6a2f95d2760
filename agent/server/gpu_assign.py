"""GPU assignment on the agent: each command task that asks for ``gpus`` gets exactly that many
physical GPUs, named to it in CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (a task asking for
none sees none). Assignments are made when the agent hands a task to its executor, released when
the task's terminal update leaves for the master, and kept in ``<work-dir>/gpus.json`` so that a
restarted agent knows which GPUs are taken.
"""

from __future__ import annotations

import json
import math
import os

import structlog
from agora.agent.containers.gpus import GpuAllocator, GpuError, visible_devices_env
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    LaunchTask,
    LaunchTaskGroup,
    Message,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskInfo,
    is_terminal,
)
from msgspec.structs import replace

__all__ = ["GpuAssignments"]

log = structlog.get_logger(__name__)


class GpuAssignments:
    def __init__(self, allocator: GpuAllocator, path: str) -> None:
        self._allocator = allocator
        self._path = path
        self._owners: dict[str, list[int]] = {}
        self._load()

    @staticmethod
    def _owner(framework_id: FrameworkID, task_id: TaskID) -> str:
        return f"{framework_id}/{task_id}"

    def outgoing(self, message: Message) -> Message:
        """A message about to go to an executor: tasks in it get their GPUs' variables."""
        if isinstance(message, LaunchTask):
            return replace(message, task=self._assign(message.framework_id, message.task))
        if isinstance(message, LaunchTaskGroup):
            tasks = tuple(self._assign(message.framework_id, t) for t in message.task_group.tasks)
            return replace(message, task_group=TaskGroupInfo(tasks=tasks))
        return message

    def to_master(self, message: Message) -> None:
        """A message about to go to the master: a terminal update frees the task's GPUs."""
        if isinstance(message, StatusUpdateMessage) and is_terminal(message.update.status.state):
            owner = self._owner(message.update.framework_id, message.update.status.task_id)
            if owner in self._owners:
                self._allocator.release(owner)
                del self._owners[owner]
                self._save()

    def _assign(self, framework_id: FrameworkID, task: TaskInfo) -> TaskInfo:
        if task.command is None:
            return task
        owner = self._owner(framework_id, task.task_id)
        held = self._allocator.held(owner)
        if not held:
            count = math.ceil(task.resources.scalar("gpus") - 1e-9)
            if count > 0:
                try:
                    held = self._allocator.allocate(owner, count)
                except GpuError as exc:
                    log.error("gpu_assignment_failed", task_id=task.task_id, error=str(exc))
                    held = ()
                else:
                    self._owners[owner] = [g.index for g in held]
                    self._save()
        env = dict(task.command.environment)
        env.update(visible_devices_env(held))
        return replace(task, command=replace(task.command, environment=env))

    def _load(self) -> None:
        try:
            with open(self._path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("gpu_assignments_unreadable", path=self._path, error=str(exc))
            return
        for owner, indices in dict(saved).items():
            try:
                self._allocator.restore(str(owner), [int(i) for i in indices])
            except (GpuError, TypeError, ValueError) as exc:
                log.warning("gpu_assignment_not_restored", owner=owner, error=str(exc))
                continue
            self._owners[str(owner)] = [int(i) for i in indices]

    def _save(self) -> None:
        tmp = f"{self._path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self._owners, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
