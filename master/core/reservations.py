"""Dynamic reservations and persistent volumes kept by the agents (Mesos:
CheckpointResourcesMessage).

The master's allocator holds an agent's total with its reservations and volumes; the static
reservations come from the agent's own resources (``--resources``), the dynamic ones from
RESERVE/UNRESERVE, the volumes from CREATE/DESTROY (volumes.py). After every change the master
sends the agent all its dynamic reservations and volumes (CHECKPOINT_RESOURCES); the agent
checkpoints them and reports them in its (re-)registration, and the master admits it with them
applied again, so that they survive an agent restart and a master failover.
"""

from __future__ import annotations

from collections.abc import Iterable

from agora.master.core import volumes as vol
from agora.master.core.offers import rescind_offers
from agora.master.core.state import MasterState
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import CheckpointResources, PersistentVolume
from agora.sdk.resources import ResourceError, Resources

__all__ = ["Admitted", "admitted_total", "dynamic", "rebuild", "send_checkpoint", "sync"]


def _reserved(resources: Resources) -> Resources:
    return resources - resources.unreserved()


def dynamic(st: MasterState, agent_id: AgentID) -> Resources:
    """The agent's dynamic reservations: its reserved total (volumes counted as the disk they
    were made of) beyond its static reservations."""
    agent = st.agents[agent_id]
    static = _reserved(agent.info.resources)
    try:
        total = vol.uncreate(st.allocator.total(agent_id), agent.volumes.values())
        return _reserved(total) - static
    except ResourceError:  # pragma: no cover - reservations only ever grow past static
        return Resources()


Admitted = tuple[Resources, list[PersistentVolume], list[str]]


def admitted_total(
    static: Resources, checkpointed: Resources, volumes: Iterable[PersistentVolume] = ()
) -> Admitted:
    """The total to admit an agent with: its own resources with the reservations it reported
    applied (unreserved -> reserved), then its volumes made of reserved disk. Returns (total,
    the volumes kept, problems): what does not fit what the agent now has (it was
    reconfigured) is dropped, and the problems say so."""
    problems: list[str] = []
    total = static
    if checkpointed.unreserved():
        problems.append(f"checkpointed resources {checkpointed} hold unreserved ones")
    elif checkpointed:
        flat = checkpointed.flatten()
        if static.unreserved().contains(flat):
            total = static - flat + checkpointed
        else:
            problems.append(f"checkpointed {checkpointed} exceed the agent's {static}")
    kept: list[PersistentVolume] = []
    for volume in volumes:
        wrong = vol.problem(volume)
        if wrong is None and not total.contains(vol.disk_of(volume)):
            wrong = f"volume {volume.volume_id}: {vol.disk_of(volume)} is not on the agent"
        if wrong is None and total.contains(vol.as_item(volume)):
            wrong = f"volume {volume.volume_id} of role {volume.role} is reported twice"
        if wrong is not None:
            problems.append(wrong)
            continue
        total = vol.create(total, [volume])
        kept.append(volume)
    return total, kept, problems


def send_checkpoint(st: MasterState, agent_id: AgentID) -> None:
    """Tell the agent its dynamic reservations and volumes as they are now."""
    agent = st.agents.get(agent_id)
    if agent is not None:
        volumes = tuple(v for _, v in sorted(agent.volumes.items()))
        message = CheckpointResources(resources=dynamic(st, agent_id), volumes=volumes)
        st.send(agent.peer, message)


def sync(
    st: MasterState,
    agent_id: AgentID,
    reported: Resources,
    volumes: Iterable[PersistentVolume] = (),
) -> None:
    """After a (re-)registration: correct the agent's checkpoint if it differs from ours (a
    CHECKPOINT_RESOURCES lost on the way, or reservations dropped on admission)."""
    agent = st.agents[agent_id]
    reported_volumes = {(v.role, v.volume_id): v for v in volumes}
    if dynamic(st, agent_id) != reported or agent.volumes != reported_volumes:
        send_checkpoint(st, agent_id)


def rebuild(
    st: MasterState,
    agent_id: AgentID,
    total: Resources,
    now: float,
    *,
    keep: frozenset[OfferID] = frozenset(),
    change: tuple[FrameworkID, str, Resources, Resources] | None = None,
) -> None:
    """Give the agent a new total in the allocator (the allocator converts only what is
    allocated, keeping amounts): the agent's offers but ``keep`` are rescinded, it is removed
    and added again with what each (framework, role) holds there, ``change`` = (framework,
    role, before, after) applied to that holding (an ACCEPT's own offer)."""
    others = sorted(o for o, off in st.offers.items() if off.agent_id == agent_id and o not in keep)
    rescind_offers(st, others, now)
    used = held(st, agent_id)
    if change is not None:
        framework_id, role, before, after = change
        used[(framework_id, role)] = used[(framework_id, role)] - before + after
    st.allocator.remove_agent(agent_id)
    st.allocator.add_agent(agent_id, total, now, used=used)
    entry = st.registry.agents.get(agent_id)
    if entry is not None and entry.draining:
        st.allocator.set_agent_active(agent_id, False)
    else:
        st.dirty_agents.add(agent_id)


def held(st: MasterState, agent_id: AgentID) -> dict[tuple[FrameworkID, str], Resources]:
    """What each (framework, role) holds on the agent in the allocator (offers included)."""
    agent = st.agents[agent_id]
    frameworks = set(st.frameworks) | {fid for fid, _ in agent.tasks}
    frameworks |= {fid for fid, _ in agent.executors}
    used: dict[tuple[FrameworkID, str], Resources] = {}
    for fid in sorted(frameworks):
        for (where, role), amount in st.allocator.allocated(fid).items():
            if where == agent_id and amount:
                used[(fid, role)] = amount
    return used
