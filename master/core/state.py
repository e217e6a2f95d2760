"""The master's soft state: agents, frameworks, tasks and offers, plus the outbox.

Handlers in the sibling modules mutate one ``MasterState`` and append ``Send``
actions to its outbox; ``Master`` (master.py) drains the outbox after every
stimulus. Nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agora.master.allocator import Allocator
from agora.master.core.actions import Action, Notice, Peer, Propose, Send
from agora.master.core.config import MasterConfig
from agora.master.core.maintenance_state import MaintenanceState
from agora.master.core.recency import Recency
from agora.master.core.tally import TaskTally
from agora.master.registry import Operation, Registry
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    ContainerUsage,
    ExecutorInfo,
    FrameworkCapability,
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
from agora.sdk.messages.batching import FEATURES
from agora.sdk.resources import Resources

__all__ = [
    "Agent",
    "AgentStatus",
    "Framework",
    "MasterState",
    "OutstandingOffer",
    "Task",
    "TaskKey",
]

TaskKey = tuple[FrameworkID, TaskID]


class AgentStatus(enum.Enum):
    ACTIVE = "ACTIVE"
    UNREACHABLE = "UNREACHABLE"


@dataclass(slots=True)
class Agent:
    agent_id: AgentID
    info: AgentInfo
    peer: Peer
    status: AgentStatus
    registered_at: float
    #: Pings sent since the last PONG.
    missed_pings: int = 0
    unreachable_since: float | None = None
    tasks: set[TaskKey] = field(default_factory=set)
    #: Executors launched on the agent, with the role their resources were charged to.
    executors: dict[tuple[FrameworkID, ExecutorID], tuple[ExecutorInfo, str]] = field(
        default_factory=dict
    )
    #: Its persistent volumes by (role, volume id) (volumes.py).
    volumes: dict[tuple[str, str], PersistentVolume] = field(default_factory=dict)


@dataclass(slots=True)
class Framework:
    framework_id: FrameworkID
    info: FrameworkInfo
    peer: Peer | None
    subscribed_at: float
    #: When the scheduler's connection was lost; ``None`` while connected.
    disconnected_at: float | None = None
    #: Re-subscriptions from a new connection (a scheduler that failed over).
    failovers: int = 0
    tasks: set[TaskKey] = field(default_factory=set)
    #: Its live tasks (``tasks`` in the master's tasks) by state, kept as they change while the
    #: framework is registered (``MasterState`` moves the counts), so the views count them in
    #: O(states), not O(tasks).
    live: Counter[TaskState] = field(default_factory=Counter)
    offers: set[OfferID] = field(default_factory=set)
    #: Terminal tasks whose last update was acknowledged (bounded, oldest first).
    completed: deque[Task] = field(default_factory=deque)

    @property
    def connected(self) -> bool:
        return self.peer is not None and self.disconnected_at is None

    @property
    def partition_aware(self) -> bool:
        return FrameworkCapability.PARTITION_AWARE in self.info.capabilities


@dataclass(slots=True)
class Task:
    info: TaskInfo
    framework_id: FrameworkID
    agent_id: AgentID
    role: str
    #: Resources charged to the framework for this task (its own, not its executor's).
    resources: Resources
    state: TaskState
    status: TaskStatus | None = None
    #: True once the resources went back to the allocator (at the first terminal state).
    released: bool = False
    #: The latest usage of the task's container its agent reported (None: none yet).
    usage: ContainerUsage | None = None
    #: The id of the latest KILL sent to its agent (None: not killed). The KILL_TASK may have
    #: gone to a connection the agent had just left, so it is sent again when the agent
    #: re-registers still running the task (Mesos: the agent's ``killedTasks``).
    kill_id: str | None = None
    #: Learnt from an agent's report (after a failover, or back from unreachable): the state of
    #: the update at the head of its stream, not yet delivered. Reconciliation answers it until
    #: an update of the task is forwarded (None: nothing pending).
    reported_head: TaskState | None = None
    #: That update's uuid: the framework may acknowledge it having heard it from an earlier
    #: leader, and then no update of the task follows (Mesos: ``status_update_uuid``).
    reported_uuid: bytes | None = None
    #: Launched on revocable resources (lent from an unmet guarantee): the first to be taken.
    revocable: bool = False
    #: When the master launched it (0.0: learnt from an agent's report, time unknown).
    launched_at: float = 0.0
    #: Being stopped by the master itself, and the reason its KILLED update gets:
    #: TASK_PREEMPTED or RESOURCES_REVOKED (reclaim), AGENT_DRAINING (a drain's deadline).
    #: None: not stopped by the master.
    stop_reason: Reason | None = None
    #: Its custom executor (its own, or its group's); None: the built-in command executor.
    executor_id: ExecutorID | None = None
    #: Its launch added that executor to the master's view of the agent (the first task of it
    #: there): if the agent answers that it never heard of the task, the executor never started
    #: either, and is dropped with it (see tasks.on_status_update).
    new_executor: bool = False
    #: The scalars of ``resources`` in thousandths (what reclaim weighs; made once).
    milli: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.milli = self.resources.scalar_totals_view()

    @property
    def key(self) -> TaskKey:
        return (self.framework_id, self.info.task_id)


@dataclass(slots=True)
class OutstandingOffer:
    offer_id: OfferID
    framework_id: FrameworkID
    agent_id: AgentID
    role: str
    resources: Resources
    created_at: float
    gang_id: GangID | None = None
    #: Lent from an unmet guarantee (made only to frameworks that take revocable offers).
    revocable: bool = False
    #: Every offer id of the gang bundle this offer belongs to (itself included).
    bundle: tuple[OfferID, ...] = ()
    #: The scalars of ``resources`` in thousandths (what reclaim weighs; made once).
    milli: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.milli = self.resources.scalar_totals_view()


@dataclass(frozen=True, slots=True)
class Pending:
    """A proposed registry operation and what to do once it commits (or cannot)."""

    op: Operation
    then: Callable[[float], None] | None
    abandon: Callable[[], object] | None


@dataclass(slots=True)
class MasterState:
    config: MasterConfig
    allocator: Allocator
    agents: dict[AgentID, Agent] = field(default_factory=dict)
    agents_by_peer: dict[Peer, AgentID] = field(default_factory=dict)
    #: The agents in ``agents`` that are not ACTIVE (kept as their status changes).
    offline_agents: set[AgentID] = field(default_factory=set)
    #: The scalars of every agent in ``agents`` summed, in thousandths (kept as they come, go,
    #: and re-register with other resources).
    agent_totals: dict[str, int] = field(default_factory=dict)
    #: Agents that unregistered or were removed for good; they may not come back.
    removed_agents: set[AgentID] = field(default_factory=set)
    frameworks: dict[FrameworkID, Framework] = field(default_factory=dict)
    frameworks_by_peer: dict[Peer, FrameworkID] = field(default_factory=dict)
    #: Frameworks torn down; their ids may not subscribe again.
    removed_frameworks: set[FrameworkID] = field(default_factory=set)
    #: The most recently removed frameworks with their completed tasks, for operators (bounded).
    completed_frameworks: deque[Framework] = field(default_factory=deque)
    tasks: dict[TaskKey, Task] = field(default_factory=dict)
    #: The keys in ``tasks`` of frameworks not subscribed to this master (yet): agents report
    #: them as they re-register after a failover, and the framework takes them as it comes
    #: back, without a walk over every task.
    unclaimed_tasks: dict[FrameworkID, set[TaskKey]] = field(default_factory=dict)
    #: ``tasks`` and the completed histories counted by state (see ``tally``).
    tally: TaskTally = field(default_factory=TaskTally)
    #: ``tasks`` and the completed histories in the order of their latest change (``add_task``,
    #: ``set_status``), for the views of the tasks updated last.
    recency: Recency[Task] = field(default_factory=Recency)
    offers: dict[OfferID, OutstandingOffer] = field(default_factory=dict)
    outbox: list[Action] = field(default_factory=list)
    #: What the shell should log (bounded: a shell that never asks loses the oldest).
    notices: deque[Notice] = field(default_factory=lambda: deque(maxlen=1000))
    #: Agents whose free resources changed since the last allocation.
    dirty_agents: set[AgentID] = field(default_factory=set)
    #: A full allocation pass is owed (new framework, revive, ...): made at once when the
    #: last prompt pass is far enough back (see ``prompt_allocation``), else at the next tick.
    full_allocation_due: bool = True
    next_batch_at: float = 0.0
    #: No prompt (out-of-tick) full allocation before this time: bounds a subscription storm.
    next_prompt_at: float = 0.0
    next_ping_at: float = 0.0
    next_heartbeat_at: float = 0.0
    next_reclaim_at: float = 0.0
    #: Tasks on lent resources, and tasks reclaim is stopping: what a reclaim round looks at
    #: first, before every task (see reclaim.py).
    revocable_tasks: set[TaskKey] = field(default_factory=set)
    reclaiming: set[TaskKey] = field(default_factory=set)
    #: The replicated registry (read-only here: committed operations change it).
    registry: Registry = field(default_factory=Registry)
    #: Proposed registry operations awaiting commit: seq -> what to do then.
    pending: dict[int, Pending] = field(default_factory=dict)
    #: Agents with a registry change in flight (admission, unreachable, removal): nothing else
    #: about them is started until it commits. Peers whose registration is being admitted.
    busy_agents: set[AgentID] = field(default_factory=set)
    registering_peers: dict[Peer, AgentID] = field(default_factory=dict)
    busy_frameworks: set[FrameworkID] = field(default_factory=set)
    #: Frameworks whose removal is committing: their calls are refused as if already removed.
    removing_frameworks: set[FrameworkID] = field(default_factory=set)
    subscribing_peers: dict[Peer, FrameworkID] = field(default_factory=dict)
    #: After a failover: registry agents not back yet, and when the wait for them ends.
    recovering_agents: set[AgentID] = field(default_factory=set)
    recovery_expected: int = 0
    recovery_deadline: float | None = None
    #: No allocation before this time (unless enough agents are back); None: allocate.
    allocation_held_until: float | None = None
    #: Registry frameworks not re-subscribed yet -> when their failover timeout ends.
    absent_frameworks: dict[FrameworkID, float] = field(default_factory=dict)
    #: When this core became the leader's (its activation).
    leader_since: float = 0.0
    #: Inverse offers and the windows that started (see ``maintenance``).
    maintenance: MaintenanceState = field(default_factory=MaintenanceState)
    _serial: int = 0
    _proposals: int = 0

    # --- ids ---------------------------------------------------------------------------
    def mint(self, kind: str) -> str:
        """A new id, unique across masters' terms: the epoch is part of it."""
        self._serial += 1
        return f"e{self.config.epoch}-{kind}{self._serial}"

    @property
    def master_info(self) -> MasterInfo:
        c = self.config
        return MasterInfo(
            master_id=c.master_id, address=c.address, epoch=c.epoch, features=FEATURES
        )

    # --- registry ----------------------------------------------------------------------
    def propose(
        self,
        op: Operation,
        then: Callable[[float], None] | None = None,
        abandon: Callable[[], object] | None = None,
        *,
        now: float,
    ) -> None:
        """Change the registry; ``then(now)`` runs once the change is committed.

        Replicated, the daemon gets a ``Propose`` and reports back through ``Master.committed``
        (or ``abandoned``: then ``abandon()`` runs and the change never takes effect here).
        Otherwise the change is applied and ``then`` runs at once.
        """
        if not self.config.replicated:
            self.registry.apply(op)
            if then is not None:
                then(now)
            return
        self._proposals += 1
        self.pending[self._proposals] = Pending(op, then, abandon)
        self.outbox.append(Propose(self._proposals, op))

    # --- sending -----------------------------------------------------------------------
    def send(self, to: Peer, message: Message) -> None:
        self.outbox.append(Send(to, message, self.config.epoch))

    def send_framework(self, framework_id: FrameworkID, message: Message) -> None:
        """Send to a framework's scheduler if it is connected; otherwise drop."""
        fw = self.frameworks.get(framework_id)
        if fw is not None and fw.connected and fw.peer is not None:
            self.send(fw.peer, message)

    def send_agent(self, agent_id: AgentID, message: Message) -> None:
        agent = self.agents.get(agent_id)
        if agent is not None and agent.status is AgentStatus.ACTIVE:
            self.send(agent.peer, message)

    def notice(self, event: str, *, warning: bool = False, **fields: object) -> None:
        """Ask the shell to log ``event`` with ``fields`` (as a warning, or info)."""
        level = "warning" if warning else "info"
        self.notices.append(Notice(event, tuple((k, str(v)) for k, v in fields.items()), level))

    # --- agents ------------------------------------------------------------------------
    def count_agent(self, info: AgentInfo, sign: int) -> None:
        """Add (``sign`` 1) or take (-1) an agent's scalars in ``agent_totals``."""
        totals = self.agent_totals
        for name, milli in info.resources.scalar_totals_view().items():
            left = totals.get(name, 0) + sign * milli
            if left:
                totals[name] = left
            else:
                totals.pop(name, None)

    def drop_agent(self, agent_id: AgentID) -> Agent | None:
        """Take the agent out of ``agents`` (and its counts)."""
        agent = self.agents.pop(agent_id, None)
        if agent is not None:
            self.count_agent(agent.info, -1)
            self.offline_agents.discard(agent_id)
        return agent

    # --- tasks -------------------------------------------------------------------------
    def add_task(self, task: Task) -> None:
        key = task.key
        self.tasks[key] = task
        self.recency.touch(task)
        self.tally.live[task.state] += 1
        if task.revocable:
            self.revocable_tasks.add(key)
        agent = self.agents.get(task.agent_id)
        if agent is not None:
            agent.tasks.add(key)
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.tasks.add(key)
            fw.live[task.state] += 1
        else:
            self.unclaimed_tasks.setdefault(task.framework_id, set()).add(key)

    def forget_task(self, key: TaskKey, *, kept: bool = False) -> Task | None:
        """Take the task out of ``tasks``; ``kept``: ``keep_completed`` keeps it next."""
        task = self.tasks.pop(key, None)
        if task is None:
            return None
        if not kept:
            self.recency.drop(task)
        self.tally.live[task.state] -= 1
        self.revocable_tasks.discard(key)
        self.reclaiming.discard(key)
        agent = self.agents.get(task.agent_id)
        if agent is not None:
            agent.tasks.discard(key)
        fw = self.frameworks.get(task.framework_id)
        if fw is not None:
            fw.tasks.discard(key)
            fw.live[task.state] -= 1
        else:
            unclaimed = self.unclaimed_tasks.get(task.framework_id)
            if unclaimed is not None:
                unclaimed.discard(key)
                if not unclaimed:
                    del self.unclaimed_tasks[task.framework_id]
        return task

    def set_task_state(self, task: Task, state: TaskState) -> None:
        """Move one of the master's tasks to ``state`` (every change of state goes here)."""
        if self.tasks.get(task.key) is task:
            live = self.tally.live
            live[task.state] -= 1
            live[state] += 1
            fw = self.frameworks.get(task.framework_id)
            if fw is not None:
                fw.live[task.state] -= 1
                fw.live[state] += 1
        task.state = state

    def set_status(self, task: Task, status: TaskStatus) -> None:
        """The task's latest status is ``status`` (every status the master records goes here)."""
        task.status = status
        if task in self.recency:
            self.recency.touch(task)

    def keep_completed(self, fw: Framework, task: Task) -> None:
        """Keep a task that is over in ``fw``'s history (the oldest goes past the bound)."""
        fw.completed.append(task)
        self.tally.done[task.state] += 1
        bound = self.config.max_completed_tasks_per_framework
        while len(fw.completed) > bound:
            gone = fw.completed.popleft()
            self.tally.forget_done((gone,))
            self.recency.drop(gone)

    def keep_removed(self, fw: Framework) -> None:
        """Keep a removed framework, with its history, among the completed frameworks (the
        oldest goes past the bound)."""
        self.completed_frameworks.append(fw)
        while len(self.completed_frameworks) > self.config.max_completed_frameworks:
            gone = self.completed_frameworks.popleft().completed
            self.tally.forget_done(gone)
            for task in gone:
                self.recency.drop(task)

    def claim_tasks(self, fw: Framework) -> None:
        """Give ``fw`` (subscribing) the tasks of its id known before it subscribed, taken out
        of the unclaimed ones, and count them."""
        fw.tasks = self.unclaimed_tasks.pop(fw.framework_id, set())
        fw.live = Counter(self.tasks[key].state for key in fw.tasks)

    def recover(
        self,
        framework_id: FrameworkID,
        agent_id: AgentID,
        role: str,
        resources: Resources,
        now: float,
        refuse_seconds: float | None = None,
    ) -> None:
        """Return resources to the allocator, if their agent is still in it."""
        agent = self.agents.get(agent_id)
        if resources and agent is not None and agent.status is AgentStatus.ACTIVE:
            self.allocator.recover_resources(
                framework_id, agent_id, role, resources, now, refuse_seconds
            )
            self.dirty_agents.add(agent_id)

    def release_task(self, task: Task, now: float) -> None:
        """Give a task's resources back to the allocator, once."""
        if not task.released:
            task.released = True
            self.recover(task.framework_id, task.agent_id, task.role, task.resources, now)

    def master_status(
        self,
        task_id: TaskID,
        state: TaskState,
        reason: Reason | None,
        now: float,
        *,
        agent_id: AgentID | None = None,
        message: str = "",
        unreachable_time: float | None = None,
    ) -> TaskStatus:
        """A status the master itself generates: no uuid, never retried, no ACK expected."""
        return TaskStatus(
            task_id=task_id,
            state=state,
            source=StatusSource.MASTER,
            reason=reason,
            message=message,
            agent_id=agent_id,
            timestamp=now,
            unreachable_time=unreachable_time,
        )
