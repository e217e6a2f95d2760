"""Offers: turning allocations into OFFERS events, closing, rescinding and expiring them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from agora.master.allocator import Allocation, GangAllocation, GangExpired
from agora.master.core.state import AgentStatus, MasterState, OutstandingOffer
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import GangExpired as GangExpiredEvent
from agora.sdk.messages import Offer, Offers, Rescind
from agora.sdk.resources import Resources

__all__ = [
    "allocate",
    "close_offer",
    "expire_gangs",
    "expire_offers",
    "rescind_offers",
    "with_bundles",
]


def allocate(st: MasterState, now: float, agent_ids: Iterable[AgentID] | None) -> None:
    """Run the allocator (all agents, or just ``agent_ids``) and send what it offers."""
    results = st.allocator.allocate(now, agent_ids)
    per_framework: dict[FrameworkID, list[Offer]] = defaultdict(list)
    for result in results:
        if isinstance(result, GangAllocation):
            bundle = [_outstanding(st, part, now, result) for part in result.parts]
            ids = tuple(o.offer_id for o in bundle)
            for o in bundle:
                o.bundle = ids
            per_framework[result.framework_id].extend(_offer(st, o) for o in bundle)
        else:
            per_framework[result.framework_id].append(_offer(st, _outstanding(st, result, now)))
    for framework_id, offers in per_framework.items():
        st.send_framework(framework_id, Offers(offers=tuple(offers)))


def _outstanding(
    st: MasterState, a: Allocation, now: float, gang: GangAllocation | None = None
) -> OutstandingOffer:
    offer = OutstandingOffer(
        offer_id=OfferID(st.mint("O")),
        framework_id=a.framework_id,
        agent_id=a.agent_id,
        role=a.role,
        resources=a.resources,
        created_at=now,
        gang_id=gang.gang_id if gang is not None else None,
        revocable=a.revocable,
    )
    st.offers[offer.offer_id] = offer
    fw = st.frameworks.get(a.framework_id)
    if fw is not None:
        fw.offers.add(offer.offer_id)
    return offer


def _offer(st: MasterState, o: OutstandingOffer) -> Offer:
    info = st.agents[o.agent_id].info
    return Offer(
        offer_id=o.offer_id,
        framework_id=o.framework_id,
        agent_id=o.agent_id,
        hostname=info.hostname,
        role=o.role,
        resources=o.resources,
        attributes=dict(info.attributes),
        gang_id=o.gang_id,
        revocable=o.revocable,
    )


def close_offer(
    st: MasterState,
    offer_id: OfferID,
    now: float,
    *,
    unused: Resources | None = None,
    refuse_seconds: float | None = None,
) -> OutstandingOffer | None:
    """Retire an offer: ``unused`` (default: all of it) goes back to the allocator.

    Returns the offer, or ``None`` when it was not outstanding (already used,
    rescinded, or never made): an offer id is usable once.
    """
    offer = st.offers.pop(offer_id, None)
    if offer is None:
        return None
    fw = st.frameworks.get(offer.framework_id)
    if fw is not None:
        fw.offers.discard(offer_id)
    agent = st.agents.get(offer.agent_id)
    if agent is not None and agent.status is AgentStatus.ACTIVE:
        st.allocator.offer_closed(
            offer.framework_id, offer.agent_id, offer.role, revocable=offer.revocable
        )
    back = offer.resources if unused is None else unused
    st.recover(offer.framework_id, offer.agent_id, offer.role, back, now, refuse_seconds)
    return offer


def with_bundles(st: MasterState, offer_ids: Iterable[OfferID]) -> list[OfferID]:
    """The ids plus every other part of any gang bundle they touch (gangs go whole)."""
    out: dict[OfferID, None] = {}
    for offer_id in offer_ids:
        out[offer_id] = None
        offer = st.offers.get(offer_id)
        if offer is not None:
            for part in offer.bundle:
                out[part] = None
    return list(out)


def rescind_offers(st: MasterState, offer_ids: Iterable[OfferID], now: float) -> None:
    """Take offers back (whole gang bundles), telling their frameworks (if connected)."""
    for offer_id in with_bundles(st, offer_ids):
        offer = close_offer(st, offer_id, now)
        if offer is not None:
            st.send_framework(offer.framework_id, Rescind(offer_id=offer_id))


def expire_offers(st: MasterState, now: float) -> None:
    timeout = st.config.offer_timeout
    if timeout is None:
        return
    stale = [o.offer_id for o in st.offers.values() if now - o.created_at >= timeout]
    rescind_offers(st, stale, now)


def expire_gangs(st: MasterState, now: float) -> None:
    expired: list[GangExpired] = st.allocator.expire(now)
    for e in expired:
        st.send_framework(e.framework_id, GangExpiredEvent(gang_id=e.gang_id, message=e.reason))
