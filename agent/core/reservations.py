"""Dynamic reservations the master asked the agent to keep (CHECKPOINT_RESOURCES).

The master sends the agent's whole set of dynamic reservations after every RESERVE and
UNRESERVE that touches it. The agent checkpoints the set (a ``resources`` record, kept apart
from the agent id so that a new id does not lose it) and reports it in every REGISTER_AGENT
and REREGISTER_AGENT, so that the master admits the agent with them again after an agent
restart or a master failover (Mesos: CheckpointResourcesMessage, ``checkpointed_resources``).
"""

from __future__ import annotations

from agora.agent.core.state import AgentState
from agora.sdk.messages import CheckpointResources

__all__ = ["on_checkpoint_resources"]


def on_checkpoint_resources(st: AgentState, msg: CheckpointResources, _now: float) -> None:
    if msg.resources == st.checkpointed_resources:
        return
    st.checkpointed_resources = msg.resources
    st.dirty_resources = True
