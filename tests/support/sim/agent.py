"""A simulated agent: registers, answers pings, runs tasks on a timer, reports them reliably.

Status updates follow the Mesos status update manager: one stream per task, only the head
of a stream in flight, the head re-sent with doubling backoff until the master forwards the
framework's acknowledgement for exactly its uuid; every update carries ``latest_state``.

The agent detects that the master lost it by the pings stopping: after more than
``reregister_after_pings`` ping intervals without one it re-registers, reporting its tasks,
and retries until the master answers.

Choices the real agent core has to make as well:

* ``KillTask`` for a task the agent never heard of (its ``RunTask`` was lost) is answered
  with a reliable ``KILLED`` update (reason ``TASK_UNKNOWN``), so the task cannot stay in
  STAGING at the master forever.
* ``ShutdownFramework`` ends the framework's tasks and drops their update streams: the
  framework is gone and will never acknowledge them.
* ``RunTask``/``KillTask`` before the agent knows it is registered are ignored, as a Mesos
  agent does; on ``AgentReregistered`` every stream's head is re-sent at once, as Mesos's
  status update manager does when it resumes.
* With ``stuck_kill_probability``, the executor of a task with a custom executor swallows a
  ``KillTask`` now and then, as the MPI member executor did when a launcher outlived mpirun
  (issue #15): only a ``ShutdownExecutor`` (the framework pressing) ends such a task.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    AgentReregistered,
    AgentTask,
    ExecutorInfo,
    ExitedExecutor,
    FrameworkInfo,
    KillTask,
    Message,
    Ping,
    Pong,
    Reason,
    RegisterAgent,
    ReregisterAgent,
    RunTask,
    RunTaskGroup,
    ShutdownAgent,
    ShutdownExecutor,
    ShutdownFramework,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    TaskStatus,
    is_terminal,
)
from agora.sdk.resources import Resources

from support.sim.clock import EventQueue, Timer
from support.sim.network import MASTER, SimNetwork

__all__ = ["AgentConfig", "AgentTaskRecord", "SimAgent"]

TaskKey = tuple[FrameworkID, str]


@dataclass(slots=True)
class AgentConfig:
    ping_interval: float = 15.0
    reregister_after_pings: float = 3.0
    register_retry: float = 2.0
    update_retry_min: float = 10.0
    update_retry_max: float = 60.0
    start_delay: tuple[float, float] = (0.05, 0.5)
    duration: tuple[float, float] = (2.0, 40.0)
    fail_probability: float = 0.1
    #: How often the executor of a custom-executor task swallows a KILL_TASK (0: never).
    stuck_kill_probability: float = 0.0


@dataclass(slots=True)
class AgentTaskRecord:
    framework_id: FrameworkID
    task_id: str
    #: None for a tombstone: a task killed before this agent ever heard of it.
    info: TaskInfo | None
    executor_id: ExecutorID | None
    state: TaskState
    stream: deque[TaskStatus] = field(default_factory=deque)
    backoff: float = 0.0
    retry: Timer | None = None
    work: Timer | None = None


class SimAgent:
    def __init__(
        self,
        name: str,
        resources: Resources,
        queue: EventQueue,
        net: SimNetwork,
        rng: random.Random,
        config: AgentConfig,
    ) -> None:
        self.name = name
        self.total = resources
        self.queue = queue
        self.net = net
        self.rng = rng
        self.config = config
        self.agent_id: AgentID | None = None
        self.registered = False
        self.stopped = False
        self.last_ping = 0.0
        self.tasks: dict[TaskKey, AgentTaskRecord] = {}
        #: The agent's own final word on every task it ever ran (for end-of-run checks).
        self.truth: dict[TaskKey, TaskState] = {}
        self.executors: dict[tuple[FrameworkID, ExecutorID], tuple[ExecutorInfo, set[str]]] = {}
        self.framework_infos: dict[FrameworkID, FrameworkInfo] = {}
        self.shut_down_frameworks: set[FrameworkID] = set()
        #: The kill id of every KILL_TASK received, and how many an executor swallowed.
        self.kill_ids: list[str] = []
        self.kills_swallowed = 0
        self.reregistrations = 0
        self.ignored_before_registration = 0
        self.duplicate_runs: list[TaskKey] = []
        net.attach(name, self.receive)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._register()
        self.queue.later(self.config.ping_interval / 3, self._health, f"{self.name} health")

    def _info(self) -> AgentInfo:
        return AgentInfo(hostname=self.name, resources=self.total, agent_id=self.agent_id)

    def _send(self, message: Message) -> None:
        if not self.stopped:
            self.net.send(self.name, MASTER, message)

    def _register(self) -> None:
        if self.registered or self.stopped:
            return
        self._send(RegisterAgent(agent_info=self._info()))
        self.queue.later(self.config.register_retry, self._register, f"{self.name} register")

    def _health(self) -> None:
        if self.stopped:
            return
        now = self.queue.clock.now
        silent = now - self.last_ping
        if (
            self.agent_id is not None
            and silent > self.config.reregister_after_pings * self.config.ping_interval
        ):
            self._reregister()
        self.queue.later(self.config.ping_interval / 3, self._health, f"{self.name} health")

    def _reregister(self) -> None:
        assert self.agent_id is not None
        self.reregistrations += 1
        reported: list[AgentTask] = []
        for rec in self.tasks.values():
            if rec.info is None:
                continue
            reported.append(
                AgentTask(
                    task=rec.info,
                    framework_id=rec.framework_id,
                    state=rec.state,
                    status_uuid=rec.stream[0].uuid if rec.stream else None,
                )
            )
        executors = tuple(info for info, _tasks in self.executors.values())
        frameworks = tuple(
            self.framework_infos[f]
            for f in sorted({r.framework_id for r in self.tasks.values()})
            if f in self.framework_infos
        )
        self._send(
            ReregisterAgent(
                agent_id=self.agent_id,
                agent_info=self._info(),
                tasks=tuple(reported),
                executors=executors,
                frameworks=frameworks,
            )
        )

    # --- inbound -----------------------------------------------------------------------
    def receive(self, sender: str, message: Message, epoch: int) -> None:
        if self.stopped:
            return
        now = self.queue.clock.now
        if isinstance(message, Ping):
            self.last_ping = now
            self._send(Pong())
        elif isinstance(message, AgentRegistered):
            if self.agent_id is None:
                self.agent_id = message.agent_id
            assert message.agent_id == self.agent_id, (
                f"{self.name}: registered twice, as {self.agent_id} and {message.agent_id}"
            )
            self.registered = True
            self.last_ping = now
        elif isinstance(message, AgentReregistered):
            self.registered = True
            self.last_ping = now
            # As Mesos's status update manager resumes: re-send every stream's head now.
            for rec in self.tasks.values():
                if rec.stream:
                    rec.backoff = self.config.update_retry_min
                    self._send_head(rec)
        elif not self.registered and isinstance(message, (RunTask, RunTaskGroup, KillTask)):
            # Like a Mesos agent that is not (yet) registered: ignore work from the master.
            # The framework finds out by reconciling, or kills the task once we are registered.
            self.ignored_before_registration += 1
        elif isinstance(message, RunTask):
            self.framework_infos[message.framework_id] = message.framework_info
            executor = message.task.executor
            if executor is not None:
                self._add_executor(message.framework_id, executor, [message.task])
            self._run(
                message.framework_id, message.task, executor.executor_id if executor else None
            )
        elif isinstance(message, RunTaskGroup):
            self.framework_infos[message.framework_id] = message.framework_info
            tasks = list(message.task_group.tasks)
            self._add_executor(message.framework_id, message.executor, tasks)
            for task in tasks:
                self._run(message.framework_id, task, message.executor.executor_id)
        elif isinstance(message, KillTask):
            self.kill_ids.append(message.kill_id)
            rec = self.tasks.get((message.framework_id, str(message.task_id)))
            p = self.config.stuck_kill_probability
            if p and rec is not None and rec.executor_id is not None and self.rng.random() < p:
                # A stuck executor: the task neither ends nor answers until it is shut down.
                self.kills_swallowed += 1
                if rec.work is not None:
                    rec.work.cancel()
                    rec.work = None
                return
            self._kill(message.framework_id, str(message.task_id))
        elif isinstance(message, StatusUpdateAck):
            self._ack(message)
        elif isinstance(message, ShutdownFramework):
            self._shutdown_framework(message.framework_id)
        elif isinstance(message, ShutdownExecutor):
            entry = self.executors.get((message.framework_id, message.executor_id))
            if entry is not None:
                for task_id in sorted(entry[1]):
                    self._kill(message.framework_id, task_id)
        elif isinstance(message, ShutdownAgent):
            for fw in sorted({r.framework_id for r in self.tasks.values()}):
                self._shutdown_framework(fw)
            self.stopped = True
        # Anything else (FrameworkToExecutor, ...) has no executor to reach in this model.

    # --- tasks -------------------------------------------------------------------------
    def _add_executor(
        self, framework_id: FrameworkID, executor: ExecutorInfo, tasks: list[TaskInfo]
    ) -> None:
        key = (framework_id, executor.executor_id)
        entry = self.executors.setdefault(key, (executor, set()))
        entry[1].update(str(t.task_id) for t in tasks)

    def _run(
        self, framework_id: FrameworkID, task: TaskInfo, executor_id: ExecutorID | None
    ) -> None:
        key = (framework_id, str(task.task_id))
        if key in self.tasks or key in self.truth:
            self.duplicate_runs.append(key)
            return
        rec = AgentTaskRecord(framework_id, str(task.task_id), task, executor_id, TaskState.STAGING)
        self.tasks[key] = rec
        self.truth[key] = TaskState.STAGING
        rec.work = self.queue.later(
            self.rng.uniform(*self.config.start_delay),
            lambda: self._started(key),
            f"{self.name} start {key[1]}",
        )

    def _started(self, key: TaskKey) -> None:
        rec = self.tasks[key]
        self._update(rec, TaskState.RUNNING)
        rec.work = self.queue.later(
            self.rng.uniform(*self.config.duration),
            lambda: self._finished(key),
            f"{self.name} finish {key[1]}",
        )

    def _finished(self, key: TaskKey) -> None:
        rec = self.tasks[key]
        rec.work = None
        failed = self.rng.random() < self.config.fail_probability
        self._update(rec, TaskState.FAILED if failed else TaskState.FINISHED)

    def _kill(self, framework_id: FrameworkID, task_id: str) -> None:
        key = (framework_id, task_id)
        rec = self.tasks.get(key)
        if rec is None:
            if key in self.truth or framework_id in self.shut_down_frameworks:
                return  # already over and acknowledged: nothing runs
            # Never heard of it (its RunTask was lost): say so reliably, once.
            rec = AgentTaskRecord(framework_id, task_id, None, None, TaskState.STAGING)
            self.tasks[key] = rec
            self.truth[key] = TaskState.KILLED
            self._update(rec, TaskState.KILLED, Reason.TASK_UNKNOWN, StatusSource.AGENT)
            return
        if is_terminal(rec.state):
            return
        if rec.work is not None:
            rec.work.cancel()
            rec.work = None
        self._update(rec, TaskState.KILLED)

    def _update(
        self,
        rec: AgentTaskRecord,
        state: TaskState,
        reason: Reason | None = None,
        source: StatusSource = StatusSource.EXECUTOR,
    ) -> None:
        assert self.agent_id is not None
        rec.state = state
        if rec.info is not None:
            self.truth[(rec.framework_id, rec.task_id)] = state
        status = TaskStatus(
            task_id=rec.info.task_id if rec.info is not None else TaskID(rec.task_id),
            state=state,
            source=source,
            reason=reason,
            agent_id=self.agent_id,
            executor_id=rec.executor_id,
            uuid=self.rng.randbytes(16),
            timestamp=self.queue.clock.now,
        )
        rec.stream.append(status)
        if len(rec.stream) == 1:
            rec.backoff = self.config.update_retry_min
            self._send_head(rec)
        if is_terminal(state):
            self._task_ended(rec)

    def _send_head(self, rec: AgentTaskRecord) -> None:
        head = rec.stream[0]
        self._send(
            StatusUpdateMessage(
                update=StatusUpdate(
                    framework_id=rec.framework_id, status=head, latest_state=rec.state
                )
            )
        )
        if rec.retry is not None:
            rec.retry.cancel()
        uuid = head.uuid
        rec.retry = self.queue.later(
            rec.backoff, lambda: self._retry(rec, uuid), f"{self.name} retry {rec.task_id}"
        )

    def _retry(self, rec: AgentTaskRecord, uuid: bytes | None) -> None:
        if not rec.stream or rec.stream[0].uuid != uuid:
            return
        rec.backoff = min(rec.backoff * 2, self.config.update_retry_max)
        self._send_head(rec)

    def _ack(self, ack: StatusUpdateAck) -> None:
        key = (ack.framework_id, str(ack.task_id))
        rec = self.tasks.get(key)
        if rec is None or not rec.stream or rec.stream[0].uuid != ack.uuid:
            return  # a duplicate ack, or not for the head: ignored (Mesos does the same)
        rec.stream.popleft()
        if rec.retry is not None:
            rec.retry.cancel()
            rec.retry = None
        if rec.stream:
            rec.backoff = self.config.update_retry_min
            self._send_head(rec)
        elif is_terminal(rec.state):
            del self.tasks[key]

    def _task_ended(self, rec: AgentTaskRecord) -> None:
        if rec.executor_id is None:
            return
        ekey = (rec.framework_id, rec.executor_id)
        entry = self.executors.get(ekey)
        if entry is None:
            return
        entry[1].discard(rec.task_id)
        if not entry[1]:
            del self.executors[ekey]
            self._send(
                ExitedExecutor(framework_id=rec.framework_id, executor_id=rec.executor_id, status=0)
            )

    def _shutdown_framework(self, framework_id: FrameworkID) -> None:
        self.shut_down_frameworks.add(framework_id)
        for key in [k for k in self.tasks if k[0] == framework_id]:
            rec = self.tasks.pop(key)
            for timer in (rec.work, rec.retry):
                if timer is not None:
                    timer.cancel()
            if rec.info is not None and not is_terminal(rec.state):
                rec.state = TaskState.KILLED
                self.truth[key] = TaskState.KILLED
        for ekey in [k for k in self.executors if k[0] == framework_id]:
            del self.executors[ekey]

    # --- views for the invariants -----------------------------------------------------------
    def running(self) -> list[AgentTaskRecord]:
        return [r for r in self.tasks.values() if r.info is not None and not is_terminal(r.state)]

    def unacknowledged(self) -> int:
        return sum(len(r.stream) for r in self.tasks.values())
