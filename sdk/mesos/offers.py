"""Agora :class:`~agora.sdk.messages.common.Offer` -> Mesos ``Offer`` JSON.

Sent: ``id``, ``framework_id``, ``agent_id``, ``hostname``, ``resources`` (each with
``allocation_info.role`` = the offer's role, and ``revocable: {}`` on a revocable offer) and
``attributes`` (Agora's are text, so each is ``{name, type: TEXT, text: {value}}``). A gang
offer is refused: Mesos has no way to say that offers must be accepted together.
"""

from __future__ import annotations

from agora.sdk.mesos._json import fail
from agora.sdk.mesos.ids import id_to_mesos
from agora.sdk.mesos.resources import resources_to_mesos
from agora.sdk.messages.common import Offer

__all__ = ["offer_to_mesos"]


def offer_to_mesos(offer: Offer) -> dict[str, object]:
    """One Agora offer as a Mesos v1 Offer."""
    if offer.gang_id is not None:
        fail("offer.gang_id", "a gang offer has no Mesos equivalent")
    resources = resources_to_mesos(offer.resources, allocation_role=offer.role)
    if offer.revocable:
        for r in resources:
            r["revocable"] = {}
    return {
        "id": id_to_mesos(offer.offer_id),
        "framework_id": id_to_mesos(offer.framework_id),
        "agent_id": id_to_mesos(offer.agent_id),
        "hostname": offer.hostname,
        "resources": resources,
        "attributes": [
            {"name": k, "type": "TEXT", "text": {"value": v}}
            for k, v in sorted(offer.attributes.items())
        ],
    }
