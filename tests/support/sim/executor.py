"""A simulated executor process: the real executor core (``agora.sdk.executor.core``) with
simulated tasks behind it.

The agent core's ``LaunchExecutor`` becomes one of these. It registers over the host's local
bus with the secret the agent put in its environment, and performs what its
:class:`~agora.sdk.executor.core.ExecutorCore` returns, as the SDK's asyncio driver does:
``Send`` goes to the agent, ``Invoke`` runs the executor's callbacks below, ``Shutdown`` kills
what runs and exits. Registration is retried every ``register_retry`` seconds while the core
says there is something to send (the real driver's tenacity backoff, made deterministic).

An executor of the framework's own exits once all its tasks are over and acknowledged; the
built-in one waits for the agent to shut it down when idle. The tasks are the only made-up
part: each starts after a random delay, runs a random time and ends FINISHED or FAILED; a
KILL_TASK ends it KILLED. With ``stuck_kill_probability`` an executor of the framework's own
swallows a kill now and then, as the MPI member executor once did (only a shutdown ends such a
task). The executor outlives an agent restart: the core waits out its recovery timeout for the
agent to come back, and the executor then
re-registers with its unacknowledged updates, or gives up and exits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agora.sdk.executor.core import ExecutorCore, Invoke, Send, Shutdown
from agora.sdk.executor.environment import ExecutorEnvironment
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import Message, StatusSource, TaskInfo, TaskState, TaskStatus
from agora.sdk.resources import Resources

from support.sim.clock import EventQueue, Timer
from support.sim.network import SimNetwork

__all__ = ["ExecutorBehaviour", "SimExecutor", "SimTask"]

#: The agent's name on a host's local bus.
AGENT = "agent"


@dataclass(slots=True)
class ExecutorBehaviour:
    start_delay: tuple[float, float] = (0.05, 0.5)
    duration: tuple[float, float] = (2.0, 40.0)
    fail_probability: float = 0.1
    #: How often an executor of the framework's own swallows a KILL_TASK (0: never).
    stuck_kill_probability: float = 0.0
    register_retry: float = 1.0
    #: An executor shutting down exits once its updates are acknowledged, or after this long.
    exit_grace: float = 2.0


@dataclass(slots=True)
class SimTask:
    info: TaskInfo
    state: TaskState = TaskState.STAGING
    work: Timer | None = None


class SimExecutor:
    """One executor process on a simulated host (see the module docstring)."""

    def __init__(
        self,
        *,
        framework_id: FrameworkID,
        executor_id: ExecutorID,
        builtin: bool,
        environment: dict[str, str],
        bus: SimNetwork,
        peer: str,
        queue: EventQueue,
        rng: random.Random,
        behaviour: ExecutorBehaviour,
        clock: Callable[[], float],
        on_exit: Callable[[SimExecutor, int], None],
        uuids: Callable[[], bytes],
    ) -> None:
        self.framework_id = framework_id
        self.executor_id = executor_id
        self.builtin = builtin
        self.peer = peer
        self.bus = bus
        self.queue = queue
        self.rng = rng
        self.behaviour = behaviour
        self.now = clock
        self._on_exit = on_exit
        self._uuids = uuids
        env = ExecutorEnvironment(
            agent_endpoint="sim",
            framework_id=framework_id,
            executor_id=executor_id,
            sandbox=f"/sim/{framework_id}/{executor_id}",
            agent_id=AgentID(environment["AGORA_AGENT_ID"]),
            shutdown_grace_period=float(environment.get("AGORA_SHUTDOWN_GRACE_PERIOD", "5")),
            recovery_timeout=15 * 60.0,
            secret=environment.get("AGORA_EXECUTOR_SECRET", ""),
        )
        self.core = ExecutorCore(env)
        self.tasks: dict[TaskID, SimTask] = {}
        #: Every task's last state as this executor ended it (the host's record of the truth).
        self.ended: dict[TaskID, TaskState] = {}
        self.kills_swallowed = 0
        self.alive = True
        self.linked = False
        #: The incarnation of the agent that started it (its parent, which alone learns its
        #: exit status).
        self.parent = 0
        self._register_serial = 0
        self._exiting = False
        bus.attach(peer, self.receive)

    # --- process life ------------------------------------------------------------------
    def start(self) -> None:
        self._perform(self.core.start(self.now()))
        self.link_up()
        self.queue.later(30.0, self._tick, f"{self.peer} tick")

    def link_up(self) -> None:
        """The agent's socket is there (at start, and when a restarted agent binds again)."""
        if not self.alive:
            return
        self.linked = True
        self._perform(self.core.connected())
        self._register_serial += 1
        self._register(self._register_serial)

    def link_down(self) -> None:
        """The agent died: its socket is gone."""
        if not self.alive:
            return
        self.linked = False
        self._perform(self.core.disconnected(self.now()))

    def _register(self, serial: int) -> None:
        if not self.alive or not self.linked or serial != self._register_serial:
            return
        message = self.core.registration()
        if message is None:
            return
        self._send(message)
        self.queue.later(
            self.behaviour.register_retry, lambda: self._register(serial), f"{self.peer} register"
        )

    def _tick(self) -> None:
        if self.alive:
            self._perform(self.core.tick(self.now()))
            self.queue.later(30.0, self._tick, f"{self.peer} tick")

    def killed(self) -> None:
        """SIGKILL: gone at once, nothing more sent."""
        self._exit(-9)

    def terminated(self) -> None:
        """SIGTERM: the SDK driver treats it as a shutdown request."""
        if self.alive:
            self._perform(self.core.shutdown(0))

    def _exit(self, status: int) -> None:
        if not self.alive:
            return
        self.alive = False
        self.core.stop()
        for task in self.tasks.values():
            if task.work is not None:
                task.work.cancel()
        self.bus.detach(self.peer)
        self._on_exit(self, status)

    # --- the agent's messages -------------------------------------------------------------
    def receive(self, _sender: str, message: Message, _epoch: int) -> None:
        if self.alive:
            self._perform(self.core.handle(message))
            self._exit_when_done()

    def _exit_when_done(self) -> None:
        """An executor of the framework's own ends once every task it ran is over and
        acknowledged, as the default executor and the MPI member do; the built-in one waits
        for the agent to shut it down when idle."""
        if (
            not self.builtin
            and self.tasks
            and not self._exiting
            and self.core.all_acknowledged
            and all(t.state in _OVER for t in self.tasks.values())
        ):
            self._exit(0)

    def _send(self, message: Message) -> None:
        if self.alive and self.linked:
            self.bus.send(self.peer, AGENT, message)

    def _perform(self, actions: list[object]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.message)
            elif isinstance(action, Invoke):
                self._invoke(action.callback, action.args)
            elif isinstance(action, Shutdown):
                self._shutdown(action.code)

    def _invoke(self, callback: str, args: tuple[Any, ...]) -> None:
        if callback == "launch_task":
            self._launch(args[0])
        elif callback == "launch_task_group":
            for info in args[1].tasks:
                self._launch(info)
        elif callback == "kill_task":
            self._kill(args[0])
        # registered, reregistered, disconnected, framework_message, error: nothing to do

    # --- tasks -------------------------------------------------------------------------
    def _launch(self, info: TaskInfo) -> None:
        if info.task_id in self.tasks or self._exiting:
            return
        task = SimTask(info)
        self.tasks[info.task_id] = task
        task.work = self.queue.later(
            self.rng.uniform(*self.behaviour.start_delay),
            lambda: self._running(task),
            f"{self.peer} start {info.task_id}",
        )

    def _running(self, task: SimTask) -> None:
        self._update(task, TaskState.RUNNING)
        task.work = self.queue.later(
            self.rng.uniform(*self.behaviour.duration),
            lambda: self._finished(task),
            f"{self.peer} finish {task.info.task_id}",
        )

    def _finished(self, task: SimTask) -> None:
        task.work = None
        failed = self.rng.random() < self.behaviour.fail_probability
        self._update(task, TaskState.FAILED if failed else TaskState.FINISHED)

    def _kill(self, task_id: TaskID, *, pressed: bool = False) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.state in _OVER:
            return
        p = self.behaviour.stuck_kill_probability
        if not pressed and p and not self.builtin and self.rng.random() < p:
            self.kills_swallowed += 1  # stuck: neither ends nor answers until shut down
            if task.work is not None:
                task.work.cancel()
                task.work = None
            return
        if task.work is not None:
            task.work.cancel()
            task.work = None
        self._update(task, TaskState.KILLED)

    def _update(self, task: SimTask, state: TaskState) -> None:
        if not self.alive:
            return
        task.state = state
        if state in _OVER:
            self.ended[task.info.task_id] = state
        status = TaskStatus(task_id=task.info.task_id, state=state, source=StatusSource.EXECUTOR)
        self._perform(self.core.send_status_update(status, self._uuids(), self.now()))

    def _shutdown(self, code: int) -> None:
        if self._exiting:
            return
        self._exiting = True
        for task_id in list(self.tasks):
            self._kill(task_id, pressed=True)
        self._await_acks(code, self.now() + self.behaviour.exit_grace)

    def _await_acks(self, code: int, deadline: float) -> None:
        if not self.alive:
            return
        if self.core.all_acknowledged or self.now() >= deadline:
            self._exit(code)
            return
        self.queue.later(0.1, lambda: self._await_acks(code, deadline), f"{self.peer} exiting")

    # --- views -----------------------------------------------------------------------------
    def running(self) -> list[tuple[TaskID, Resources]]:
        """The tasks this process still runs, with what they use."""
        if not self.alive:
            return []
        return [
            (t.info.task_id, t.info.resources) for t in self.tasks.values() if t.state not in _OVER
        ]


_OVER = frozenset({TaskState.FINISHED, TaskState.FAILED, TaskState.KILLED})
