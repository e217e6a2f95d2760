"""A simulated framework: the policy of a careful Mesos scheduler on the real driver core.

The protocol (subscription, offers held, acknowledgements, batches, errors, epochs) is the real
``SchedulerCore`` in :class:`~support.sim.driver.SimDriver`; this module is only what a
framework author writes, the callbacks and the calls, as the Mesos high-availability framework
guide asks:

* after a re-registration it reconciles every task it has not seen finish;
* offers are held for a random "think time", then all held offers of one agent are used in
  one ACCEPT (LAUNCH of command tasks, sometimes a LAUNCH_GROUP) or declined with a filter;
* every state it is told is recorded (the driver acknowledges them);
* tasks without news are reconciled; a task stuck without ever RUNNING (its launch was lost)
  is killed, repeatedly, until some terminal state arrives;
* a gang framework REQUESTs one gang at a time and accepts a gang bundle whole, with one
  LAUNCH_GROUP per agent. With ``kill_gang_on_loss`` it behaves as ``agora mpirun`` does: once
  one member of a gang is over (ended, lost, unreachable) it kills the others, and kills those
  that have not answered again after ``kill_resend`` seconds, with a SHUTDOWN of their
  executor, until each answers;
* every KILL carries a fresh kill id, remembered so that the checks can follow it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, TaskID
from agora.sdk.messages import (
    CommandInfo,
    Error,
    ExecutorInfo,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    GangRequest,
    LaunchGroup,
    Offer,
    Operation,
    Placement,
    Reason,
    ReconcileTask,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
    is_terminal,
)
from agora.sdk.resources import Resources

from support.sim.clock import EventQueue
from support.sim.driver import SimDriver
from support.sim.network import SimNetwork

__all__ = [
    "FrameworkSpec",
    "FwTask",
    "SimFramework",
    "last_word",
    "record_status",
    "without_late_answers",
]

_SHAPES = ("cpus:0.25;mem:64", "cpus:0.5;mem:128", "cpus:1;mem:256", "cpus:2;mem:512")
_GANG_SHAPES = ("cpus:1;mem:256", "cpus:2;mem:512")


@dataclass(slots=True)
class FrameworkSpec:
    name: str
    partition_aware: bool = False
    failover_timeout: float = 0.0
    #: Request gangs (one at a time) besides taking ordinary offers.
    gangs: bool = False
    #: How many tasks (gang slots included) it launches over the whole run.
    max_tasks: int = 150
    #: At most this many tasks not yet seen terminal at once (spreads launches over the run).
    max_active: int = 10
    group_probability: float = 0.2
    think_time: tuple[float, float] = (0.0, 1.5)
    subscribe_retry: float = 4.0
    #: No news for this long: reconcile the task explicitly.
    reconcile_after: float = 30.0
    #: Launched this long ago and never RUNNING: kill it (its launch was probably lost).
    kill_after: float = 90.0
    #: Kill the rest of a gang once one of its members is over (as agora mpirun does).
    kill_gang_on_loss: bool = False
    #: A killed gang member that has not answered is killed again, with a SHUTDOWN of its
    #: executor, this long after the previous kill.
    kill_resend: float = 10.0
    implicit_reconcile_every: float = 120.0
    #: Its one role (its gangs' too).
    role: str = "*"
    #: It takes revocable offers (lent from other roles' unmet guarantees).
    revocable: bool = False
    #: Until this time it wants nothing (suppressed), then it revives; it suppresses again
    #: once it has launched all it will (0: never suppresses).
    idle_until: float = 0.0


@dataclass(slots=True)
class FwTask:
    task_id: TaskID
    agent_id: AgentID
    launched_at: float
    states: list[TaskState] = field(default_factory=list)
    #: Parallel to ``states``, where each came from: "stream" (the agent's reliable stream:
    #: it has a uuid), "reconcile" (a reconciliation answer), "reregistered" (the master's
    #: word when the agent came back) or "master" (made up by the master otherwise: agent
    #: lost, invalid offers, ...).
    kinds: list[str] = field(default_factory=list)
    last_news: float = 0.0
    kill_sent_at: float | None = None
    gang: GangID | None = None
    executor_id: ExecutorID | None = None
    #: The ids of the kills sent for it, and how many states it had heard at the first one.
    kill_ids: list[str] = field(default_factory=list)
    states_before_kill: int = 0


class SimFramework:
    """The scheduler's callbacks and its timers (see the module docstring)."""

    def __init__(
        self,
        spec: FrameworkSpec,
        queue: EventQueue,
        net: SimNetwork,
        rng: random.Random,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.queue = queue
        self.rng = rng
        caps: tuple[FrameworkCapability, ...] = ()
        if spec.partition_aware:
            caps += (FrameworkCapability.PARTITION_AWARE,)
        if spec.revocable:
            caps += (FrameworkCapability.REVOCABLE_RESOURCES,)
        info = FrameworkInfo(
            name=spec.name,
            roles=(spec.role,),
            failover_timeout=spec.failover_timeout,
            capabilities=caps,
        )
        self.driver = SimDriver(
            spec.name, info, self, queue, net, subscribe_retry=spec.subscribe_retry
        )
        self.launching = True
        self.tasks: dict[TaskID, FwTask] = {}
        self.launched = 0
        self.subscriptions = 0
        self.errors: list[Error] = []
        self.foreign_offers: list[Offer] = []
        self.offers_before_subscribed = 0
        self.unknown_updates: list[TaskStatus] = []
        self.gang_serial = 0
        self.pending_gang: GangRequest | None = None
        self.gang_requested_at = 0.0
        self.gangs_launched = 0
        #: Every kill id sent, with its task.
        self.kills: dict[str, TaskID] = {}
        self.gang_kills = 0
        self._serial = 0
        self._deciding: set[AgentID] = set()
        self._next_implicit = 0.0
        #: Suppressed while idle (see FrameworkSpec.idle_until), or since it launched all.
        self.suppressed = False

    # --- what the runner and the checks read ----------------------------------------------
    @property
    def framework_id(self) -> FrameworkID | None:
        return self.driver.framework_id

    @property
    def subscribed(self) -> bool:
        return self.driver.core.subscribed

    @property
    def removed(self) -> bool:
        return self.driver.stopped

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self.spec.idle_until > 0:
            self.suppressed = True  # its SUBSCRIBE carries it: no offers while idle
            self.driver.core.suppressed.add(self.spec.role)
            self.queue.at(self.spec.idle_until, self._wake, f"{self.name} wakes")
        self.driver.start()
        self.queue.later(5.0, self._periodic, f"{self.name} periodic")

    def _suppress(self) -> None:
        self.suppressed = True
        self.driver.core.suppress([])
        self.driver.flush()

    def _wake(self) -> None:
        if self.launching and self.launched < self.spec.max_tasks:
            self.suppressed = False
            self.driver.core.revive([])
            self.driver.flush()

    def stop_launching(self) -> None:
        self.launching = False

    def settled(self) -> bool:
        """Nothing of its own left to finish (its tasks are checked by the runner)."""
        return True

    def connection_lost(self) -> None:
        self.driver.connection_lost()

    def link_up(self) -> None:
        self.driver.link_up()

    def link_down(self) -> None:
        self.driver.link_down()

    # --- callbacks ---------------------------------------------------------------------
    def registered(self, framework_id: FrameworkID) -> None:
        self.subscriptions += 1
        self.pending_gang = None
        self._maybe_request_gang()

    def reregistered(self) -> None:
        self.subscriptions += 1
        self._reconcile([t for t in self.tasks.values() if not self._settled(t)])
        self.pending_gang = None  # a gang request does not outlive the subscription
        self._maybe_request_gang()

    def disconnected(self) -> None:
        pass

    def error(self, message: Error) -> None:
        self.errors.append(message)

    def gang_expired(self, gang_id: GangID) -> None:
        if self.pending_gang is not None and gang_id == self.pending_gang.gang_id:
            self.pending_gang = None
            self._maybe_request_gang()

    def status_update(self, status: TaskStatus) -> None:
        task = self.tasks.get(status.task_id)
        if task is None:
            self.unknown_updates.append(status)
            return
        record_status(task, status, self.queue.clock.now)
        if self.spec.kill_gang_on_loss and task.gang is not None and _over(status.state):
            self._kill_gang(task.gang)

    def offers(self, offers: list[Offer]) -> None:
        gangs: dict[GangID, list[Offer]] = {}
        for offer in offers:
            if self.framework_id is None:
                # SUBSCRIBED was lost, so we cannot tell these are ours. Our retried SUBSCRIBE
                # re-subscribes, and the master takes back the offers of the first one.
                self.offers_before_subscribed += 1
                continue
            if offer.framework_id != self.framework_id:
                self.foreign_offers.append(offer)
                continue
            if offer.gang_id is not None:
                gangs.setdefault(offer.gang_id, []).append(offer)
                continue
            if offer.agent_id not in self._deciding:
                self._deciding.add(offer.agent_id)
                self.queue.later(
                    self.rng.uniform(*self.spec.think_time),
                    lambda agent_id=offer.agent_id: self._decide(agent_id),
                    f"{self.name} decide",
                )
        for gang_id, parts in sorted(gangs.items()):
            self._on_gang_offer(gang_id, parts)

    # --- offers ------------------------------------------------------------------------
    def _decide(self, agent_id: AgentID) -> None:
        self._deciding.discard(agent_id)
        held = self.driver.held(agent_id)
        if not held or not self.subscribed:
            return
        pool = Resources()
        for o in held:
            pool = pool + o.resources
        infos: list[TaskInfo] = []
        budget = self.spec.max_tasks - self.launched
        if self.spec.gangs and self.pending_gang is not None:
            budget -= self.pending_gang.count  # keep room in the budget for the gang
        active = sum(1 for t in self.tasks.values() if not self._settled(t))
        want = (
            min(self.rng.randint(1, 3), budget, self.spec.max_active - active)
            if self.launching
            else 0
        )
        if self.spec.idle_until > 0 and (
            self.queue.clock.now < self.spec.idle_until or self.launched >= self.spec.max_tasks
        ):
            want = 0
            if not self.suppressed and self.queue.clock.now >= self.spec.idle_until:
                self._suppress()  # all launched: it wants nothing more
        used = Resources()
        for _ in range(want):
            shape = Resources.parse(self.rng.choice(_SHAPES))
            if pool.contains(used + shape):
                used = used + shape
                infos.append(self._task_info(agent_id, shape))
        refuse = Filters(refuse_seconds=round(self.rng.uniform(0.5, 5.0), 3))
        core = self.driver.core
        if not infos:
            core.decline(held, refuse)
        elif len(infos) > 1 and self.rng.random() < self.spec.group_probability:
            executor = self._executor(f"grp-{infos[0].task_id}")
            self._record_launch(infos, None)
            core.launch_group(held, executor, infos, refuse)
        else:
            self._record_launch(infos, None)
            core.launch(held, infos, refuse)
        self.driver.flush()

    def _task_info(self, agent_id: AgentID, shape: Resources) -> TaskInfo:
        self._serial += 1
        task_id = TaskID(f"{self.name}-t{self._serial}")
        return TaskInfo(
            task_id=task_id,
            name=str(task_id),
            agent_id=agent_id,
            resources=shape,
            command=CommandInfo(value="sleep 1"),
        )

    def _executor(self, executor_id: str) -> ExecutorInfo:
        assert self.framework_id is not None
        return ExecutorInfo(
            executor_id=ExecutorID(executor_id),
            framework_id=self.framework_id,
            command=CommandInfo(value="executor"),
        )

    def _record_launch(self, infos: list[TaskInfo], gang: GangID | None) -> None:
        now = self.queue.clock.now
        for info in infos:
            assert info.task_id not in self.tasks, f"{self.name}: task id {info.task_id} reused"
            self.tasks[info.task_id] = FwTask(
                info.task_id, info.agent_id, now, last_news=now, gang=gang
            )
        self.launched += len(infos)

    # --- gangs -------------------------------------------------------------------------
    def _maybe_request_gang(self) -> None:
        if (
            not (self.spec.gangs and self.launching and self.subscribed)
            or self.pending_gang is not None
        ):
            return
        count = self.rng.randint(2, 4)
        if self.launched + count > self.spec.max_tasks:
            return
        self.gang_serial += 1
        hold = round(self.rng.uniform(20.0, 60.0), 3)
        gang = GangRequest(
            gang_id=GangID(f"{self.name}-g{self.gang_serial}"),
            role=self.spec.role,
            count=count,
            shape=Resources.parse(self.rng.choice(_GANG_SHAPES)),
            placement=self.rng.choice((Placement.DISTINCT, Placement.PACK, Placement.ANY)),
            hold_timeout=hold,
        )
        self.pending_gang = gang
        self.gang_requested_at = self.queue.clock.now
        self.driver.core.request([gang])
        self.driver.flush()

    def _on_gang_offer(self, gang_id: GangID, parts: list[Offer]) -> None:
        core = self.driver.core
        gang = self.pending_gang
        if gang is None or gang.gang_id != gang_id or not self.launching:
            core.decline(parts, Filters(refuse_seconds=1.0))
            self.driver.flush()
            return
        ops: list[Operation] = []
        infos: list[TaskInfo] = []
        executors: dict[TaskID, ExecutorID] = {}
        slots_total = 0
        for part in parts:
            slots = _slots(part.resources, gang.shape)
            slots_total += slots
            group = [self._task_info(part.agent_id, gang.shape) for _ in range(slots)]
            infos.extend(group)
            executor = self._executor(f"gang-{gang_id}-{part.agent_id}")
            executors.update(dict.fromkeys((t.task_id for t in group), executor.executor_id))
            ops.append(LaunchGroup(executor=executor, task_group=TaskGroupInfo(tasks=tuple(group))))
        assert slots_total == gang.count, (
            f"{self.name}: gang {gang_id} offered {slots_total} slots of {gang.shape}, "
            f"asked {gang.count}: {parts}"
        )
        self.pending_gang = None
        self.gangs_launched += 1
        self._record_launch(infos, gang_id)
        for task_id, executor_id in executors.items():
            self.tasks[task_id].executor_id = executor_id
        core.accept(parts, ops, Filters(refuse_seconds=1.0))
        self.driver.flush()
        self._maybe_request_gang()

    # --- timers ------------------------------------------------------------------------
    def _settled(self, task: FwTask) -> bool:
        if not task.states:
            return False
        last = task.states[-1]
        return is_terminal(last)

    def _periodic(self) -> None:
        if self.removed:
            return
        now = self.queue.clock.now
        self.queue.later(5.0, self._periodic, f"{self.name} periodic")
        if not self.subscribed:
            return
        stale = [
            t
            for t in self.tasks.values()
            if not self._settled(t) and now - t.last_news >= self.spec.reconcile_after
        ]
        if stale:
            self._reconcile(stale)
            for t in stale:
                t.last_news = now  # do not ask again until reconcile_after has passed
        for t in self.tasks.values():
            if self._settled(t) or TaskState.RUNNING in t.states:
                continue
            if now - t.launched_at < self.spec.kill_after:
                continue
            if t.kill_sent_at is None or now - t.kill_sent_at >= self.spec.reconcile_after:
                self._kill(t)
        if self.spec.kill_gang_on_loss:  # gangs whose loss was heard while not subscribed
            over = {t.gang for t in self.tasks.values() if t.gang and _over_any(t.states)}
            for gang in sorted(over):
                self._kill_gang(gang)
        for t in self.tasks.values():
            if not t.kill_ids or self._answered(t) or t.kill_sent_at is None:
                continue
            if t.gang is not None and now - t.kill_sent_at >= self.spec.kill_resend:
                self._kill(t)  # pressed as agora mpirun presses: again, and its executor
                if t.executor_id is not None:
                    self.driver.core.shutdown_executor(t.agent_id, t.executor_id)
        if now >= self._next_implicit:
            self._next_implicit = now + self.spec.implicit_reconcile_every
            self.driver.core.reconcile([])
        gang = self.pending_gang
        if gang is not None and now - self.gang_requested_at > gang.hold_timeout + 30.0:
            # Neither a bundle nor GANG_EXPIRED arrived: the request or its answer was lost.
            self.pending_gang = None
        self._maybe_request_gang()
        self.driver.flush()

    # --- kills -------------------------------------------------------------------------
    def _kill(self, task: FwTask) -> None:
        kill_id = f"{self.name}-k{len(self.kills) + 1}"
        self.kills[kill_id] = task.task_id
        if not task.kill_ids:
            task.states_before_kill = len(task.states)
        task.kill_ids.append(kill_id)
        task.kill_sent_at = self.queue.clock.now
        self.driver.core.kill(task.task_id, task.agent_id, kill_id)
        self.driver.flush()

    def _kill_gang(self, gang: GangID) -> None:
        if not self.subscribed:
            return  # the resend in _periodic catches up once subscribed
        for task in self.tasks.values():
            if task.gang == gang and not task.kill_ids and not _over_any(task.states):
                self.gang_kills += 1
                self._kill(task)

    @staticmethod
    def _answered(task: FwTask) -> bool:
        """A kill is answered by an update that ends the task for the framework, unless the
        task is heard running again after it (its agent came back): then it is pressed again."""
        after = task.states[task.states_before_kill :]
        return bool(after) and _over(after[-1])

    def _reconcile(self, tasks: list[FwTask]) -> None:
        if not tasks or not self.subscribed:
            return
        self.driver.core.reconcile(
            [ReconcileTask(task_id=t.task_id, agent_id=t.agent_id) for t in tasks]
        )
        self.driver.flush()


def record_status(task: FwTask, status: TaskStatus, now: float) -> None:
    """Note what the framework heard of ``task`` and where it came from (see FwTask.kinds)."""
    task.states.append(status.state)
    if status.uuid is not None:
        assert status.agent_id is not None, f"update with a uuid but no agent: {status}"
        kind = "stream"
    elif status.reason is Reason.RECONCILIATION:
        kind = "reconcile"
    elif status.reason is Reason.AGENT_REREGISTERED:
        kind = "reregistered"
    else:
        kind = "master"
    task.kinds.append(kind)
    task.last_news = now


#: What the master answers about a task it does not know (any more).
_UNKNOWN_TASK = frozenset({TaskState.GONE, TaskState.LOST, TaskState.UNKNOWN})


def without_late_answers(task: FwTask) -> tuple[list[TaskState], list[str]]:
    """The history without reconciliation answers about a forgotten task that came after the
    agent's stream ended it: the framework acknowledged the end, the master forgot the task, and
    a question already on its way was answered as for an unknown task (as in Mesos)."""
    states: list[TaskState] = []
    kinds: list[str] = []
    ended = False
    for state, kind in zip(task.states, task.kinds, strict=True):
        if ended and kind == "reconcile" and state in _UNKNOWN_TASK:
            continue
        ended = ended or (kind == "stream" and is_terminal(state))
        states.append(state)
        kinds.append(kind)
    return states, kinds


def last_word(task: FwTask) -> TaskState | None:
    """The last state the framework heard that counts (see :func:`without_late_answers`)."""
    states, _kinds = without_late_answers(task)
    return states[-1] if states else None


#: A gang member in one of these is gone for its gang (agora mpirun's rule).
_GONE = frozenset({TaskState.LOST, TaskState.GONE, TaskState.DROPPED, TaskState.UNREACHABLE})


def _over(state: TaskState) -> bool:
    return is_terminal(state) or state in _GONE


def _over_any(states: list[TaskState]) -> bool:
    return any(_over(s) for s in states)


def _slots(have: Resources, shape: Resources) -> int:
    counts = [
        have.scalar_milli(name) // shape.scalar_milli(name)
        for name in shape.names()
        if shape.scalar_milli(name) > 0
    ]
    return min(counts) if counts else 0
