"""A simulated host: the real agent core (``agora.agent.core.Agent``) and its executors.

The host does what the ``agora-agent`` daemon does around its core, with simulated I/O:

* every stimulus (a frame from the master, one from an executor, an executor's exit, a tick
  every ``tick`` seconds) goes to the core, whose checkpoint records are written to the host's
  journal (a dict standing for the fsynced file) before any action it returned is performed;
* ``ToMaster`` goes on the simulated network, ``ToExecutor`` on the host's local bus,
  ``LaunchExecutor`` starts a :class:`~support.sim.executor.SimExecutor`, ``SignalExecutor``
  terminates or kills one, ``Terminate`` stops the host;
* ``crash()`` loses the agent process and everything not in the journal (its executors keep
  running, as they do when a real agent dies); ``restart()`` builds a fresh core, recovers it
  from the journal with the executors found alive, and reconnects, as the daemon does.

The host's clock is the simulation's plus an offset that ``jump_clock`` moves forward: the core's
timers take any clock that only moves forward, so a jump must be survived, not prevented.

What the host saw is kept for the invariants: every task it was asked to run, the last state
it reported for each (its own final word), and the re-registrations it sent.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from agora.agent.core import (
    Action,
    Agent,
    AgentConfig,
    Delete,
    ExecutorKey,
    LaunchExecutor,
    Put,
    SignalExecutor,
    Terminate,
    ToExecutor,
    ToMaster,
)
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    Message,
    ReregisterAgent,
    RunTask,
    RunTaskGroup,
    StatusUpdateMessage,
    TaskState,
)
from agora.sdk.messages.batching import unbatch
from agora.sdk.resources import Resources

from support.sim.clock import EventQueue
from support.sim.executor import AGENT, ExecutorBehaviour, SimExecutor
from support.sim.network import MASTER, NetConfig, SimNetwork

__all__ = ["HostConfig", "SimHost"]

TaskKey = tuple[FrameworkID, str]


@dataclass(slots=True)
class HostConfig:
    """The agent core's timers (shortened where the default would make runs long) and the
    executors' behaviour."""

    tick: float = 0.5
    master_timeout: float = 75.0
    registration_backoff: float = 1.0
    registration_backoff_max: float = 10.0
    status_update_retry: float = 2.0
    status_update_retry_max: float = 60.0
    executor_registration_timeout: float = 60.0
    executor_reregistration_timeout: float = 10.0
    executor_shutdown_grace_period: float = 5.0
    command_executor_idle_timeout: float = 5.0
    executor: ExecutorBehaviour | None = None


class SimHost:
    def __init__(
        self,
        name: str,
        resources: Resources,
        queue: EventQueue,
        net: SimNetwork,
        rng: random.Random,
        config: HostConfig,
    ) -> None:
        self.name = name
        self.total = resources
        self.queue = queue
        self.net = net
        self.rng = rng
        self.config = config
        self.behaviour = config.executor or ExecutorBehaviour()
        self.bus = SimNetwork(queue, rng, NetConfig(latency_min=0.0001, latency_max=0.002))
        self.core_config = AgentConfig(
            hostname=name,
            resources=resources,
            registration_backoff=config.registration_backoff,
            registration_backoff_max=config.registration_backoff_max,
            master_timeout=config.master_timeout,
            status_update_retry=config.status_update_retry,
            status_update_retry_max=config.status_update_retry_max,
            executor_registration_timeout=config.executor_registration_timeout,
            executor_reregistration_timeout=config.executor_reregistration_timeout,
            executor_shutdown_grace_period=config.executor_shutdown_grace_period,
            command_executor_idle_timeout=config.command_executor_idle_timeout,
        )
        self.core: Agent | None = None
        #: The durable records: what every committed checkpoint adds up to.
        self.journal: dict[tuple[str, str], bytes] = {}
        self.executors: dict[ExecutorKey, SimExecutor] = {}
        self.offset = 0.0
        self.up = False
        self.stopped = False
        self._spawned = 0
        self._secrets = 0
        self._tick_serial = 0
        #: Every task the master asked this host to run, and the last state the host reported
        #: for it (its own final word on the task).
        self.ran: set[TaskKey] = set()
        self.truth: dict[TaskKey, TaskState] = {}
        self.reregistrations = 0
        self.crashes = 0
        self.clock_jumps = 0
        #: Kills swallowed by executors that have exited since.
        self._swallowed_by_gone = 0

    # --- the clock ---------------------------------------------------------------------
    def now(self) -> float:
        return self.queue.clock.now + self.offset

    def jump_clock(self, seconds: float) -> None:
        """The host's clock leaps forward (NTP step, a VM resumed): timers fire early."""
        self.offset += seconds
        self.clock_jumps += 1

    # --- process life ------------------------------------------------------------------
    def start(self) -> None:
        """The agent process starts, first time or after a crash."""
        if self.stopped:
            return
        self.core = Agent(self.core_config, new_secret=self._new_secret)
        self.up = True
        self.net.attach(self.name, self._from_master)
        self.bus.attach(AGENT, self._from_executor)
        if self.journal:
            alive = {key for key, ex in self.executors.items() if ex.alive}
            self._perform(
                self.core.recover(dict(self.journal), self.now(), alive=alive, cleanup=False)
            )
            for ex in list(self.executors.values()):
                ex.link_up()
        self._perform(self.core.connected(self.now()))
        self._tick_serial += 1
        serial = self._tick_serial
        self.queue.later(self.config.tick, lambda: self._tick(serial), f"{self.name} tick")

    def crash(self) -> None:
        """The agent process dies (SIGKILL): the core and its unsent actions are lost; the
        journal and the executor processes survive."""
        if not self.up:
            return
        self.crashes += 1
        self.up = False
        self.core = None
        self.net.detach(self.name)
        self.bus.detach(AGENT)
        for ex in list(self.executors.values()):
            ex.link_down()

    def master_link_up(self) -> None:
        """The link to the masters follows a (new) leader: register with it."""
        if self.up:
            assert self.core is not None
            self._perform(self.core.connected(self.now()))

    def master_link_down(self) -> None:
        """The leader the link followed is gone."""
        if self.up:
            assert self.core is not None
            self._perform(self.core.disconnected(self.now()))

    def restart(self) -> None:
        if not self.up:
            self.start()

    def _tick(self, serial: int) -> None:
        if not self.up or serial != self._tick_serial:
            return
        assert self.core is not None
        self._perform(self.core.tick(self.now()))
        self.queue.later(self.config.tick, lambda: self._tick(serial), f"{self.name} tick")

    def _new_secret(self) -> str:
        self._secrets += 1
        return hashlib.sha256(f"{self.name}/{self._secrets}".encode()).hexdigest()

    # --- stimuli -------------------------------------------------------------------------
    def _from_master(self, _sender: str, message: Message, epoch: int) -> None:
        if not self.up:
            return
        assert self.core is not None
        if isinstance(message, RunTask):
            self.ran.add((message.framework_id, str(message.task.task_id)))
        elif isinstance(message, RunTaskGroup):
            for task in message.task_group.tasks:
                self.ran.add((message.framework_id, str(task.task_id)))
        self._perform(self.core.from_master(message, epoch, self.now()))

    def _from_executor(self, sender: str, message: Message, _epoch: int) -> None:
        if not self.up:
            return
        assert self.core is not None
        self._perform(self.core.from_executor(sender, message, self.now()))

    def _exited(self, ex: SimExecutor, status: int) -> None:
        key = (ex.framework_id, ex.executor_id)
        self._swallowed_by_gone += ex.kills_swallowed
        if self.executors.get(key) is ex:
            del self.executors[key]
        if not self.up:
            return  # the restarted agent finds it gone (not in ``alive``)
        assert self.core is not None
        # An executor adopted after a restart is not the agent's child: its status is unknown.
        code = status if ex.parent == self.crashes else None
        self._perform(self.core.executor_exited(ex.framework_id, ex.executor_id, code, self.now()))

    # --- actions ---------------------------------------------------------------------------
    def _perform(self, actions: list[Action]) -> None:
        assert self.core is not None
        for record in self.core.checkpoint():
            if isinstance(record, Put):
                self.journal[(record.kind, record.key)] = record.value
            elif isinstance(record, Delete):
                self.journal.pop((record.kind, record.key), None)
        for action in actions:
            if isinstance(action, ToMaster):
                self._to_master(action.message)
            elif isinstance(action, ToExecutor):
                self.bus.send(AGENT, action.peer, action.message)
            elif isinstance(action, LaunchExecutor):
                self._launch(action)
            elif isinstance(action, SignalExecutor):
                ex = self.executors.get((action.framework_id, action.executor_id))
                if ex is not None:
                    self.queue.later(0.0, ex.killed if action.kill else ex.terminated, "signal")
            elif isinstance(action, Terminate):
                self._terminate()
            # ExecutorRefused: the daemon logs it; nothing to do

    def _to_master(self, message: Message) -> None:
        if isinstance(message, ReregisterAgent):
            self.reregistrations += 1
        for one in unbatch(message):
            if isinstance(one, StatusUpdateMessage):
                key = (one.update.framework_id, str(one.update.status.task_id))
                if key in self.ran:
                    self.truth[key] = one.update.status.state
        self.net.send(self.name, MASTER, message)

    def _launch(self, action: LaunchExecutor) -> None:
        key = (action.framework_id, action.executor_id)
        assert key not in self.executors, f"{self.name}: executor {key} launched twice"
        self._spawned += 1
        ex = SimExecutor(
            framework_id=action.framework_id,
            executor_id=action.executor_id,
            builtin=action.builtin,
            environment=dict(action.environment),
            bus=self.bus,
            peer=f"{action.framework_id}/{action.executor_id}/{self._spawned}",
            queue=self.queue,
            rng=self.rng,
            behaviour=self.behaviour,
            clock=self.now,
            on_exit=self._exited,
            uuids=lambda: self.rng.randbytes(16),
        )
        ex.parent = self.crashes  # which incarnation of the agent is its parent
        self.executors[key] = ex
        self.queue.later(self.rng.uniform(0.01, 0.2), ex.start, f"{ex.peer} exec")

    def _terminate(self) -> None:
        """The master shut this agent down: wait out the grace period, kill the rest, stop."""
        self.stopped = True

        def finish() -> None:
            for ex in list(self.executors.values()):
                ex.killed()
            self.up = False
            self.net.detach(self.name)

        self.queue.later(self.config.executor_shutdown_grace_period, finish, f"{self.name} stop")

    # --- views for the invariants -----------------------------------------------------------
    @property
    def agent_id(self) -> AgentID | None:
        if self.core is not None:
            return self.core.agent_id
        return None

    def running(self) -> list[tuple[TaskID, Resources]]:
        """What the executor processes on this host really run."""
        return [item for ex in self.executors.values() for item in ex.running()]

    def unacknowledged(self) -> int:
        """Status updates not yet acknowledged, in the agent core and in its executors."""
        pending = sum(
            len(ex.core.unacknowledged_updates) for ex in self.executors.values() if ex.alive
        )
        if self.core is not None:
            pending += self.core.state.updates.unacknowledged()
        return pending

    def pending(self) -> dict[str, list[str]]:
        """The unacknowledged updates, by task, for a failure message."""
        out: dict[str, list[str]] = {}
        if self.core is not None:
            updates = self.core.state.updates
            for framework_id, task_id in updates:
                out[str(task_id)] = [s.state.name for s in updates.pending(framework_id, task_id)]
        for ex in self.executors.values():
            for update in ex.core.unacknowledged_updates:
                out.setdefault(f"{update.status.task_id}@executor", []).append(
                    update.status.state.name
                )
        return out

    @property
    def kills_swallowed(self) -> int:
        return self._swallowed_by_gone + sum(ex.kills_swallowed for ex in self.executors.values())
