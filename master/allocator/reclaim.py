"""Reclaim: taking back what a role below its guarantee is owed.

A role whose quota guarantee is unmet, and that wants resources now (see
:meth:`~agora.master.allocator.allocator.Allocator.claims`), is a *claimant*. What it is
owed beyond what lies free is its *need*. :func:`plan` chooses what to take back for the
needs, in this order:

1. outstanding offers of other roles (nothing running is lost);
2. tasks on revocable resources (lent from a guarantee: taken back first);
3. other tasks: of the role furthest above its own guarantee first, then of the lowest
   priority, newest first.

It never takes a role below its own guarantee (on any scalar the guarantee names), never a
claimant's tasks, never a task younger than ``min_runtime`` (so that a cluster does not
thrash), never something already being stopped (whose resources count as on their way to the
needs), and at most ``max_victims`` tasks per round. Amounts are scalars in thousandths, by
quantity: where the claimant's tasks land is the offers' business, as with quota itself.

Pure: the master builds the candidates from its tasks and offers, and carries out the plan
(rescinds the offers, kills the tasks with reason TASK_PREEMPTED or RESOURCES_REVOKED).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from agora.master.allocator.amounts import Milli

__all__ = ["Candidate", "Claim", "ReclaimConfig", "Victim", "plan"]


@dataclass(frozen=True, slots=True)
class ReclaimConfig:
    """How fast reclaim may go. ``interval``: seconds between rounds; ``min_runtime``: a task
    that started less than this long ago is never taken; ``max_victims``: tasks per round."""

    enabled: bool = True
    interval: float = 1.0
    min_runtime: float = 10.0
    max_victims: int = 100


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimant role and what it still needs (thousandths per scalar, all > 0)."""

    role: str
    need: Milli


@dataclass(frozen=True, slots=True)
class Candidate:
    """Something reclaim may take: an outstanding offer, or a running task.

    ``key`` is the master's handle (offer id or task key); ``scalars`` its resources in
    thousandths; ``stopping``: already being taken (its resources are on their way).
    """

    key: Hashable
    kind: Literal["offer", "task"]
    role: str
    scalars: Milli
    revocable: bool = False
    priority: int = 0
    started_at: float = 0.0
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class Victim:
    """A candidate to take, and for which claimant role."""

    candidate: Candidate
    claimant: str

    @property
    def revoked(self) -> bool:
        """Taken back from revocable resources (reason RESOURCES_REVOKED, not TASK_PREEMPTED)."""
        return self.candidate.revocable


@dataclass(slots=True)
class _Role:
    """A possible victim role: its allocation and guarantee (thousandths)."""

    alloc: dict[str, int]
    guarantee: Mapping[str, int]
    excess: float = 0.0
    taken: dict[str, int] = field(default_factory=dict)

    def can_give(self, scalars: Milli) -> bool:
        for name, floor in self.guarantee.items():
            amount = scalars.get(name, 0)
            if amount and self.alloc.get(name, 0) - self.taken.get(name, 0) - amount < floor:
                return False
        return True

    def give(self, scalars: Milli) -> None:
        for name, amount in scalars.items():
            self.taken[name] = self.taken.get(name, 0) + amount


def _helps(need: Mapping[str, int], scalars: Milli) -> bool:
    return any(scalars.get(name, 0) > 0 for name, left in need.items() if left > 0)


def _subtract(need: dict[str, int], scalars: Milli) -> None:
    for name in list(need):
        left = need[name] - scalars.get(name, 0)
        if left > 0:
            need[name] = left
        else:
            del need[name]


def plan(
    claims: Iterable[Claim],
    candidates: Iterable[Candidate],
    allocations: Mapping[str, Mapping[str, int]],
    guarantees: Mapping[str, Mapping[str, int]],
    cluster_total: Mapping[str, int],
    now: float,
    config: ReclaimConfig,
) -> list[Victim]:
    """What to take back for ``claims`` (in the order given: the first is served first).

    ``allocations``: each role's allocation (offered and in use); ``guarantees``: each role's
    guarantee; ``cluster_total``: the scalars of the whole cluster (for the excess shares).
    """
    needs = [(c.role, dict(c.need)) for c in claims]
    claimants = {role for role, _ in needs}
    wanted = {name for _role, need in needs for name in need}
    roles: dict[str, _Role] = {}
    pool: list[Candidate] = []
    for cand in candidates:
        if cand.role in claimants:
            continue
        state = roles.get(cand.role)
        if state is None:
            state = roles[cand.role] = _Role(
                dict(allocations.get(cand.role, {})), guarantees.get(cand.role, {})
            )
        if cand.stopping:
            # On its way back: it serves the needs first, and the role has given it already.
            state.give(cand.scalars)
            for _role, need in needs:
                if _helps(need, cand.scalars):
                    _subtract(need, cand.scalars)
                    break
            continue
        if cand.kind == "task" and now - cand.started_at < config.min_runtime:
            continue
        scalars = cand.scalars
        if any(scalars.get(name, 0) > 0 for name in wanted):  # else it can never help
            pool.append(cand)
    if not any(need for _role, need in needs):
        return []
    for state in roles.values():
        state.excess = max(
            (
                (state.alloc.get(name, 0) - state.guarantee.get(name, 0)) / total
                for name, total in cluster_total.items()
                if total > 0
            ),
            default=0.0,
        )
    pool.sort(
        key=lambda c: (
            0 if c.kind == "offer" else 1 if c.revocable else 2,
            -roles[c.role].excess,
            c.priority,
            -c.started_at,
        )
    )
    victims: list[Victim] = []
    tasks = 0
    for cand in pool:
        if tasks >= config.max_victims:
            break
        state = roles[cand.role]
        for role, need in needs:
            if need and _helps(need, cand.scalars) and state.can_give(cand.scalars):
                state.give(cand.scalars)
                _subtract(need, cand.scalars)
                victims.append(Victim(cand, role))
                tasks += cand.kind == "task"
                break
        if not any(need for _role, need in needs):
            break
    return victims
