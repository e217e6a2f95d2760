"""Claims: which roles below their guarantee want resources now, and how much reclaim owes them.

A role with a quota guarantee it has not reached is a claimant when it has *demand*:

* one of its frameworks has a gang request waiting, or
* one of its frameworks is active, not suppressed in the role, and has not lately declined (a
  live filter) as much as the role is still owed — it would take what reclaim frees.

What a claimant holds in offers counts as its allocation already, so an offer it sits on
shrinks what it is owed rather than hiding its demand.

A framework that wants nothing should suppress: it then claims nothing, and what its role is
guaranteed is lent to others meanwhile. The claim is the unmet guarantee beyond what lies free
(unreserved, not earmarked, on active agents), shared out in role-sorter order (the role
furthest below its fair share first).
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.master.allocator.amounts import minus
from agora.master.allocator.filters import FilterBook
from agora.master.allocator.gangs import GangQueue
from agora.master.allocator.ledger import Ledger
from agora.master.allocator.quota import Quota
from agora.master.allocator.reclaim import Claim

__all__ = ["claims", "wanted"]


def wanted(
    ledger: Ledger,
    quotas: Mapping[str, Quota],
    filters: FilterBook,
    gangs: GangQueue,
    now: float,
    batches: int,
) -> list[tuple[str, dict[str, int]]]:
    """The roles below their guarantee that have demand, in role-sorter order, with their
    unmet guarantee: what must not be lent, and what reclaim works for."""
    below = [
        (name, unmet)
        for name in ledger.role_sorter.sort()
        if (quota := quotas.get(name)) is not None
        and (unmet := quota.unmet(ledger.roles[name].alloc))
    ]
    if not below:
        return []
    waiting = gangs.roles_waiting() if gangs else set()
    return [
        (name, unmet)
        for name, unmet in below
        if name in waiting or _wants(ledger, filters, name, unmet, now, batches)
    ]


def claims(
    ledger: Ledger,
    quotas: Mapping[str, Quota],
    filters: FilterBook,
    gangs: GangQueue,
    now: float,
    batches: int,
) -> list[Claim]:
    """The claimant roles, in the order reclaim serves them, with what each still needs."""
    available = minus(ledger.free_unres, ledger.earmark_unres)
    out: list[Claim] = []
    for name, unmet in wanted(ledger, quotas, filters, gangs, now, batches):
        need = minus(unmet, available)
        available = minus(available, unmet)
        if need:
            out.append(Claim(name, need))
    return out


def _wants(
    ledger: Ledger,
    filters: FilterBook,
    role: str,
    unmet: Mapping[str, int],
    now: float,
    batches: int,
) -> bool:
    for framework_id in ledger.roles[role].sorter:
        fw = ledger.frameworks.get(framework_id)
        if (
            fw is not None
            and fw.active
            and role in fw.roles
            and role not in fw.suppressed
            and not filters.declines(framework_id, role, unmet, now, batches)
        ):
            return True
    return False
