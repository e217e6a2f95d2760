"""CREATE and DESTROY inside an ACCEPT: persistent volumes made of (and given back as) disk
reserved to the offer's role (volumes.py has the representation).

CREATE needs the volume's disk, reserved to its role, in what is left of an accepted offer of
that role, and an id not in use for that role on the agent. DESTROY needs the volume itself in
what is left of an accepted offer: a volume a task holds cannot be destroyed. Either changes the
agent's total, so the agent is rebuilt in the allocator (reservations.rebuild), and the agent
is sent its new set of volumes: it creates or deletes their directories.
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.master.core import volumes as vol
from agora.master.core.state import Framework, MasterState, OutstandingOffer
from agora.sdk.ids import OfferID
from agora.sdk.messages import PersistentVolume
from agora.sdk.resources import Resources

__all__ = ["Plan", "plan"]

#: The offer to take it from, what it takes, what it gives back, the volumes as they will be.
Plan = tuple[OfferID, Resources, Resources, list[PersistentVolume]]


def plan(
    st: MasterState,
    fw: Framework,
    offers: Mapping[OfferID, OutstandingOffer],
    remaining: Mapping[OfferID, Resources],
    volumes: tuple[PersistentVolume, ...],
    *,
    create: bool,
) -> tuple[str | None, Plan | None]:
    """What is wrong with the operation, or how to carry it out."""
    if not volumes:
        return "no volumes given", None
    wrong = next((p for v in volumes if (p := vol.problem(v))), None)
    if wrong is not None:
        return wrong, None
    roles = {v.role for v in volumes}
    if len(roles) != 1:
        return f"volumes of several roles {sorted(roles)}", None
    role = next(iter(roles))
    if role not in fw.info.roles:
        return f"the framework is not in role {role!r}", None
    ids = [v.volume_id for v in volumes]
    if len(set(ids)) != len(ids):
        return "a volume id is given twice", None
    matching = [o for o, offer in offers.items() if offer.role == role and not offer.revocable]
    if not matching:
        return f"role {role!r} does not match the offers' role(s)", None
    agent = st.agents[offers[matching[0]].agent_id]
    if create:
        taken = [v.volume_id for v in volumes if (role, v.volume_id) in agent.volumes]
        if taken:
            return f"volume(s) {', '.join(taken)} of role {role!r} exist already", None
        final = list(volumes)
        before = sum((vol.disk_of(v) for v in volumes), Resources())
        after = sum((vol.as_item(v) for v in volumes), Resources())
    else:
        unknown = [v.volume_id for v in volumes if (role, v.volume_id) not in agent.volumes]
        if unknown:
            return f"no volume(s) {', '.join(unknown)} of role {role!r} on the agent", None
        final = [agent.volumes[(role, v.volume_id)] for v in volumes]
        before = sum((vol.as_item(v) for v in final), Resources())
        after = sum((vol.disk_of(v) for v in final), Resources())
    for offer_id in matching:
        if remaining[offer_id].contains(before):
            return None, (offer_id, before, after, final)
    if create:
        return f"{before} is not in what remains of the accepted offers", None
    return "the volumes are not in what remains of the accepted offers (in use?)", None
