"""Quota: per-role guarantees and limits over scalar quantities, and how they cut an offer.

* **limit** — a role's allocation never exceeds it: an offer's scalars named in the limit
  are cut to what is left under it.
* **guarantee** — the allocator runs two stages. Stage 1 offers only to roles below their
  guarantee, and only up to the unmet guarantee for the names it guarantees. Every offer
  (both stages) keeps enough unallocated unreserved resources in the cluster to cover the
  unmet guarantees of all roles ("headroom"): its unreserved scalars are cut to
  ``own_unmet + max(0, available - required)``, where ``required`` is the sum of every
  role's unmet guarantee and ``available`` what the cluster has free, unreserved and not
  earmarked, on active agents. A role eating into its own unmet guarantee never hurts
  the headroom of the others.

Allocation here means offered plus in use, reserved or not. Unallocated reservations do not
count towards a role's consumption (Mesos >= 1.9 counts them; Agora's master owns
reservations and can fold them in later).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agora.master.allocator.amounts import Milli, minus, shrink
from agora.sdk.resources import Resources

__all__ = ["Quota", "required_headroom", "shape_offer"]


@dataclass(frozen=True, slots=True)
class Quota:
    guarantee: dict[str, int]  # thousandths per scalar name
    limit: dict[str, int] | None  # None: no limit; names absent: not limited

    def unmet(self, allocation: Milli) -> dict[str, int]:
        return minus(self.guarantee, allocation)


def required_headroom(pairs: Iterable[tuple[Quota, Milli]]) -> dict[str, int]:
    """The sum over roles of their unmet guarantee; ``pairs`` = (quota, role allocation)."""
    out: dict[str, int] = {}
    for quota, allocation in pairs:
        for name, value in quota.unmet(allocation).items():
            out[name] = out.get(name, 0) + value
    return out


def shape_offer(
    candidate: Resources,
    *,
    quota: Quota | None,
    allocation: Milli,
    stage1: bool,
    required: Mapping[str, int],
    available: Mapping[str, int],
) -> Resources:
    """``candidate`` cut to the role's limit, to its unmet guarantee (stage 1), and to headroom."""
    caps: dict[str, int] = {}
    if quota is not None:
        if quota.limit is not None:
            for name, limit in quota.limit.items():
                caps[name] = limit - allocation.get(name, 0)
        if stage1:
            for name, guaranteed in quota.guarantee.items():
                left = guaranteed - allocation.get(name, 0)
                caps[name] = min(caps.get(name, left), left)
    offer = shrink(candidate, caps) if caps else candidate
    if required and offer:
        own = quota.unmet(allocation) if quota is not None else {}
        headroom = {
            name: own.get(name, 0) + max(0, available.get(name, 0) - need)
            for name, need in required.items()
            if need > 0
        }
        offer = shrink(offer, headroom, unreserved_only=True)
    return offer
