"""Agents: registration, re-registration, health checks, unreachability and removal."""

from __future__ import annotations

from collections import defaultdict

from agora.master.core import recovery, reservations
from agora.master.core.actions import Peer
from agora.master.core.offers import rescind_offers
from agora.master.core.state import Agent, AgentStatus, MasterState, Task, TaskKey
from agora.master.core.tasks import complete, is_final, resend_kills
from agora.master.registry import (
    AdmitAgent,
    AgentEntry,
    MarkUnreachable,
    ReadmitAgent,
    RemoveAgent,
)
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    AgentReregistered,
    AgentTask,
    Error,
    ErrorCode,
    ExecutorInfo,
    Failure,
    Ping,
    Pong,
    Reason,
    ReconcileTasks,
    RegisterAgent,
    ReregisterAgent,
    ShutdownAgent,
    ShutdownFramework,
    TaskState,
    Update,
)
from agora.sdk.resources import Resources

__all__ = [
    "gc_unreachable",
    "mark_unreachable",
    "on_pong",
    "on_register",
    "on_reregister",
    "on_unregister",
    "ping_agents",
]


def _info_problem(info: AgentInfo) -> str | None:
    if not info.hostname:
        return "an agent needs a hostname"
    if not info.resources:
        return "an agent must offer some resources"
    return None


def on_register(st: MasterState, sender: Peer, msg: RegisterAgent, now: float) -> None:
    info = msg.agent_info
    known = st.agents_by_peer.get(sender)
    if known is not None and st.agents[known].info.hostname == info.hostname:
        # A retried registration whose answer was lost: answer again, same id.
        st.send(sender, AgentRegistered(agent_id=known, master_info=st.master_info))
        return
    if sender in st.registering_peers:
        return  # a retry while its admission commits: the answer comes with the commit
    problem = _info_problem(info)
    if problem is not None:
        st.send(sender, Error(message=problem, code=ErrorCode.BAD_REQUEST))
        return
    agent_id = AgentID(st.mint("A"))
    st.registering_peers[sender] = agent_id

    def admitted(now: float) -> None:
        st.registering_peers.pop(sender, None)
        _admit(st, sender, agent_id, msg, now, {})
        st.send(sender, AgentRegistered(agent_id=agent_id, master_info=st.master_info))
        reservations.sync(st, agent_id, msg.checkpointed_resources, msg.checkpointed_volumes)

    entry = AgentEntry(agent_id=agent_id, hostname=info.hostname)
    st.propose(
        AdmitAgent(agent=entry),
        admitted,
        lambda: st.registering_peers.pop(sender, None),
        now=now,
    )


def _admit(
    st: MasterState,
    peer: Peer,
    agent_id: AgentID,
    msg: RegisterAgent | ReregisterAgent,
    now: float,
    used: dict[tuple[FrameworkID, str], Resources],
) -> Agent:
    info = msg.agent_info
    old = st.agents_by_peer.get(peer)
    if old is not None and old != agent_id:
        del st.agents_by_peer[peer]
    agent = st.agents.get(agent_id)
    if agent is None:
        agent = Agent(
            agent_id=agent_id, info=info, peer=peer, status=AgentStatus.ACTIVE, registered_at=now
        )
        st.agents[agent_id] = agent
    else:
        st.count_agent(agent.info, -1)
    st.count_agent(info, +1)
    st.offline_agents.discard(agent_id)
    agent.info = info
    agent.peer = peer
    agent.status = AgentStatus.ACTIVE
    agent.unreachable_since = None
    agent.missed_pings = 0
    st.agents_by_peer[peer] = agent_id
    total, volumes, problems = reservations.admitted_total(
        info.resources, msg.checkpointed_resources, msg.checkpointed_volumes
    )
    for problem in problems:
        st.notice("checkpointed_resources_dropped", warning=True, agent_id=agent_id, reason=problem)
    agent.volumes = {(v.role, v.volume_id): v for v in volumes}
    st.allocator.add_agent(agent_id, total, now, used=used)
    entry = st.registry.agents.get(agent_id)
    if entry is not None and entry.draining:
        st.allocator.set_agent_active(agent_id, False)  # drained by an operator: no offers
    else:
        st.dirty_agents.add(agent_id)
    return agent


def on_reregister(st: MasterState, sender: Peer, msg: ReregisterAgent, now: float) -> None:
    agent_id = msg.agent_id
    problem = _info_problem(msg.agent_info) or (None if agent_id else "an agent id is required")
    if problem is not None:
        st.send(sender, Error(message=problem, code=ErrorCode.BAD_REQUEST))
        return
    if agent_id in st.removed_agents or st.registry.is_removed_agent(agent_id):
        st.send(sender, ShutdownAgent(message=f"agent {agent_id} was removed from the cluster"))
        return
    if agent_id in st.busy_agents:
        return  # a registry change about it is committing; the agent retries (Mesos does too)
    existing = st.agents.get(agent_id)
    if existing is not None and existing.status is AgentStatus.ACTIVE:
        _reconnect(st, sender, existing, msg, now)
        return
    report = _report(st, msg)
    problem = _readmit_problem(msg, report)
    if problem is not None:
        st.send(sender, Error(message=problem, code=ErrorCode.BAD_REQUEST))
        return
    entry = st.registry.agents.get(agent_id)
    if entry is not None and entry.unreachable_since is None:
        # Admitted in the registry (back after a failover): nothing to commit.
        st.recovering_agents.discard(agent_id)
        _readmit(st, sender, st.agents.get(agent_id), msg, now, report)
        return
    # Unreachable in the registry, or unknown to it: readmit once that is committed.
    st.busy_agents.add(agent_id)

    def readmitted(now: float) -> None:
        st.busy_agents.discard(agent_id)
        st.recovering_agents.discard(agent_id)
        if st.registry.is_removed_agent(agent_id):
            st.send(sender, ShutdownAgent(message=f"agent {agent_id} was removed"))
            return
        _readmit(st, sender, st.agents.get(agent_id), msg, now)

    op: ReadmitAgent | AdmitAgent = (
        ReadmitAgent(agent_id=agent_id)
        if entry is not None
        else AdmitAgent(agent=AgentEntry(agent_id=agent_id, hostname=msg.agent_info.hostname))
    )
    st.propose(op, readmitted, lambda: st.busy_agents.discard(agent_id), now=now)


def _reconnect(
    st: MasterState, sender: Peer, agent: Agent, msg: ReregisterAgent, now: float
) -> None:
    """Spurious re-registration of an agent the master has active: keep its tasks, rebind,
    and repair what the agent's report shows the master missed (Mesos: reconcileKnownSlave)."""
    if agent.peer != sender:
        st.agents_by_peer.pop(agent.peer, None)
        agent.peer = sender
        st.agents_by_peer[sender] = agent.agent_id
    agent.missed_pings = 0
    _adopt_unknown_tasks(st, agent, msg.tasks)
    # Executors whose exit the master never heard of (EXITED_EXECUTOR is sent once).
    reported = {(ex.framework_id, ex.executor_id) for ex in msg.executors}
    for key in sorted(set(agent.executors) - reported):
        info, role = agent.executors.pop(key)
        st.recover(key[0], agent.agent_id, role, info.resources, now)
    # Frameworks torn down while their SHUTDOWN_FRAMEWORK could not reach the agent.
    for framework_id in sorted({at.framework_id for at in msg.tasks} & st.removed_frameworks):
        st.send(sender, ShutdownFramework(framework_id=framework_id))
    st.send(sender, AgentReregistered(agent_id=agent.agent_id, master_info=st.master_info))
    reservations.sync(st, agent.agent_id, msg.checkpointed_resources, msg.checkpointed_volumes)
    resend_kills(st, agent, msg.tasks)
    _reconcile_unreported(st, sender, agent, msg.tasks)


def _reconcile_unreported(
    st: MasterState, sender: Peer, agent: Agent, reported: tuple[AgentTask, ...]
) -> None:
    """Tasks the master has on the agent that its report leaves out: their RUN_TASK reached a
    restarting agent too late (or crossed the report). Ask the agent about them; it answers for
    those it does not know, which otherwise would stay STAGING for ever (Mesos: the
    ReconcileTasksMessage of reconcileKnownSlave)."""
    known = {(at.framework_id, at.task.task_id) for at in reported}
    missing: dict[FrameworkID, list[TaskID]] = defaultdict(list)
    for key in sorted(agent.tasks):
        task = st.tasks.get(key)
        if key not in known and task is not None and not is_final(task.state):
            missing[key[0]].append(key[1])
    for framework_id, task_ids in sorted(missing.items()):
        fw = st.frameworks.get(framework_id)
        st.send(
            sender,
            ReconcileTasks(
                framework_id=framework_id,
                task_ids=tuple(task_ids),
                partition_aware=fw is not None and fw.partition_aware,
            ),
        )


def _readmit(
    st: MasterState,
    sender: Peer,
    existing: Agent | None,
    msg: ReregisterAgent,
    now: float,
    report: _Report | None = None,
) -> None:
    """An agent back from unreachable, or unknown to this master (after a failover).
    ``report``: :func:`_report` of ``msg`` taken now; without it (a registry change committed
    in between, and a framework may have been removed since the check) it is taken again."""
    agent_id = msg.agent_id
    reported, executors, roles, used = report if report is not None else _report(st, msg)
    orphans = {at.framework_id for at in msg.tasks} & st.removed_frameworks
    previously = set(existing.tasks) if existing is not None else set()
    agent = _admit(st, sender, agent_id, msg, now, dict(used))
    agent.executors = {
        (ex.framework_id, ex.executor_id): (ex, roles[(ex.framework_id, ex.executor_id)])
        for ex in executors
    }
    seen = set()
    for at in reported:
        key = (at.framework_id, at.task.task_id)
        seen.add(key)
        task = st.tasks.get(key)
        if task is None:
            task = _reported_task(st, agent_id, at)
            st.add_task(task)
        st.set_task_state(task, at.state)
        task.reported_head, task.reported_uuid = at.status_state, at.status_uuid
        task.released = is_final(at.state)
        if key in previously and at.status_uuid is None:
            # Back from unreachable with every update acknowledged: the framework heard
            # UNREACHABLE/LOST, so tell it the task's state again. With updates still pending
            # the agent re-sends them, in order, and announcing here would run ahead of them.
            status = st.master_status(
                at.task.task_id, at.state, Reason.AGENT_REREGISTERED, now, agent_id=agent_id
            )
            st.set_status(task, status)
            st.send_framework(at.framework_id, Update(status=status))
    for key in sorted(previously - seen):
        _vanished(st, key, agent_id, now)
    recovery.expect_frameworks(st, (at.framework_id for at in reported))
    for framework_id in sorted(orphans):
        st.send(sender, ShutdownFramework(framework_id=framework_id))
    st.send(sender, AgentReregistered(agent_id=agent_id, master_info=st.master_info))
    reservations.sync(st, agent_id, msg.checkpointed_resources, msg.checkpointed_volumes)
    resend_kills(st, agent, reported)


_Report = tuple[
    list[AgentTask],
    list[ExecutorInfo],
    dict[tuple[FrameworkID, ExecutorID], str],
    dict[tuple[FrameworkID, str], Resources],
]


def _report(st: MasterState, msg: ReregisterAgent) -> _Report:
    """The agent's report, minus removed frameworks: its tasks, its executors with their roles,
    and what the live ones hold per framework and role."""
    reported = [at for at in msg.tasks if at.framework_id not in st.removed_frameworks]
    executors = [ex for ex in msg.executors if ex.framework_id not in st.removed_frameworks]
    roles = {
        (ex.framework_id, ex.executor_id): _executor_role(st, ex.framework_id, msg.tasks)
        for ex in executors
    }
    used: dict[tuple[FrameworkID, str], Resources] = defaultdict(Resources)
    for at in reported:
        if not is_final(at.state):
            key = (at.framework_id, _role(st, at))
            used[key] = used[key] + at.task.resources
    for ex in executors:
        key = (ex.framework_id, roles[(ex.framework_id, ex.executor_id)])
        used[key] = used[key] + ex.resources
    return reported, executors, roles, used


def _readmit_problem(msg: ReregisterAgent, report: _Report) -> str | None:
    """Why the agent's report (``report``: its :func:`_report`) cannot be taken as it is (it
    claims more than it has)."""
    in_use = sum(report[3].values(), Resources())
    total = reservations.admitted_total(
        msg.agent_info.resources, msg.checkpointed_resources, msg.checkpointed_volumes
    )[0]
    if not total.contains(in_use):
        return f"tasks and executors use {in_use}, more than the agent's {total}"
    return None


def _vanished(st: MasterState, key: TaskKey, agent_id: AgentID, now: float) -> None:
    """A task the master knew on the agent that the agent no longer reports."""
    task = st.tasks.get(key)
    if task is None or is_final(task.state):
        return
    fw = st.frameworks.get(task.framework_id)
    state = TaskState.GONE if fw is not None and fw.partition_aware else TaskState.LOST
    status = st.master_status(key[1], state, Reason.AGENT_RESTARTED, now, agent_id=agent_id)
    st.set_task_state(task, state)
    st.set_status(task, status)
    task.released = True
    st.send_framework(task.framework_id, Update(status=status))
    st.forget_task(key)


def _adopt_unknown_tasks(st: MasterState, agent: Agent, reported: tuple[AgentTask, ...]) -> None:
    for at in reported:
        key = (at.framework_id, at.task.task_id)
        if key in st.tasks or at.framework_id in st.removed_frameworks:
            continue
        if is_final(at.state):
            # Over already, and usually just acknowledged and forgotten here (the ACK crossed
            # this message). Adopting it would keep it forever: no update about it follows.
            continue
        task = _reported_task(st, agent.agent_id, at)
        task.released = True  # not counted by the allocator: it never saw this task
        st.add_task(task)


def _reported_task(st: MasterState, agent_id: AgentID, at: AgentTask) -> Task:
    """The master's record of a task an agent reports when it re-registers."""
    return Task(
        info=at.task,
        framework_id=at.framework_id,
        agent_id=agent_id,
        role=_role(st, at),
        resources=at.task.resources,
        state=at.state,
        executor_id=at.task.executor.executor_id if at.task.executor is not None else None,
        reported_head=at.status_state,
        reported_uuid=at.status_uuid,
    )


def _role(st: MasterState, at: AgentTask) -> str:
    known = st.tasks.get((at.framework_id, at.task.task_id))
    if known is not None:
        return known.role
    return at.role


def _executor_role(st: MasterState, framework_id: FrameworkID, tasks: tuple[AgentTask, ...]) -> str:
    for at in tasks:
        if at.framework_id == framework_id:
            return _role(st, at)
    fw = st.frameworks.get(framework_id)
    return fw.info.roles[0] if fw is not None else "*"


def on_pong(st: MasterState, agent: Agent, msg: Pong) -> None:
    """The agent is alive; the container usage it reports is kept on each of its tasks."""
    agent.missed_pings = 0
    for usage in msg.usage:
        if usage.task_id is None:
            continue
        task = st.tasks.get((usage.framework_id, usage.task_id))
        if task is not None and task.agent_id == agent.agent_id and not is_final(task.state):
            task.usage = usage


def ping_agents(st: MasterState, now: float) -> None:
    """One health-check round: agents silent for too many pings become unreachable."""
    for agent in list(st.agents.values()):
        if agent.status is not AgentStatus.ACTIVE or agent.agent_id in st.busy_agents:
            continue
        if agent.missed_pings >= st.config.max_agent_ping_timeouts:
            _propose_unreachable(st, agent, now)
            continue
        agent.missed_pings += 1
        st.send(agent.peer, Ping(connected=True))


def _propose_unreachable(st: MasterState, agent: Agent, now: float) -> None:
    """Record the agent unreachable in the registry; its tasks change state once committed."""
    agent_id = agent.agent_id
    st.busy_agents.add(agent_id)

    def committed(now: float) -> None:
        st.busy_agents.discard(agent_id)
        current = st.agents.get(agent_id)
        if current is not None and current.status is AgentStatus.ACTIVE:
            mark_unreachable(st, current, now)

    st.propose(
        MarkUnreachable(agent_id=agent_id, time=now),
        committed,
        lambda: st.busy_agents.discard(agent_id),
        now=now,
    )


def mark_unreachable(st: MasterState, agent: Agent, now: float) -> None:
    """The agent stopped answering: its offers go, its tasks are UNREACHABLE (or LOST)."""
    _take_offline(st, agent, now)
    agent.status = AgentStatus.UNREACHABLE
    agent.unreachable_since = now
    st.offline_agents.add(agent.agent_id)
    for key in sorted(agent.tasks):
        task = st.tasks[key]
        task.released = True  # the allocator forgot the agent and everything on it
        if is_final(task.state):
            continue
        fw = st.frameworks.get(task.framework_id)
        state = TaskState.UNREACHABLE if fw is not None and fw.partition_aware else TaskState.LOST
        status = st.master_status(
            key[1], state, Reason.AGENT_REMOVED, now, agent_id=agent.agent_id, unreachable_time=now
        )
        st.send_framework(task.framework_id, Update(status=status))
    _failure(st, agent.agent_id)


def on_unregister(st: MasterState, agent: Agent, now: float) -> None:
    """The agent is leaving for good: its tasks are GONE (or LOST) and its id is retired."""
    agent_id = agent.agent_id
    if agent_id in st.busy_agents:
        return
    st.busy_agents.add(agent_id)

    def removed(now: float) -> None:
        st.busy_agents.discard(agent_id)
        current = st.agents.get(agent_id)
        if current is not None:
            _remove(st, current, now)

    st.propose(
        RemoveAgent(agent_id=agent_id), removed, lambda: st.busy_agents.discard(agent_id), now=now
    )


def remove_by_operator(st: MasterState, agent: Agent, now: float) -> None:
    """An operator marked the agent gone (committed): as an unregistration, but its tasks are
    GONE_BY_OPERATOR, and a connected agent is told to shut down."""
    if agent.status is AgentStatus.ACTIVE:
        st.send(agent.peer, ShutdownAgent(message=f"agent {agent.agent_id} was marked gone"))
    _remove(st, agent, now, by_operator=True)


def _remove(st: MasterState, agent: Agent, now: float, *, by_operator: bool = False) -> None:
    _take_offline(st, agent, now)
    gone, reason = TaskState.GONE, Reason.AGENT_REMOVED
    if by_operator:
        gone, reason = TaskState.GONE_BY_OPERATOR, Reason.AGENT_REMOVED_BY_OPERATOR
    for key in sorted(agent.tasks):
        task = st.tasks[key]
        if not is_final(task.state):
            fw = st.frameworks.get(task.framework_id)
            state = gone if fw is not None and fw.partition_aware else TaskState.LOST
            status = st.master_status(key[1], state, reason, now, agent_id=agent.agent_id)
            st.set_task_state(task, state)
            st.set_status(task, status)
            st.send_framework(task.framework_id, Update(status=status))
        complete(st, task)  # operators still see how it ended (agora tasks --all)
    st.drop_agent(agent.agent_id)
    st.removed_agents.add(agent.agent_id)
    _failure(st, agent.agent_id)


def gc_unreachable(st: MasterState, now: float) -> None:
    """Forget unreachable agents after ``unreachable_gc_age`` or beyond ``max_unreachable_agents``
    (oldest first). Their frameworks already heard UNREACHABLE/LOST; nothing more is sent, and
    the agent is refused if it ever comes back."""
    cfg = st.config
    unreachable = sorted(
        (a for a in st.agents.values() if a.unreachable_since is not None),
        key=lambda a: (a.unreachable_since, a.agent_id),
    )
    excess = len(unreachable) - cfg.max_unreachable_agents
    for i, agent in enumerate(unreachable):
        assert agent.unreachable_since is not None
        if agent.agent_id in st.busy_agents:
            continue
        if i < excess or now - agent.unreachable_since >= cfg.unreachable_gc_age:
            _propose_forget(st, agent.agent_id, now)


def _propose_forget(st: MasterState, agent_id: AgentID, now: float) -> None:
    st.busy_agents.add(agent_id)

    def forget(_now: float) -> None:
        st.busy_agents.discard(agent_id)
        agent = st.drop_agent(agent_id)
        if agent is not None:
            for key in list(agent.tasks):
                st.forget_task(key)
        st.removed_agents.add(agent_id)

    st.propose(
        RemoveAgent(agent_id=agent_id), forget, lambda: st.busy_agents.discard(agent_id), now=now
    )


def _take_offline(st: MasterState, agent: Agent, now: float) -> None:
    offers = [o.offer_id for o in st.offers.values() if o.agent_id == agent.agent_id]
    # Rescind first, while the allocator still knows the agent, then drop the agent from it.
    rescind_offers(st, offers, now)
    st.allocator.remove_agent(agent.agent_id)
    st.dirty_agents.discard(agent.agent_id)
    if st.agents_by_peer.get(agent.peer) == agent.agent_id:
        del st.agents_by_peer[agent.peer]


def _failure(st: MasterState, agent_id: AgentID) -> None:
    for framework_id in list(st.frameworks):
        st.send_framework(framework_id, Failure(agent_id=agent_id))
