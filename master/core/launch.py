"""ACCEPT and DECLINE: validate offers and tasks, launch, (un)reserve, return what was not used."""

from __future__ import annotations

from dataclasses import dataclass, field

from agora.master.core import reservations, volume_ops
from agora.master.core.offers import close_offer, with_bundles
from agora.master.core.run_as import effective_users
from agora.master.core.state import Framework, MasterState, OutstandingOffer, Task
from agora.sdk.ids import AgentID, ExecutorID, OfferID, TaskID, id_problem
from agora.sdk.messages import (
    Accept,
    Create,
    Decline,
    Destroy,
    Error,
    ErrorCode,
    ExecutorInfo,
    FrameworkInfo,
    Launch,
    LaunchGroup,
    Operation,
    Reason,
    Reserve,
    RunTask,
    RunTaskGroup,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    Unreserve,
    Update,
)
from agora.sdk.resources import UNRESERVED, ResourceError, Resources
from msgspec.structs import replace

__all__ = ["on_accept", "on_decline"]


def on_decline(st: MasterState, fw: Framework, msg: Decline, now: float) -> None:
    refuse = refusal(st, msg.filters.refuse_seconds)
    for offer_id in with_bundles(st, msg.offer_ids):
        offer = st.offers.get(offer_id)
        if offer is not None and offer.framework_id == fw.framework_id:
            close_offer(st, offer_id, now, refuse_seconds=refuse)


def _offers_problem(st: MasterState, fw: Framework, offer_ids: tuple[OfferID, ...]) -> str | None:
    if not offer_ids:
        return "ACCEPT names no offers"
    if len(set(offer_ids)) != len(offer_ids):
        return "ACCEPT names an offer twice"
    offers: list[OutstandingOffer] = []
    for offer_id in offer_ids:
        offer = st.offers.get(offer_id)
        if offer is None or offer.framework_id != fw.framework_id:
            return f"offer {offer_id} is no longer valid"
        offers.append(offer)
    bundles = {o.bundle for o in offers if o.bundle}
    if bundles:
        if len(bundles) > 1 or set(next(iter(bundles))) != set(offer_ids):
            return "a gang offer must be accepted whole, and alone"
        return None
    if len({o.agent_id for o in offers}) > 1:
        return "offers from different agents cannot be combined"
    return None


def on_accept(st: MasterState, fw: Framework, msg: Accept, now: float) -> None:
    problem = _offers_problem(st, fw, msg.offer_ids)
    if problem is not None:
        _refuse_accept(st, fw, msg, problem, now)
        return
    launch = _Launch(st, fw, now, {oid: st.offers[oid] for oid in msg.offer_ids})
    for op in msg.operations:
        launch.apply(op)
    # An ACCEPT without operations is a DECLINE and gets its floor; what is left of offers an
    # ACCEPT did something with comes back as the framework asked (that is progress, not a spin).
    refuse = (
        msg.filters.refuse_seconds if msg.operations else refusal(st, msg.filters.refuse_seconds)
    )
    for offer_id, remaining in launch.remaining.items():
        close_offer(st, offer_id, now, unused=remaining, refuse_seconds=refuse)


def refusal(st: MasterState, refuse_seconds: float) -> float:
    """How long declined resources stay away from the framework: at least the master's floor,
    so that a scheduler declining everything with ``refuse_seconds=0`` cannot spin the master."""
    return max(refuse_seconds, st.config.min_refuse_seconds)


def _refuse_accept(st: MasterState, fw: Framework, msg: Accept, problem: str, now: float) -> None:
    """Invalid offers: every task in the call is LOST/DROPPED; valid offers return unfiltered."""
    for offer_id in with_bundles(st, msg.offer_ids):
        offer = st.offers.get(offer_id)
        if offer is not None and offer.framework_id == fw.framework_id:
            close_offer(st, offer_id, now)
    state = TaskState.DROPPED if fw.partition_aware else TaskState.LOST
    for task in _tasks_of(msg.operations):
        status = st.master_status(
            task.task_id, state, Reason.INVALID_OFFERS, now, agent_id=task.agent_id, message=problem
        )
        st.send_framework(fw.framework_id, Update(status=status))


def _tasks_of(operations: tuple[Operation, ...]) -> list[TaskInfo]:
    tasks: list[TaskInfo] = []
    for op in operations:
        if isinstance(op, Launch):
            tasks.extend(op.task_infos)
        elif isinstance(op, LaunchGroup):
            tasks.extend(op.task_group.tasks)
    return tasks


@dataclass
class _Launch:
    """One ACCEPT's operations applied, in order, against its offers' resources."""

    st: MasterState
    fw: Framework
    now: float
    offers: dict[OfferID, OutstandingOffer]
    remaining: dict[OfferID, Resources] = field(init=False)
    seen_task_ids: set[TaskID] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.remaining = {oid: o.resources for oid, o in self.offers.items()}

    def apply(self, op: Operation) -> None:
        if isinstance(op, Launch):
            for task in op.task_infos:
                self._launch([task], None)
        elif isinstance(op, LaunchGroup):
            self._launch(list(op.task_group.tasks), op.executor)
        elif isinstance(op, Reserve):
            self._convert("RESERVE", op.resources, reserve=True)
        elif isinstance(op, Unreserve):
            self._convert("UNRESERVE", op.resources, reserve=False)
        else:
            self._volumes(op)

    # ------------------------------------------------------------------ persistent volumes

    def _volumes(self, op: Create | Destroy) -> None:
        """CREATE or DESTROY persistent volumes (volume_ops.py); an invalid one is an ERROR."""
        create = isinstance(op, Create)
        problem, found = volume_ops.plan(
            self.st, self.fw, self.offers, self.remaining, op.volumes, create=create
        )
        if problem is not None or found is None:
            ids = ",".join(v.volume_id for v in op.volumes)
            self.st.send_framework(
                self.fw.framework_id,
                Error(message=f"{op.TYPE} {ids}: {problem}", code=ErrorCode.BAD_REQUEST),
            )
            return
        offer_id, before, after, changed = found
        offer = self.offers[offer_id]
        agent = self.st.agents[offer.agent_id]
        total = self.st.allocator.total(offer.agent_id) - before + after
        change = (self.fw.framework_id, offer.role, before, after)
        keep = frozenset(self.offers)
        reservations.rebuild(self.st, offer.agent_id, total, self.now, keep=keep, change=change)
        self.remaining[offer_id] = self.remaining[offer_id] - before + after
        for volume in changed:
            key = (volume.role, volume.volume_id)
            if create:
                agent.volumes[key] = volume
            else:
                agent.volumes.pop(key, None)
        reservations.send_checkpoint(self.st, offer.agent_id)
        self.st.notice(
            "volumes_created" if create else "volumes_destroyed",
            agent_id=offer.agent_id,
            framework_id=self.fw.framework_id,
            volumes=",".join(f"{v.role}/{v.volume_id}" for v in changed),
        )

    # ------------------------------------------------------------------ reservations

    def _convert(self, kind: str, resources: Resources, *, reserve: bool) -> None:
        """RESERVE (unreserved -> reserved to the offer's role) or UNRESERVE (the inverse).

        The resources must be in what is left of one accepted offer; the agent's total and
        that offer's remainder change alike, so later operations of this ACCEPT see the new
        roles and what stays unused goes back to the allocator with them. An invalid
        operation changes nothing and is answered with an ERROR; later ones still run.

        The agent is sent its new set of dynamic reservations to checkpoint, so that they
        survive its restart and a master failover (reservations.py).
        """
        problem, found = self._convert_problem(resources, reserve=reserve)
        if problem is not None or found is None:
            self.st.send_framework(
                self.fw.framework_id,
                Error(message=f"{kind} {resources}: {problem}", code=ErrorCode.BAD_REQUEST),
            )
            return
        offer_id, before, after = found
        offer = self.offers[offer_id]
        self.st.allocator.convert(offer.agent_id, self.fw.framework_id, offer.role, before, after)
        self.remaining[offer_id] = self.remaining[offer_id] - before + after
        reservations.send_checkpoint(self.st, offer.agent_id)

    def _convert_problem(
        self, resources: Resources, *, reserve: bool
    ) -> tuple[str | None, tuple[OfferID, Resources, Resources] | None]:
        """What is wrong with the operation, or (offer, before, after) to apply."""
        if not resources:
            return "no resources given", None
        roles = resources.roles()
        if UNRESERVED in roles:
            return "resources must be reserved to a role, not unreserved", None
        if len(roles) != 1:
            return f"resources are reserved to several roles {sorted(roles)}", None
        role = next(iter(roles))
        if role not in self.fw.info.roles:
            return f"the framework is not in role {role!r}", None
        matching = [oid for oid, o in self.offers.items() if o.role == role]
        if not matching:
            offered = sorted({o.role for o in self.offers.values()})
            return f"role {role!r} does not match the offers' role(s) {offered}", None
        flat = resources.flatten(UNRESERVED)
        before, after = (flat, resources) if reserve else (resources, flat)
        for offer_id in matching:
            if not self.remaining[offer_id].contains(before):
                continue
            if not reserve:
                problem = self._static_problem(self.offers[offer_id].agent_id, role, resources)
                if problem is not None:
                    return problem, None
            return None, (offer_id, before, after)
        return f"{before} exceeds what remains of the accepted offers", None

    def _static_problem(self, agent_id: AgentID, role: str, resources: Resources) -> str | None:
        """Only dynamic reservations may be unreserved: those beyond the agent's own."""
        static = self.st.agents[agent_id].info.resources.reserved(role)
        try:
            dynamic = self.st.allocator.total(agent_id).reserved(role) - static
        except ResourceError:  # pragma: no cover - reservations only ever grow past static
            dynamic = Resources()
        if not dynamic.contains(resources):
            return f"only dynamically reserved resources can be unreserved ({dynamic} are)"
        return None

    def _launch(self, tasks: list[TaskInfo], group_executor: ExecutorInfo | None) -> None:
        """Launch ``tasks`` all-or-nothing (one task, or one task group)."""
        reason = Reason.TASK_INVALID
        problem, charges = self._validate(tasks, group_executor)
        info = self.fw.info
        if problem is None and self.st.config.run_as is not None:
            problem, info = self._run_as_problem(tasks, group_executor)
            reason = Reason.TASK_UNAUTHORIZED
            if problem is not None:
                self.st.notice(
                    "task_unauthorized",
                    warning=True,
                    framework_id=self.fw.framework_id,
                    principal=info.principal,
                    tasks=",".join(t.task_id for t in tasks),
                    reason=problem,
                )
        if problem is not None:
            for task in tasks:
                status = self.st.master_status(
                    task.task_id,
                    TaskState.ERROR,
                    reason,
                    self.now,
                    agent_id=task.agent_id,
                    message=problem,
                )
                self.st.send_framework(self.fw.framework_id, Update(status=status))
            return
        st, fw = self.st, self.fw
        for offer_id, amount in charges.items():
            self.remaining[offer_id] = self.remaining[offer_id] - amount
        offer = self.offers[next(iter(charges))]
        # On lent resources if any of what it was charged came from a revocable offer.
        revocable = any(self.offers[oid].revocable for oid, amount in charges.items() if amount)
        agent = st.agents[offer.agent_id]
        executor = group_executor or tasks[0].executor
        new_executor = False
        if executor is not None and (fw.framework_id, executor.executor_id) not in agent.executors:
            agent.executors[(fw.framework_id, executor.executor_id)] = (executor, offer.role)
            new_executor = True
        for task in tasks:
            self.seen_task_ids.add(task.task_id)
            st.add_task(
                Task(
                    info=task,
                    framework_id=fw.framework_id,
                    agent_id=task.agent_id,
                    role=offer.role,
                    resources=task.resources,
                    state=TaskState.STAGING,
                    revocable=revocable,
                    launched_at=self.now,
                    executor_id=executor.executor_id if executor is not None else None,
                    new_executor=new_executor,
                )
            )
        if group_executor is not None:
            st.send(
                agent.peer,
                RunTaskGroup(
                    framework_info=info,
                    framework_id=fw.framework_id,
                    executor=group_executor,
                    task_group=TaskGroupInfo(tasks=tuple(tasks)),
                    role=offer.role,
                ),
            )
        else:
            st.send(
                agent.peer,
                RunTask(
                    framework_info=info,
                    framework_id=fw.framework_id,
                    task=tasks[0],
                    role=offer.role,
                ),
            )

    def _run_as_problem(
        self, tasks: list[TaskInfo], group_executor: ExecutorInfo | None
    ) -> tuple[str | None, FrameworkInfo]:
        """The ACL's run_as rule: why a task may not run as its user (None: all may), and the
        framework info to send the agent, carrying the principal's default user when the
        framework names none (so the agent never falls back on its own identity)."""
        policy, info = self.st.config.run_as, self.fw.info
        assert policy is not None
        principal = info.principal
        fallback = info.user or policy.default_user(principal)
        for task in tasks:
            for user in effective_users(task, group_executor, fallback):
                problem = policy.problem(principal, user)
                if problem is not None:
                    return f"task {task.task_id}: {problem}", info
        if not info.user and fallback:
            info = replace(info, user=fallback)
        return None, info

    def _validate(
        self, tasks: list[TaskInfo], group_executor: ExecutorInfo | None
    ) -> tuple[str | None, dict[OfferID, Resources]]:
        if not tasks:
            return "a task group needs at least one task", {}
        agent_ids = {t.agent_id for t in tasks}
        if len(agent_ids) != 1:
            return "the tasks of a group must all be on one agent", {}
        agent_id = next(iter(agent_ids))
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            return "task ids repeat within the group", {}
        for task in tasks:
            problem = self._task_problem(task, group_executor)
            if problem is not None:
                return f"task {task.task_id}: {problem}", {}
        need = Resources()
        for task in tasks:
            need = need + task.resources
        executor = group_executor or tasks[0].executor
        if executor is not None:
            problem = self._executor_problem(agent_id, executor)
            if problem is not None:
                return problem, {}
            if self._known_executor(agent_id, executor.executor_id) is None:
                need = need + executor.resources
        # Ordinary offers first: a task lands on lent (revocable) resources only if it must.
        mine = sorted(
            (oid for oid, o in self.offers.items() if o.agent_id == agent_id),
            key=lambda oid: self.offers[oid].revocable,
        )
        for offer_id in mine:
            if self.remaining[offer_id].contains(need):
                return None, {offer_id: need}
        for role in sorted({self.offers[oid].role for oid in mine}):
            charges = self._split(need, [oid for oid in mine if self.offers[oid].role == role])
            if charges is not None:
                return None, charges
        return f"resources {need} exceed what the accepted offers hold on agent {agent_id}", {}

    def _split(self, need: Resources, offer_ids: list[OfferID]) -> dict[OfferID, Resources] | None:
        """``need`` charged kind by kind across ``offer_ids`` (one agent, one role): an agent's
        ordinary and revocable offers hold different parts of it (its memory in one, lent cpus
        in the other, or some cpus in each). A scalar of one reservation may be split; ports
        and sets come from one offer. None: they do not hold it."""
        charges: dict[OfferID, Resources] = {}
        for name in sorted(need.names()):
            part = need.named(name)
            whole = next(
                (
                    oid
                    for oid in offer_ids
                    if (self.remaining[oid] - charges.get(oid, Resources())).contains(part)
                ),
                None,
            )
            if whole is not None:
                charges[whole] = charges.get(whole, Resources()) + part
                continue
            roles = part.roles()
            if len(roles) != 1 or name not in part.scalar_totals_milli():
                return None
            role = next(iter(roles))
            left = part.scalar_totals_milli()[name]
            for oid in offer_ids:
                charged = charges.get(oid, Resources())
                have = (self.remaining[oid] - charged).filter_role(role).scalar_totals_milli()
                take = min(have.get(name, 0), left)
                if take > 0:
                    charges[oid] = charged + Resources.scalars(role, **{name: take / 1000})
                    left -= take
            if left > 0:
                return None
        return charges

    def _task_problem(self, task: TaskInfo, group_executor: ExecutorInfo | None) -> str | None:
        problem = id_problem(task.task_id)
        if problem is not None:
            return f"task id {problem}"
        if (
            task.task_id in self.seen_task_ids
            or (self.fw.framework_id, task.task_id) in self.st.tasks
        ):
            return "task id is already in use"
        if all(o.agent_id != task.agent_id for o in self.offers.values()):
            return f"agent {task.agent_id} is not the agent of the accepted offers"
        if not task.resources:
            return "a task must use some resources"
        if group_executor is not None:
            if task.executor is not None and task.executor != group_executor:
                return "a task in a group must not name another executor"
            return None
        if (task.command is None) == (task.executor is None):
            return "a task needs exactly one of command and executor"
        return None

    def _executor_problem(self, agent_id: AgentID, executor: ExecutorInfo) -> str | None:
        problem = id_problem(executor.executor_id)
        if problem is not None:
            return f"executor id {problem}"
        if executor.framework_id != self.fw.framework_id:
            return f"executor {executor.executor_id} belongs to another framework"
        known = self._known_executor(agent_id, executor.executor_id)
        if known is not None and known != executor:
            return f"executor {executor.executor_id} is already running with a different definition"
        return None

    def _known_executor(self, agent_id: AgentID, executor_id: ExecutorID) -> ExecutorInfo | None:
        running = self.st.agents[agent_id].executors.get((self.fw.framework_id, executor_id))
        return running[0] if running is not None else None
