"""The operator's view of the master: a snapshot of agents, frameworks, tasks and roles.

Operator calls that change things are in :mod:`operator_calls`.
"""

from __future__ import annotations

from collections.abc import Iterable

from agora.master.allocator import AllocatorError
from agora.master.core import partial
from agora.master.core.actions import Peer
from agora.master.core.state import Agent, Framework, MasterState, Task, TaskKey
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    GetState,
    RoleSummary,
    StateReply,
    TaskState,
    TaskSummary,
)
from agora.sdk.resources import Resources
from msgspec.structs import replace

__all__ = ["on_get_state", "roles", "snapshot"]


def on_get_state(st: MasterState, peer: Peer, query: GetState | None = None) -> None:
    st.send(peer, snapshot(st, query))


def snapshot(st: MasterState, query: GetState | None = None) -> StateReply:
    """Agents, live and completed frameworks, live then completed tasks, and roles, in a stable
    order; with ``query``'s limits or filters, only the rows it asks for (see GetState)."""
    live = [st.frameworks[fid] for fid in sorted(st.frameworks)]
    gone = list(st.completed_frameworks)
    frameworks = (
        *(_framework(st, fw, active=True) for fw in live),
        *(_framework(st, fw, active=False) for fw in gone),
    )
    reply = StateReply(
        master_info=st.master_info,
        frameworks=frameworks,
        roles=roles(st),
        cluster=st.config.cluster,
        leader_since=st.leader_since,
        insecure=st.config.insecure,
    )
    if query is None or query == _EVERYTHING:
        tasks = [st.tasks[key] for key in sorted(st.tasks)]
        for fw in (*live, *gone):
            tasks.extend(fw.completed)
        return replace(
            reply,
            agents=tuple(_agent(st, st.agents[aid]) for aid in sorted(st.agents)),
            tasks=tuple(_task(task) for task in tasks),
        )
    chosen = partial.select(st, query)
    return replace(
        reply,
        agents=tuple(_agent(st, agent) for agent in chosen.agents),
        tasks=tuple(_task(task) for task in chosen.tasks),
        partial=True,
        agents_total=chosen.agents_total,
        tasks_total=chosen.tasks_total,
        agents_unreachable=chosen.agents_unreachable,
        agents_draining=chosen.agents_draining,
        resources_total=chosen.resources_total,
        resources_allocated=chosen.resources_allocated,
    )


_EVERYTHING = GetState()
_RUNNING = frozenset({TaskState.RUNNING, TaskState.KILLING})
_STAGING = frozenset({TaskState.STAGING, TaskState.STARTING})
_LIVE = _RUNNING | _STAGING


def _effective_weights(st: MasterState) -> dict[str, float]:
    """Role weights in force: the master's config, overridden by operator calls (registry)."""
    return {**st.config.weights, **st.registry.weights}


def _effective_quotas(st: MasterState) -> dict[str, tuple[Resources, Resources | None]]:
    """Role quotas in force: the config's, overridden by operator calls (a removal is an empty
    quota in the registry)."""
    quotas = dict(st.config.quotas)
    quotas.update((role, (q.guarantee, q.limit)) for role, q in st.registry.quotas.items())
    return {role: q for role, q in quotas.items() if q[1] is not None or not q[0].is_empty()}


def roles(st: MasterState) -> tuple[RoleSummary, ...]:
    """Every role the master knows (configured, weighted, with quota, or a framework's),
    with the weight and quota in force and its share."""
    weights = _effective_weights(st)
    quotas = _effective_quotas(st)
    names = set(st.config.roles) | weights.keys() | quotas.keys()
    for fw in st.frameworks.values():
        names.update(fw.info.roles)
    rows = []
    for role in sorted(names):
        guarantee, limit = quotas.get(role, (None, None))
        rows.append(
            RoleSummary(
                name=role,
                weight=weights.get(role, 1.0),
                guarantee=guarantee,
                limit=limit,
                share=st.allocator.role_share(role),
            )
        )
    return tuple(rows)


def _agent(st: MasterState, agent: Agent) -> AgentSummary:
    total = agent.info.resources
    allocated = Resources()
    if st.allocator.has_agent(agent.agent_id):
        allocated = st.allocator.total(agent.agent_id) - st.allocator.available(agent.agent_id)
    entry = st.registry.agents.get(agent.agent_id)
    live = _count(st, agent.tasks, _LIVE)
    return AgentSummary(
        agent_id=agent.agent_id,
        hostname=agent.info.hostname,
        port=agent.info.port,
        http_port=agent.info.http_port,
        address=agent.info.address,
        status=agent.status.value,
        resources=total,
        allocated=allocated,
        attributes=agent.info.attributes,
        draining=entry is not None and entry.draining,
        tasks=live,
    )


def _framework(st: MasterState, fw: Framework, *, active: bool) -> FrameworkSummary:
    info = fw.info
    share: float | None = None
    if active:
        try:
            share = st.allocator.share(fw.framework_id)
        except AllocatorError:
            share = None
    return FrameworkSummary(
        framework_id=fw.framework_id,
        name=info.name,
        roles=info.roles,
        active=active,
        connected=active and fw.connected,
        user=info.user,
        principal=info.principal,
        share=share,
        offers=len(fw.offers) if active else 0,
        failovers=fw.failovers,
        running=_count(st, fw.tasks, _RUNNING),
        staging=_count(st, fw.tasks, _STAGING),
    )


def _count(st: MasterState, keys: Iterable[TaskKey], states: frozenset[TaskState]) -> int:
    """How many of the tasks ``keys`` names are in one of ``states``."""
    tasks = st.tasks
    return sum(1 for key in keys if (task := tasks.get(key)) is not None and task.state in states)


def _task(task: Task) -> TaskSummary:
    status = task.status
    return TaskSummary(
        task_id=task.info.task_id,
        framework_id=task.framework_id,
        agent_id=task.agent_id,
        name=task.info.name,
        state=task.state,
        reason=status.reason if status is not None else None,
        message=status.message if status is not None else "",
        exit_code=status.exit_code if status is not None else None,
        resources=task.resources,
        timestamp=status.timestamp if status is not None else 0.0,
        usage=task.usage,
    )
