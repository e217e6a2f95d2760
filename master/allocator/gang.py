"""Gang placement: pure planning over per-agent slot counts.

A gang asks for ``count`` slots of a scalar ``shape``. How many slots an agent can hold is
``min(capacity[n] // shape[n])``, capped per agent by the placement (DISTINCT: 1) and by
``max_per_agent``. Two plans are made from those counts:

* :func:`place` — does the gang fit *now*? DISTINCT and ANY take agents first-fit in the
  order given; PACK takes the agents with the most slots first (fewest agents), and for the
  last slots the smallest agent that still holds them (best fit).
* :func:`plan_earmarks` — where should the head gang wait? Over what agents could hold
  once freed (their total), preferring agents with the most of a slot free already (PACK:
  the biggest agents first). ``None`` means the gang can never fit under its placement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agora.master.allocator.amounts import Milli
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import Placement
from agora.sdk.resources import Resources

__all__ = [
    "Gang",
    "PlanCandidate",
    "per_agent_cap",
    "place",
    "plan_earmarks",
    "progress",
    "slots_on",
]

Placed = list[tuple[AgentID, int]]


@dataclass(eq=False, slots=True)
class Gang:
    """A pending gang request and the allocator's working state for it."""

    framework_id: FrameworkID
    gang_id: GangID
    role: str
    count: int
    shape: Resources  # flattened to "*": the exact per-slot part on an agent with no reservations
    shape_milli: dict[str, int]
    placement: Placement
    cap: int  # slots per agent at most
    requested: float
    deadline: float
    seq: int
    seen_epoch: int = -1  # allocator epoch when it last failed to fit; skip until it changes
    plan: dict[AgentID, int] | None = None  # where it waits (earmarks), slots per agent
    plan_topology: int = -1  # ledger topology the plan (or its absence) was made for
    plan_fresh: bool = False  # re-planned since the last top-up: top up every plan agent
    earmarked: set[AgentID] = field(default_factory=set)

    @property
    def key(self) -> tuple[FrameworkID, GangID]:
        return (self.framework_id, self.gang_id)

    def total_need(self) -> dict[str, int]:
        return {name: value * self.count for name, value in self.shape_milli.items()}


def per_agent_cap(placement: Placement, max_per_agent: int, count: int) -> int:
    if placement is Placement.DISTINCT:
        return 1
    if max_per_agent > 0:
        return min(max_per_agent, count)
    return count


def slots_on(capacity: Milli, shape: Milli, cap: int) -> int:
    """How many ``shape`` slots ``capacity`` holds, at most ``cap``."""
    slots = cap
    get = capacity.get
    for name, need in shape.items():
        fit = get(name, 0) // need
        if fit < slots:
            if fit <= 0:
                return 0
            slots = fit
    return slots


def place(
    candidates: Sequence[tuple[AgentID, int]], count: int, placement: Placement
) -> Placed | None:
    """Slots per agent for ``count`` slots out of ``candidates`` (agent, slots it holds)."""
    if sum(slots for _, slots in candidates) < count:
        return None
    if placement is not Placement.PACK:
        out: Placed = []
        left = count
        for agent_id, slots in candidates:
            take = min(slots, left)
            out.append((agent_id, take))
            left -= take
            if not left:
                return out
        return None  # pragma: no cover - the sum says otherwise
    ranked = sorted(candidates, key=lambda c: -c[1])  # stable: ties keep the given order
    out = []
    left = count
    i = 0
    while left:
        agent_id, slots = ranked[i]
        if slots >= left:
            # Best fit for the rest: the smallest later agent still holding all of it.
            j = i
            while j + 1 < len(ranked) and ranked[j + 1][1] >= left:
                j += 1
            out.append((ranked[j][0], left))
            return out
        out.append((agent_id, slots))
        left -= slots
        i += 1
    return out  # pragma: no cover - count >= 1


@dataclass(frozen=True, slots=True)
class PlanCandidate:
    agent_id: AgentID
    total_slots: int  # slots the agent holds when all of it is free
    progress: float  # how much of its planned slots is free (or earmarked) already, 0..1
    order: int


def progress(free: Milli, shape: Milli, slots: int) -> float:
    """The fraction of ``slots x shape`` that ``free`` covers (the scarcest name decides)."""
    worst = 1.0
    get = free.get
    for name, need in shape.items():
        ratio = get(name, 0) / (need * slots)
        if ratio < worst:
            worst = ratio
    return worst


def plan_earmarks(
    candidates: Iterable[PlanCandidate], count: int, placement: Placement
) -> dict[AgentID, int] | None:
    cands = list(candidates)
    if sum(c.total_slots for c in cands) < count:
        return None
    if placement is Placement.PACK:
        cands.sort(key=lambda c: (-c.total_slots, -c.progress, c.order))
    else:
        cands.sort(key=lambda c: (-c.progress, -c.total_slots, c.order))
    plan: dict[AgentID, int] = {}
    left = count
    for c in cands:
        take = min(c.total_slots, left)
        plan[c.agent_id] = take
        left -= take
        if not left:
            break
    return plan
