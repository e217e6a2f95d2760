"""Operator calls: a snapshot of the master's state, and killing a task on an operator's word."""

from __future__ import annotations

from collections.abc import Iterable

from agora.master.core import tasks
from agora.master.core.actions import Peer
from agora.master.core.state import Agent, Framework, MasterState, Task
from agora.sdk.messages import (
    AgentSummary,
    Error,
    ErrorCode,
    FrameworkSummary,
    Kill,
    OperatorKill,
    StateReply,
    TaskSummary,
)
from agora.sdk.resources import Resources

__all__ = ["on_get_state", "on_operator_kill", "snapshot"]


def on_get_state(st: MasterState, peer: Peer) -> None:
    st.send(peer, snapshot(st))


def snapshot(st: MasterState) -> StateReply:
    """Agents, live and completed frameworks, and live then completed tasks, in a stable order."""
    live = [st.frameworks[fid] for fid in sorted(st.frameworks)]
    gone = list(st.completed_frameworks)
    task_rows = [_task(st.tasks[key]) for key in sorted(st.tasks)]
    for fw in (*live, *gone):
        task_rows.extend(_task(task) for task in fw.completed)
    return StateReply(
        master_info=st.master_info,
        agents=tuple(_agent(st, st.agents[aid]) for aid in sorted(st.agents)),
        frameworks=(
            *(_framework(fw, active=True) for fw in live),
            *(_framework(fw, active=False) for fw in gone),
        ),
        tasks=tuple(task_rows),
    )


def on_operator_kill(st: MasterState, peer: Peer, msg: OperatorKill, now: float) -> None:
    matches = [fw for fw in _frameworks(st, msg) if (fw.framework_id, msg.task_id) in st.tasks]
    if len(matches) != 1:
        problem = "no live task" if not matches else "several frameworks have a task"
        code = ErrorCode.UNKNOWN_TASK if not matches else ErrorCode.BAD_REQUEST
        st.send(peer, Error(message=f"{problem} with id {msg.task_id}", code=code))
        return
    fw = matches[0]
    tasks.on_kill(st, fw, Kill(framework_id=fw.framework_id, task_id=msg.task_id), now)


def _frameworks(st: MasterState, msg: OperatorKill) -> Iterable[Framework]:
    if msg.framework_id is None:
        return st.frameworks.values()
    fw = st.frameworks.get(msg.framework_id)
    return () if fw is None else (fw,)


def _agent(st: MasterState, agent: Agent) -> AgentSummary:
    total = agent.info.resources
    allocated = Resources()
    if st.allocator.has_agent(agent.agent_id):
        allocated = st.allocator.total(agent.agent_id) - st.allocator.available(agent.agent_id)
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
    )


def _framework(fw: Framework, *, active: bool) -> FrameworkSummary:
    info = fw.info
    return FrameworkSummary(
        framework_id=fw.framework_id,
        name=info.name,
        roles=info.roles,
        active=active,
        connected=active and fw.connected,
        user=info.user,
        principal=info.principal,
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
