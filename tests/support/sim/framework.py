"""A simulated framework scheduler: subscribes, launches small tasks, acknowledges, reconciles.

It behaves as a careful Mesos scheduler should (the Mesos high-availability framework guide):

* SUBSCRIBE is retried until SUBSCRIBED; after the transport reports the connection lost it
  re-subscribes with its framework id, then reconciles every task it has not seen finish.
* Offers are held for a random "think time", then all held offers of one agent are used in
  one ACCEPT (LAUNCH of command tasks, sometimes a LAUNCH_GROUP) or declined with a filter.
* Every UPDATE that carries a uuid is acknowledged; every state it is told is recorded.
* Tasks without news are reconciled; a task stuck without ever RUNNING (its launch was lost)
  is killed, repeatedly, until some terminal state arrives.
* A gang framework REQUESTs one gang at a time and accepts a gang bundle whole, with one
  LAUNCH_GROUP per agent. With ``kill_gang_on_loss`` it behaves as ``agora mpirun`` does: once
  one member of a gang is over (ended, lost, unreachable) it kills the others, and kills those
  that have not answered again after ``kill_resend`` seconds, with a SHUTDOWN of their
  executor, until each answers.
* Every KILL carries a fresh kill id, remembered so that the checks can follow it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    CommandInfo,
    Decline,
    Error,
    ErrorCode,
    ExecutorInfo,
    Failure,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    GangExpired,
    GangRequest,
    Heartbeat,
    Kill,
    Launch,
    LaunchGroup,
    Message,
    Offer,
    Offers,
    Operation,
    Placement,
    Reason,
    Reconcile,
    ReconcileTask,
    Request,
    Rescind,
    Shutdown,
    Subscribe,
    Subscribed,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    Update,
    is_terminal,
)
from agora.sdk.resources import Resources

from support.sim.clock import EventQueue
from support.sim.network import MASTER, SimNetwork

__all__ = ["FrameworkSpec", "FwTask", "SimFramework"]

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
        self.net = net
        self.rng = rng
        self.framework_id: FrameworkID | None = None
        self.subscribed = False
        self.removed = False
        self.launching = True
        self.tasks: dict[TaskID, FwTask] = {}
        self.offers: dict[OfferID, Offer] = {}
        self.launched = 0
        self.subscriptions = 0
        self.errors: list[Error] = []
        self.foreign_offers: list[Offer] = []
        self.offers_before_subscribed = 0
        self.unknown_updates: list[Update] = []
        self.failures = 0
        self.heartbeats = 0
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
        self._subscribing = False
        net.attach(self.name, self.receive)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._subscribe()
        self.queue.later(5.0, self._periodic, f"{self.name} periodic")

    def stop_launching(self) -> None:
        self.launching = False

    def _send(self, message: Message) -> None:
        if not self.removed:
            self.net.send(self.name, MASTER, message)

    def _subscribe(self) -> None:
        """Start the SUBSCRIBE retry loop, unless it already runs."""
        if not self._subscribing:
            self._subscribing = True
            self._subscribe_attempt()

    def _subscribe_attempt(self) -> None:
        if self.subscribed or self.removed:
            self._subscribing = False
            return
        caps = (FrameworkCapability.PARTITION_AWARE,) if self.spec.partition_aware else ()
        info = FrameworkInfo(
            name=self.name,
            roles=("*",),
            failover_timeout=self.spec.failover_timeout,
            capabilities=caps,
            framework_id=self.framework_id,
        )
        self._send(Subscribe(framework_info=info))
        self.queue.later(
            self.spec.subscribe_retry, self._subscribe_attempt, f"{self.name} subscribe"
        )

    def connection_lost(self) -> None:
        """The transport reports the connection to the master gone: re-subscribe."""
        if self.removed:
            return
        self.subscribed = False
        self.offers.clear()
        self._subscribe()

    # --- inbound -----------------------------------------------------------------------
    def receive(self, sender: str, message: Message, epoch: int) -> None:
        if self.removed:
            return
        if isinstance(message, Subscribed):
            self._on_subscribed(message)
        elif isinstance(message, Offers):
            self._on_offers(message)
        elif isinstance(message, Rescind):
            self.offers.pop(message.offer_id, None)
        elif isinstance(message, Update):
            self._on_update(message)
        elif isinstance(message, Error):
            self._on_error(message)
        elif isinstance(message, GangExpired):
            if self.pending_gang is not None and message.gang_id == self.pending_gang.gang_id:
                self.pending_gang = None
                self._maybe_request_gang()
        elif isinstance(message, Failure):
            self.failures += 1
        elif isinstance(message, Heartbeat):
            self.heartbeats += 1

    def _on_subscribed(self, msg: Subscribed) -> None:
        if self.subscribed and msg.framework_id == self.framework_id:
            return  # the answer to a retried SUBSCRIBE
        resubscribed = self.framework_id is not None
        self.framework_id = msg.framework_id
        self.subscribed = True
        self.subscriptions += 1
        if resubscribed:
            self._reconcile([t for t in self.tasks.values() if not self._settled(t)])
        self.pending_gang = None  # a gang request does not outlive the subscription
        self._maybe_request_gang()

    def _on_error(self, msg: Error) -> None:
        self.errors.append(msg)
        if msg.code is ErrorCode.FRAMEWORK_REMOVED:
            self.removed = True
            self.subscribed = False
        elif msg.code in (ErrorCode.FORBIDDEN, ErrorCode.NOT_SUBSCRIBED) and self.subscribed:
            # The master no longer takes us for subscribed on this connection.
            self.subscribed = False
            self._subscribe()

    def _on_update(self, msg: Update) -> None:
        status = msg.status
        task = self.tasks.get(status.task_id)
        if task is None:
            self.unknown_updates.append(msg)
        else:
            task.states.append(status.state)
            if status.uuid is not None:
                kind = "stream"
            elif status.reason is Reason.RECONCILIATION:
                kind = "reconcile"
            elif status.reason is Reason.AGENT_REREGISTERED:
                kind = "reregistered"
            else:
                kind = "master"
            task.kinds.append(kind)
            task.last_news = self.queue.clock.now
            if self.spec.kill_gang_on_loss and task.gang is not None and _over(status.state):
                self._kill_gang(task.gang)
        if status.uuid is not None and self.framework_id is not None:
            assert status.agent_id is not None, (
                f"{self.name}: update with a uuid but no agent: {status}"
            )
            self._send(
                Acknowledge(
                    framework_id=self.framework_id,
                    agent_id=status.agent_id,
                    task_id=status.task_id,
                    uuid=status.uuid,
                )
            )

    # --- offers ------------------------------------------------------------------------
    def _on_offers(self, msg: Offers) -> None:
        gangs: dict[GangID, list[Offer]] = {}
        for offer in msg.offers:
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
            self.offers[offer.offer_id] = offer
            if offer.agent_id not in self._deciding:
                self._deciding.add(offer.agent_id)
                self.queue.later(
                    self.rng.uniform(*self.spec.think_time),
                    lambda agent_id=offer.agent_id: self._decide(agent_id),
                    f"{self.name} decide",
                )
        for gang_id, parts in sorted(gangs.items()):
            self._on_gang_offer(gang_id, parts)

    def _decide(self, agent_id: AgentID) -> None:
        self._deciding.discard(agent_id)
        held = [o for o in self.offers.values() if o.agent_id == agent_id]
        if not held or not self.subscribed or self.framework_id is None:
            return
        for o in held:
            del self.offers[o.offer_id]
        offer_ids = tuple(o.offer_id for o in held)
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
        used = Resources()
        for _ in range(want):
            shape = Resources.parse(self.rng.choice(_SHAPES))
            if pool.contains(used + shape):
                used = used + shape
                infos.append(self._task_info(agent_id, shape))
        refuse = Filters(refuse_seconds=round(self.rng.uniform(0.5, 5.0), 3))
        if not infos:
            self._send(Decline(framework_id=self.framework_id, offer_ids=offer_ids, filters=refuse))
            return
        op: Operation
        if len(infos) > 1 and self.rng.random() < self.spec.group_probability:
            executor = self._executor(f"grp-{infos[0].task_id}")
            op = LaunchGroup(executor=executor, task_group=TaskGroupInfo(tasks=tuple(infos)))
        else:
            op = Launch(task_infos=tuple(infos))
        self._record_launch(infos, None)
        self._send(
            Accept(
                framework_id=self.framework_id,
                offer_ids=offer_ids,
                operations=(op,),
                filters=refuse,
            )
        )

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
        if self.framework_id is None:
            return
        count = self.rng.randint(2, 4)
        if self.launched + count > self.spec.max_tasks:
            return
        self.gang_serial += 1
        hold = round(self.rng.uniform(20.0, 60.0), 3)
        gang = GangRequest(
            gang_id=GangID(f"{self.name}-g{self.gang_serial}"),
            role="*",
            count=count,
            shape=Resources.parse(self.rng.choice(_GANG_SHAPES)),
            placement=self.rng.choice((Placement.DISTINCT, Placement.PACK, Placement.ANY)),
            hold_timeout=hold,
        )
        self.pending_gang = gang
        self.gang_requested_at = self.queue.clock.now
        self._send(Request(framework_id=self.framework_id, gangs=(gang,)))

    def _on_gang_offer(self, gang_id: GangID, parts: list[Offer]) -> None:
        assert self.framework_id is not None
        ids = tuple(o.offer_id for o in parts)
        gang = self.pending_gang
        if gang is None or gang.gang_id != gang_id or not self.launching:
            self._send(
                Decline(
                    framework_id=self.framework_id,
                    offer_ids=ids,
                    filters=Filters(refuse_seconds=1.0),
                )
            )
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
        self._send(
            Accept(
                framework_id=self.framework_id,
                offer_ids=ids,
                operations=tuple(ops),
                filters=Filters(refuse_seconds=1.0),
            )
        )
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
        if not self.subscribed or self.framework_id is None:
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
                    self._send(
                        Shutdown(
                            framework_id=self.framework_id,
                            executor_id=t.executor_id,
                            agent_id=t.agent_id,
                        )
                    )
        if now >= self._next_implicit:
            self._next_implicit = now + self.spec.implicit_reconcile_every
            self._send(Reconcile(framework_id=self.framework_id))
        gang = self.pending_gang
        if gang is not None and now - self.gang_requested_at > gang.hold_timeout + 30.0:
            # Neither a bundle nor GANG_EXPIRED arrived: the request or its answer was lost.
            self.pending_gang = None
        self._maybe_request_gang()

    # --- kills -------------------------------------------------------------------------
    def _kill(self, task: FwTask) -> None:
        assert self.framework_id is not None
        kill_id = f"{self.name}-k{len(self.kills) + 1}"
        self.kills[kill_id] = task.task_id
        if not task.kill_ids:
            task.states_before_kill = len(task.states)
        task.kill_ids.append(kill_id)
        task.kill_sent_at = self.queue.clock.now
        self._send(
            Kill(
                framework_id=self.framework_id,
                task_id=task.task_id,
                agent_id=task.agent_id,
                kill_id=kill_id,
            )
        )

    def _kill_gang(self, gang: GangID) -> None:
        if not self.subscribed or self.framework_id is None:
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
        if not tasks or self.framework_id is None:
            return
        items = tuple(ReconcileTask(task_id=t.task_id, agent_id=t.agent_id) for t in tasks)
        self._send(Reconcile(framework_id=self.framework_id, tasks=items))


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
