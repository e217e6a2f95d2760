"""Offers under quota: the allocator's stages when some role has a guarantee or a limit.

* Stage 1 offers only to roles below their guarantee, up to what they are owed.
* Stage 2 offers to every role, cut to the roles' limits and so that what the cluster has free
  still covers every unmet guarantee (headroom; see :mod:`agora.master.allocator.quota`).
* Lending (when some framework takes revocable offers): what headroom holds back is lent as
  revocable offers — beside a stage-2 offer to such a framework on the same agent, and in
  stage 3 to any that take it — except what the roles that want their guarantee now are owed
  (see :mod:`agora.master.allocator.claims`). Reclaim takes lent resources back first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agora.master.allocator.amounts import minus
from agora.master.allocator.claims import wanted
from agora.master.allocator.filters import FilterBook
from agora.master.allocator.gangs import GangQueue
from agora.master.allocator.ledger import Ledger
from agora.master.allocator.quota import Quota, required_headroom, shape_offer
from agora.master.allocator.state import AgentState, FrameworkState, RoleState, lent_slot
from agora.master.allocator.types import Allocation, GangAllocation
from agora.sdk.resources import Resources

__all__ = ["QuotaOffers"]

#: The allocator's pick: the first framework of the role that may get the candidate.
Pick = Callable[..., FrameworkState | None]


class QuotaOffers:
    """The quota stages over the allocator's ledger (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        quotas: Mapping[str, Quota],
        filters: FilterBook,
        gangs: GangQueue,
        pick: Pick,
        min_ok: Callable[[Mapping[str, int], Resources], bool],
    ) -> None:
        self.ledger = ledger
        self.quotas = quotas
        self.filters = filters
        self.gangs = gangs
        self.pick = pick
        self.min_ok = min_ok

    def _role_alloc(self, role: str) -> Mapping[str, int]:
        state = self.ledger.roles.get(role)
        return state.alloc if state is not None else {}

    def _required(self) -> dict[str, int]:
        return required_headroom((q, self._role_alloc(r)) for r, q in self.quotas.items())

    def run(
        self,
        agents: list[AgentState],
        now: float,
        batches: int,
        out: list[Allocation | GangAllocation],
    ) -> None:
        """Stage 1, stage 2 and, when lending is on, stage 3 over ``agents``."""
        below = {
            r
            for r, q in self.quotas.items()
            if r in self.ledger.roles and q.unmet(self._role_alloc(r))
        }
        if below:
            for agent in agents:
                self._offer_quota_agent(agent, now, out, below)
        owed = self._owed(now, batches)
        for agent in agents:
            self._offer_quota_agent(agent, now, out, None, owed)
        if owed is not None:
            for agent in agents:
                if agent.free:  # most of a busy cluster has nothing left to lend
                    self._offer_quota_agent(agent, now, out, None, owed, lend_only=True)

    def _owed(self, now: float, batches: int) -> dict[str, int] | None:
        """None when nothing is lent (no guarantee unmet, or no framework takes revocable
        offers); else what the roles that want their guarantee now are owed: never lent, so
        that, freed, it waits for them (their offers come in stage 1)."""
        if not self._required() or not any(f.revocable for f in self.ledger.frameworks.values()):
            return None
        owed: dict[str, int] = {}
        for _role, unmet in wanted(
            self.ledger, self.quotas, self.filters, self.gangs, now, batches
        ):
            for name, value in unmet.items():
                owed[name] = owed.get(name, 0) + value
        return owed

    def _offer_quota_agent(
        self,
        agent: AgentState,
        now: float,
        out: list[Allocation | GangAllocation],
        stage1: set[str] | None,
        owed: Mapping[str, int] | None = None,
        lend_only: bool = False,
    ) -> None:
        """Stage 1 (``stage1`` = roles below guarantee), stage 2 (None) or stage 3
        (``lend_only``) on one agent.

        With ``owed`` (lending is on, see :meth:`_owed`), a stage-2 pick that takes revocable
        offers gets, beside its offer, what headroom holds back on the agent beyond ``owed`` as
        a revocable offer: the agent's memory in one and its lent cpus in the other, usable
        together. Stage 3 lends what is still left, unreserved, to any that take it.
        """
        ledger = self.ledger
        for name in ledger.role_sorter.sort():
            if stage1 is not None and name not in stage1:
                continue
            role = ledger.roles[name]
            quota = self.quotas.get(name)
            if stage1 is not None and (quota is None or not quota.unmet(role.alloc)):
                continue
            while True:  # a cut offer may leave something for the next framework
                base = ledger.offerable(agent, name)
                if lend_only:
                    base = base.unreserved()
                if not base:
                    break
                offer = shape_offer(
                    base,
                    quota=quota,
                    allocation=role.alloc,
                    stage1=stage1 is not None,
                    required=owed if lend_only and owed is not None else self._required(),
                    available=minus(ledger.free_unres, ledger.earmark_unres),
                )
                milli = offer.scalar_totals_milli()
                if not offer or not self.min_ok(milli, offer):
                    break
                fw = self.pick(agent, role, offer, now, lend=lend_only)
                if fw is None:
                    break
                self._grant(fw, agent, name, offer, milli, out, revocable=lend_only)
                if owed is not None and stage1 is None and not lend_only and fw.revocable:
                    self._lend_beside(fw, agent, role, owed, out)

    def _grant(
        self,
        fw: FrameworkState,
        agent: AgentState,
        role: str,
        offer: Resources,
        milli: Mapping[str, int],
        out: list[Allocation | GangAllocation],
        *,
        revocable: bool,
    ) -> None:
        self.ledger.grant(fw.id, agent, role, offer, dict(milli))
        agent.slots.add((fw.id, lent_slot(role) if revocable else role))
        out.append(Allocation(fw.id, agent.id, role, offer, revocable=revocable))

    def _lend_beside(
        self,
        fw: FrameworkState,
        agent: AgentState,
        role: RoleState,
        owed: Mapping[str, int],
        out: list[Allocation | GangAllocation],
    ) -> None:
        if (fw.id, lent_slot(role.name)) in agent.slots:
            return
        ledger = self.ledger
        rest = ledger.offerable(agent, role.name).unreserved()
        if not rest:
            return
        lent = shape_offer(
            rest,
            quota=self.quotas.get(role.name),
            allocation=role.alloc,
            stage1=False,
            required=owed,
            available=minus(ledger.free_unres, ledger.earmark_unres),
        )
        milli = lent.scalar_totals_milli()
        if lent and self.min_ok(milli, lent):
            self._grant(fw, agent, role.name, lent, milli, out, revocable=True)
