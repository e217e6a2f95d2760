"""Dynamic reservations and persistent volumes the master asked the agent to keep
(CHECKPOINT_RESOURCES).

The master sends the agent's whole set of dynamic reservations after every RESERVE and
UNRESERVE that touches it. The agent checkpoints the set (a ``resources`` record, kept apart
from the agent id so that a new id does not lose it) and reports it in every REGISTER_AGENT
and REREGISTER_AGENT, so that the master admits the agent with them again after an agent
restart or a master failover (Mesos: CheckpointResourcesMessage, ``checkpointed_resources``).
"""

from __future__ import annotations

from agora.agent.core.actions import CreateVolume, DestroyVolume, LinkVolumes
from agora.agent.core.state import AgentState, Executor, Task
from agora.sdk.messages import CheckpointResources

__all__ = ["link_volumes", "on_checkpoint_resources"]

_VOLUMES = "volumes"


def on_checkpoint_resources(st: AgentState, msg: CheckpointResources, _now: float) -> None:
    """Keep the new set; a volume that appears gets its directory, one that goes is deleted
    (after the checkpoint: the shell performs actions once the records are committed)."""
    if msg.resources == st.checkpointed_resources and msg.volumes == st.checkpointed_volumes:
        return
    before = {(v.role, v.volume_id) for v in st.checkpointed_volumes}
    after = {(v.role, v.volume_id) for v in msg.volumes}
    for role, volume_id in sorted(after - before):
        st.outbox.append(CreateVolume(role, volume_id))
    for role, volume_id in sorted(before - after):
        st.outbox.append(DestroyVolume(role, volume_id))
    st.checkpointed_resources = msg.resources
    st.checkpointed_volumes = msg.volumes
    st.dirty_resources = True


def link_volumes(st: AgentState, ex: Executor, tasks: list[Task]) -> None:
    """Before tasks go to their executor: the volumes they hold in their sandboxes
    (``tasks/<id>`` in the executor's; a custom executor's own sandbox too)."""
    fw = st.frameworks.get(ex.framework_id)
    for task in tasks:
        held = task.info.resources.named(_VOLUMES)
        if not held:
            continue
        command = task.info.command
        user = (command.user if command is not None else None) or (
            st.config.task_users.fallback(fw.info.user) if fw is not None else None
        )
        places = [f"{ex.sandbox}/tasks/{task.info.task_id}"]
        if not ex.builtin:
            places.append(ex.sandbox)
        for sandbox in places:
            st.outbox.append(LinkVolumes(sandbox, held, user or None))
