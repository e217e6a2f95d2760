"""The operator calls RESERVE_RESOURCES and UNRESERVE_RESOURCES: reserve free resources of an
agent to a role, or give dynamic reservations back, without a framework's offer.

The resources must be free on the agent (outstanding offers there are rescinded to free them;
what tasks use cannot be reserved or unreserved). The agent's total is rebuilt in the allocator
with the new roles, what runs there keeps its allocation, and the agent is sent its new set of
dynamic reservations to checkpoint (reservations.py). A refused call changes nothing.
"""

from __future__ import annotations

from typing import Protocol

from agora.master.core import reservations
from agora.master.core.state import AgentStatus, MasterState
from agora.sdk._resources_base import valid_role
from agora.sdk.ids import AgentID
from agora.sdk.messages import ErrorCode, ReserveResources, UnreserveResources
from agora.sdk.resources import UNRESERVED, Resources

__all__ = ["on_reserve", "on_unreserve"]


class Answer(Protocol):
    """How an operator call is answered (``operator_calls._Call``)."""

    def done(self, text: str) -> None: ...

    def refuse(self, code: ErrorCode, text: str) -> None: ...


def on_reserve(st: MasterState, call: Answer, msg: ReserveResources, now: float) -> None:
    _convert(st, call, msg.agent_id, msg.resources, reserve=True, now=now)


def on_unreserve(st: MasterState, call: Answer, msg: UnreserveResources, now: float) -> None:
    _convert(st, call, msg.agent_id, msg.resources, reserve=False, now=now)


def _convert(
    st: MasterState,
    call: Answer,
    agent_id: AgentID,
    resources: Resources,
    *,
    reserve: bool,
    now: float,
) -> None:
    problem = _problem(st, agent_id, resources, reserve=reserve)
    if problem is not None:
        call.refuse(ErrorCode.BAD_REQUEST, problem)
        return
    flat = resources.flatten(UNRESERVED)
    before, after = (flat, resources) if reserve else (resources, flat)
    reservations.rebuild(st, agent_id, st.allocator.total(agent_id) - before + after, now)
    reservations.send_checkpoint(st, agent_id)
    st.notice(
        "resources_reserved" if reserve else "resources_unreserved",
        agent_id=agent_id,
        resources=resources,
    )
    verb = "reserved" if reserve else "unreserved"
    call.done(f"{resources} {verb} on agent {agent_id}")


def _problem(
    st: MasterState, agent_id: AgentID, resources: Resources, *, reserve: bool
) -> str | None:
    agent = st.agents.get(agent_id)
    if agent is None or agent.status is not AgentStatus.ACTIVE:
        return f"no active agent {agent_id}"
    if not resources:
        return "no resources given"
    roles = resources.roles()
    if UNRESERVED in roles:
        return f"{resources}: resources must name a role, as in cpus(db):2"
    if len(roles) != 1:
        return f"{resources}: resources are reserved to several roles {sorted(roles)}"
    role = next(iter(roles))
    if not valid_role(role):
        return f"invalid role name {role!r}"
    if st.config.roles and role not in st.config.roles:
        return f"role {role!r} is not one of this master's roles"
    free = st.allocator.available(agent_id)
    for offer in st.offers.values():
        if offer.agent_id == agent_id and not offer.revocable:
            free = free + offer.resources
    if reserve:
        flat = resources.flatten(UNRESERVED)
        if not free.contains(flat):
            return f"{flat} is not free on agent {agent_id} (free: {free.unreserved()})"
        return None
    dynamic = reservations.dynamic(st, agent_id)
    if not dynamic.contains(resources):
        return f"only dynamic reservations can be unreserved ({dynamic or 'none'} are)"
    if not free.contains(resources):
        return f"{resources} is in use on agent {agent_id} (free: {free})"
    return None
