"""GET_STATE's answer: the master's :class:`~agora.master.core.view.StateView` as a StateReply.

Operator calls that change things are in :mod:`operator_calls`.
"""

from __future__ import annotations

from agora.master.core.actions import Peer
from agora.master.core.state import Agent, MasterState, Task
from agora.master.core.view import LIVE, RUNNING, STAGING, FrameworkRow, StateView
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    GetState,
    StateReply,
    TaskSummary,
)
from msgspec.structs import replace

__all__ = ["on_get_state", "snapshot"]


def on_get_state(st: MasterState, peer: Peer, query: GetState | None = None) -> None:
    st.send(peer, snapshot(st, query))


def snapshot(st: MasterState, query: GetState | None = None) -> StateReply:
    """Agents, live and completed frameworks, live then completed tasks, and roles, in a stable
    order; with ``query``'s limits or filters, only the rows it asks for (see GetState)."""
    view = StateView(st)
    rows = view.frameworks()
    reply = StateReply(
        master_info=view.master_info,
        frameworks=tuple(_framework(view, row) for row in rows),
        roles=view.roles(),
        cluster=view.cluster,
        leader_since=view.leader_since,
        insecure=view.insecure,
        maintenance=view.maintenance(),
    )
    if query is None or query == _EVERYTHING:
        return replace(
            reply,
            agents=tuple(_agent(view, agent) for agent in view.agents()),
            tasks=tuple(_task(task) for task in view.tasks(rows)),
        )
    chosen = view.select(query)
    return replace(
        reply,
        agents=tuple(_agent(view, agent) for agent in chosen.agents),
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


def _agent(view: StateView, agent: Agent) -> AgentSummary:
    info = agent.info
    return AgentSummary(
        agent_id=agent.agent_id,
        hostname=info.hostname,
        port=info.port,
        http_port=info.http_port,
        address=info.address,
        status=agent.status.value,
        resources=info.resources,
        allocated=view.allocated(agent),
        attributes=info.attributes,
        draining=view.draining(agent),
        tasks=view.count(agent.tasks, LIVE),
        drained=view.drained(agent),
        drain_deadline=view.drain_deadline(agent),
    )


def _framework(view: StateView, row: FrameworkRow) -> FrameworkSummary:
    fw = row.framework
    info = fw.info
    active = row.active
    return FrameworkSummary(
        framework_id=fw.framework_id,
        name=info.name,
        roles=info.roles,
        active=active,
        connected=active and fw.connected,
        user=info.user,
        principal=info.principal,
        share=row.share,
        offers=row.offers,
        failovers=fw.failovers,
        running=view.framework_count(fw, RUNNING),
        staging=view.framework_count(fw, STAGING),
    )


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
