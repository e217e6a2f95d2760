"""The agent's state: registration, frameworks, executors, tasks, update streams, the outbox.

Handlers in the sibling modules mutate one ``AgentState`` and append actions to its outbox;
``Agent`` (agent.py) drains the outbox after every stimulus. Nothing here reads a clock,
draws a random number or touches a socket.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agora.agent.core.actions import Action, ResizeExecutor, ToExecutor, ToMaster
from agora.agent.core.config import AgentConfig
from agora.agent.core.status_updates import StatusUpdateManager, is_final
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    ExecutorInfo,
    FrameworkInfo,
    MasterInfo,
    Message,
    PersistentVolume,
    Reason,
    StatusSource,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources

if TYPE_CHECKING:
    from agora.agent.core.exits import PendingExit

__all__ = [
    "COMMAND_EXECUTOR_ID",
    "AgentState",
    "Executor",
    "ExecutorKey",
    "ExecutorState",
    "Framework",
    "QueuedLaunch",
    "Task",
    "TaskKey",
    "is_final",
]

TaskKey = tuple[FrameworkID, TaskID]
ExecutorKey = tuple[FrameworkID, ExecutorID]

#: The executor id of the built-in command executor (one per framework on an agent).
COMMAND_EXECUTOR_ID = ExecutorID("agora-command")

_UUID_NAMESPACE = uuid.UUID("5d1c7f0e-6f3a-4c51-9a53-61676f726121")


class ExecutorState(enum.Enum):
    #: LaunchExecutor sent; waiting for its REGISTER_EXECUTOR.
    LAUNCHING = "LAUNCHING"
    #: Registered: ``peer`` reaches it.
    RUNNING = "RUNNING"
    #: Told to shut down, or killed; waiting for the shell to report its exit.
    TERMINATING = "TERMINATING"
    #: Found alive by recovery after an agent restart: waiting for its REREGISTER_EXECUTOR (or
    #: REGISTER_EXECUTOR, if it had not registered before the restart). Never checkpointed as
    #: such: its record keeps the state it had before the restart (``recovered_from``).
    RECOVERING = "RECOVERING"


@dataclass(frozen=True, slots=True)
class QueuedLaunch:
    """Tasks waiting for their executor to register: one task, or one task group."""

    task_ids: tuple[TaskID, ...]
    group: bool
    #: Arrival order among the agent's launches (names its checkpoint record).
    seq: int = 0


@dataclass(slots=True)
class Executor:
    framework_id: FrameworkID
    executor_id: ExecutorID
    info: ExecutorInfo
    builtin: bool
    state: ExecutorState
    launched_at: float
    peer: str | None = None
    #: Launches to hand over when the executor registers, in arrival order.
    queued: list[QueuedLaunch] = field(default_factory=list)
    #: Tasks of this executor still in the agent's state (queued, launched, or final and not
    #: yet acknowledged) ...
    tasks: set[TaskID] = field(default_factory=set)
    #: ... and those of them that are not final.
    live: set[TaskID] = field(default_factory=set)
    #: Launches that arrived while this executor was terminating: they go to a fresh executor
    #: with the same id once this one has exited.
    successor: list[QueuedLaunch] = field(default_factory=list)
    #: The master or the framework asked for the shutdown: its tasks end KILLED, not FAILED.
    shutdown_requested: bool = False
    #: When to SIGKILL it if it is still alive (None: no escalation pending).
    kill_at: float | None = None
    #: Built-in executor only: since when it has had nothing to run.
    idle_since: float | None = None
    #: RECOVERING only: the state the checkpoint held for it.
    recovered_from: ExecutorState | None = None
    #: Why its tasks end when it exits, if not the usual EXECUTOR_TERMINATED (recovery kills).
    exit_reason: Reason | None = None
    exit_message: str = ""
    #: RECOVERING only: kills of launched tasks, sent once it re-registers.
    pending_kills: list[TaskID] = field(default_factory=list)
    #: The secret it was launched with (AGORA_EXECUTOR_SECRET): its REGISTER/REREGISTER_EXECUTOR
    #: must carry it (see executor_auth.py). "": recovered from a checkpoint written before
    #: executors had secrets. Never in a repr, so never in a log.
    secret: str = field(default="", repr=False)

    @property
    def key(self) -> ExecutorKey:
        return (self.framework_id, self.executor_id)

    @property
    def sandbox(self) -> str:
        return f"frameworks/{self.framework_id}/executors/{self.executor_id}"


@dataclass(slots=True)
class Task:
    framework_id: FrameworkID
    info: TaskInfo
    executor_id: ExecutorID
    #: The role of the offer the task's resources came from (reported on re-registration).
    role: str
    #: The newest state the agent knows (its own or the executor's latest update).
    state: TaskState = TaskState.STAGING
    #: Handed to its executor (LaunchTask / LaunchTaskGroup sent).
    launched: bool = False
    #: The id of the latest kill handed to its executor (None: not killed). Not checkpointed:
    #: sent again if the executor re-registers (it may have reconnected and missed it).
    kill_id: str | None = None
    #: A limit of its container was exceeded (e.g. its disk) and it is being killed for it:
    #: the reason and message its final update gets, whatever state the executor reports.
    limitation: tuple[Reason, str] | None = None
    #: The master killed it for a reason of its own (TASK_PREEMPTED, RESOURCES_REVOKED, from
    #: KILL_TASK): the reason its KILLED update gets when the executor gives none.
    kill_reason: Reason | None = None
    #: The GPUs (indices) it holds, assigned when it is handed to its executor and given back
    #: when it is over (see gpus.py).
    gpus: tuple[int, ...] = ()

    @property
    def key(self) -> TaskKey:
        return (self.framework_id, self.info.task_id)


@dataclass(slots=True)
class Framework:
    framework_id: FrameworkID
    info: FrameworkInfo
    #: SHUTDOWN_FRAMEWORK received: its updates are no longer forwarded, no new work accepted.
    terminating: bool = False
    executors: set[ExecutorID] = field(default_factory=set)
    tasks: set[TaskID] = field(default_factory=set)


@dataclass(slots=True)
class AgentState:
    config: AgentConfig
    updates: StatusUpdateManager
    agent_id: AgentID | None = None
    #: The master answered our latest (re-)registration and has not been lost since.
    registered: bool = False
    #: SHUTDOWN_AGENT received: the core ignores everything from now on.
    terminated: bool = False
    #: Highest master epoch seen; messages from older epochs are dropped.
    master_epoch: int = 0
    #: Epoch of the master that accepted our registration.
    registered_epoch: int = 0
    master_info: MasterInfo | None = None
    last_ping_at: float = 0.0
    #: When to send the next (re-)registration; None while registered.
    next_registration_at: float | None = 0.0
    registration_backoff: float = 0.0
    registration_attempts: int = 0
    frameworks: dict[FrameworkID, Framework] = field(default_factory=dict)
    executors: dict[ExecutorKey, Executor] = field(default_factory=dict)
    executors_by_peer: dict[str, ExecutorKey] = field(default_factory=dict)
    tasks: dict[TaskKey, Task] = field(default_factory=dict)
    #: EXITED_EXECUTORs not acknowledged by the master yet (see exits.py).
    exits: dict[ExecutorKey, PendingExit] = field(default_factory=dict)
    outbox: list[Action] = field(default_factory=list)
    #: Durable records changed since the last checkpoint (see checkpoint.py); the update
    #: streams' own changes are tracked by ``updates``.
    dirty_agent: bool = False
    #: The dynamic reservations the master asked us to keep (reservations.py), and whether
    #: they changed since the last checkpoint.
    checkpointed_resources: Resources = field(default_factory=Resources)
    #: The persistent volumes the master asked us to keep, each a directory (reservations.py).
    checkpointed_volumes: tuple[PersistentVolume, ...] = ()
    dirty_resources: bool = False
    dirty_frameworks: set[FrameworkID] = field(default_factory=set)
    dirty_executors: set[ExecutorKey] = field(default_factory=set)
    dirty_tasks: set[TaskKey] = field(default_factory=set)
    #: The launch records last checkpointed per executor (waiting launches are records of
    #: their own, so that a long queue is not rewritten with every task that joins it).
    saved_launches: dict[ExecutorKey, set[str]] = field(default_factory=dict)
    launch_seq: int = 0
    #: Mixed into minted uuids so that an agent recovered from a checkpoint never repeats one.
    uuid_salt: str = ""
    #: Where executor secrets come from (the core's only randomness, injected like the clock).
    new_secret: Callable[[], str] = field(default=lambda: "", repr=False)
    _serial: int = 0

    # --- identity ----------------------------------------------------------------------
    @property
    def agent_info(self) -> AgentInfo:
        c = self.config
        return AgentInfo(
            hostname=c.hostname,
            resources=c.resources,
            attributes=dict(c.attributes),
            port=c.port,
            http_port=c.http_port,
            address=c.address,
            agent_id=self.agent_id,
        )

    # --- sending -----------------------------------------------------------------------
    def to_master(self, message: Message) -> None:
        self.outbox.append(ToMaster(message))

    def to_executor(self, peer: str, message: Message) -> None:
        self.outbox.append(ToExecutor(peer, message))

    def flush_updates(self) -> None:
        """Move the status-update manager's forwards into the outbox, in order."""
        for message in self.updates.take():
            self.outbox.append(ToMaster(message))

    # --- status updates ----------------------------------------------------------------
    def mint_uuid(self, framework_id: FrameworkID, task_id: TaskID, now: float) -> bytes:
        """A fresh 16-byte uuid for an update the agent generates, derived (no randomness)
        from the agent id, the task, a counter and the time."""
        self._serial += 1
        name = f"{self.agent_id}/{self.uuid_salt}/{framework_id}/{task_id}/{self._serial}/{now!r}"
        return uuid.uuid5(_UUID_NAMESPACE, name).bytes

    def agent_status(
        self,
        framework_id: FrameworkID,
        task_id: TaskID,
        state: TaskState,
        reason: Reason,
        now: float,
        *,
        executor_id: ExecutorID | None = None,
        message: str = "",
    ) -> TaskStatus:
        """A status the agent itself generates (source AGENT, fresh uuid)."""
        return TaskStatus(
            task_id=task_id,
            state=state,
            source=StatusSource.AGENT,
            reason=reason,
            message=message,
            agent_id=self.agent_id,
            executor_id=executor_id,
            uuid=self.mint_uuid(framework_id, task_id, now),
            timestamp=now,
        )

    def report(self, framework_id: FrameworkID, status: TaskStatus, now: float) -> bool:
        """Take a status (with uuid and agent id) into the task's update stream and the task's
        state. Updates of a terminating framework are not forwarded (the master forgot it); its
        tasks leave the state as soon as they are final. False if the update was ignored."""
        key = (framework_id, status.task_id)
        task = self.tasks.get(key)
        fw = self.frameworks.get(framework_id)
        if fw is not None and fw.terminating:
            if task is None or is_final(task.state):
                return False
        else:
            accepted = self.updates.update(framework_id, status, now)
            self.flush_updates()
            if not accepted or task is None:
                return accepted
        task.state = status.state
        self.dirty_tasks.add(key)
        if is_final(status.state):
            task.gpus = ()  # over: its GPUs are free again
            self._task_ended(task, now)
            if fw is not None and fw.terminating:
                self.forget_task(key)
        return True

    def _task_ended(self, task: Task, now: float) -> None:
        ex = self.executors.get((task.framework_id, task.executor_id))
        if ex is None or task.info.task_id not in ex.live:
            return
        ex.live.discard(task.info.task_id)
        if ex.builtin and not ex.live and not ex.queued:
            ex.idle_since = now
        if ex.state is not ExecutorState.TERMINATING:
            self.resize(ex)

    # --- executor containers -----------------------------------------------------------
    def executor_size(self, ex: Executor) -> Resources:
        """What a container of the executor's own holds: its resources and its live tasks'."""
        total = ex.info.resources
        for task_id in sorted(ex.live):
            task = self.tasks.get((ex.framework_id, task_id))
            if task is not None:
                total = total + task.info.resources
        return total

    def resize(self, ex: Executor) -> None:
        """A custom executor's live tasks changed: its container's new size, for the shell."""
        if not ex.builtin:
            size = self.executor_size(ex)
            self.outbox.append(ResizeExecutor(ex.framework_id, ex.executor_id, size))

    # --- bookkeeping -------------------------------------------------------------------
    def touch(self, item: Executor | Framework | Task) -> None:
        """``item`` changed in a way the checkpoint must hold."""
        if isinstance(item, Executor):
            self.dirty_executors.add(item.key)
        elif isinstance(item, Task):
            self.dirty_tasks.add(item.key)
        else:
            self.dirty_frameworks.add(item.framework_id)

    def add_task(self, task: Task) -> None:
        self.tasks[task.key] = task
        self.dirty_tasks.add(task.key)
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.tasks.add(task.info.task_id)
        ex = self.executors.get((task.framework_id, task.executor_id))
        # A task never joins a terminating executor: it waits for the next one.
        if ex is not None and ex.state is not ExecutorState.TERMINATING:
            ex.tasks.add(task.info.task_id)
            if not is_final(task.state):
                ex.live.add(task.info.task_id)
                ex.idle_since = None

    def forget_task(self, key: TaskKey) -> None:
        """The task leaves the agent (its final update was acknowledged, or nobody will)."""
        task = self.tasks.pop(key, None)
        if task is None:
            return
        self.dirty_tasks.add(key)
        ex = self.executors.get((task.framework_id, task.executor_id))
        if ex is not None:
            ex.tasks.discard(task.info.task_id)
            ex.live.discard(task.info.task_id)
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.tasks.discard(task.info.task_id)
            self.gc_framework(fw.framework_id)

    def gc_framework(self, framework_id: FrameworkID) -> None:
        """Forget a framework with no executor and no task left on this agent."""
        fw = self.frameworks.get(framework_id)
        if fw is not None and not fw.executors and not fw.tasks:
            del self.frameworks[framework_id]
            self.dirty_frameworks.add(framework_id)
