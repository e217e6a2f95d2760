"""Dynamic reservations kept by the agents (Mesos: CheckpointResourcesMessage).

The master's allocator holds an agent's total with its reservations; the static ones come from
the agent's own resources (``--resources``), the dynamic ones from RESERVE/UNRESERVE. After
every change the master sends the agent all its dynamic reservations (CHECKPOINT_RESOURCES);
the agent checkpoints them and reports them in its (re-)registration, and the master admits
it with them applied again, so that they survive an agent restart and a master failover.
"""

from __future__ import annotations

from agora.master.core.state import MasterState
from agora.sdk.ids import AgentID
from agora.sdk.messages import CheckpointResources
from agora.sdk.resources import ResourceError, Resources

__all__ = ["admitted_total", "dynamic", "send_checkpoint", "sync"]


def _reserved(resources: Resources) -> Resources:
    return resources - resources.unreserved()


def dynamic(st: MasterState, agent_id: AgentID) -> Resources:
    """The agent's dynamic reservations: its reserved total beyond its static reservations."""
    static = _reserved(st.agents[agent_id].info.resources)
    try:
        return _reserved(st.allocator.total(agent_id)) - static
    except ResourceError:  # pragma: no cover - reservations only ever grow past static
        return Resources()


def admitted_total(
    static: Resources, checkpointed: Resources
) -> tuple[Resources, Resources, str | None]:
    """The total to admit an agent with: its own resources with the reservations it reported
    applied (unreserved -> reserved). Returns (total, the reservations applied, a problem):
    reservations that do not fit what the agent now has unreserved (it was reconfigured) are
    dropped whole, with the problem saying so."""
    if not checkpointed:
        return static, Resources(), None
    if checkpointed.unreserved():
        return static, Resources(), f"checkpointed resources {checkpointed} hold unreserved ones"
    flat = checkpointed.flatten()
    if not static.unreserved().contains(flat):
        return static, Resources(), f"checkpointed {checkpointed} exceed the agent's {static}"
    return static - flat + checkpointed, checkpointed, None


def send_checkpoint(st: MasterState, agent_id: AgentID) -> None:
    """Tell the agent its dynamic reservations as they are now."""
    agent = st.agents.get(agent_id)
    if agent is not None:
        st.send(agent.peer, CheckpointResources(resources=dynamic(st, agent_id)))


def sync(st: MasterState, agent_id: AgentID, reported: Resources) -> None:
    """After a (re-)registration: correct the agent's checkpoint if it differs from ours (a
    CHECKPOINT_RESOURCES lost on the way, or reservations dropped on admission)."""
    if dynamic(st, agent_id) != reported:
        send_checkpoint(st, agent_id)
