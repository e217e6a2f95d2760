"""The Allocator: hierarchical DRF offers, filters, suppression, quota and gangs.

Modelled on Mesos's ``HierarchicalAllocatorProcess``: the master tells it about agents,
frameworks and resources coming back, and :meth:`Allocator.allocate` returns the offers to
make. It is pure — time is an argument, randomness comes from the configured seed.

An allocation run visits agents (all active ones in a seeded shuffle for a full batch, or
the given ones for an event-triggered run). On each agent, roles are taken in role-sorter
order and, within a role, frameworks in that role's sorter order; the first framework that
is active, subscribed and not suppressed in the role, holds no outstanding offer on (agent,
role) and whose filters do not refuse the candidate gets everything on the agent it may use
(unreserved plus reserved to the role, minus earmarks), cut to quota. Gangs go first (see
:mod:`agora.master.allocator.gangs`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Mapping

from agora.master.allocator.amounts import is_scalar_only
from agora.master.allocator.claims import claims
from agora.master.allocator.filters import FilterBook
from agora.master.allocator.gangs import GangQueue
from agora.master.allocator.ledger import Ledger
from agora.master.allocator.quota import Quota
from agora.master.allocator.quota_offers import QuotaOffers
from agora.master.allocator.reclaim import Candidate, Claim, ReclaimConfig, Victim, plan
from agora.master.allocator.state import AgentState, FrameworkState, RoleState, lent_slot
from agora.master.allocator.types import (
    Allocation,
    AllocatorConfig,
    AllocatorError,
    GangAllocation,
    GangExpired,
)
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import GangRequest
from agora.sdk.resources import UNRESERVED, Resources

__all__ = ["Allocator"]

_NO_USED: Mapping[tuple[FrameworkID, str], Resources] = {}


def _role_set(roles: Iterable[str]) -> frozenset[str]:
    if isinstance(roles, str):
        raise AllocatorError(f"roles must be an iterable of role names, not the str {roles!r}")
    return frozenset(roles)


class Allocator:
    """Resources in, offers out. See the module docstring for the rules."""

    def __init__(self, config: AllocatorConfig = AllocatorConfig()) -> None:  # noqa: B008
        self._config = config
        self._rng = random.Random(config.seed)
        self._ledger = Ledger(config)
        self._quotas: dict[str, Quota] = {}
        self._gangs = GangQueue(self._ledger, self._quotas)
        self._filters = FilterBook()
        self._quota_offers = QuotaOffers(
            self._ledger, self._quotas, self._filters, self._gangs, self._pick, self._min_ok
        )
        self._batches = 0  # full batch allocations completed
        self._agent_seq = 0
        self._min_scalar: list[dict[str, int]] = []
        self._min_other: list[Resources] = []
        for need in config.min_allocatable:
            if is_scalar_only(need):
                self._min_scalar.append(need.scalar_totals_milli())
            else:
                self._min_other.append(need.flatten())
        self._any_min = bool(config.min_allocatable)

    # ------------------------------------------------------------------ agents

    def _agent(self, agent_id: AgentID) -> AgentState:
        agent = self._ledger.agents.get(agent_id)
        if agent is None:
            raise AllocatorError(f"unknown agent {agent_id!r}")
        return agent

    def add_agent(
        self,
        agent_id: AgentID,
        total: Resources,
        now: float,
        used: Mapping[tuple[FrameworkID, str], Resources] = _NO_USED,
    ) -> None:
        """Add an agent; ``used``: what (framework, role) already run on it (re-registration).

        Frameworks not added yet are tracked anyway and count once they are added.
        """
        self._agent_seq += 1
        self._ledger.add_agent(agent_id, total, dict(used), self._agent_seq)

    def remove_agent(self, agent_id: AgentID) -> None:
        """Drop the agent with every allocation, outstanding offer slot and filter on it."""
        agent = self._ledger.agents.get(agent_id)
        if agent is None:
            return
        self._ledger.remove_agent(agent)
        if self._gangs.earmarker is not None:
            self._gangs.earmarker.earmarked.discard(agent_id)
        self._filters.drop_agent(agent_id)

    def set_agent_active(self, agent_id: AgentID, active: bool) -> None:
        """An inactive (draining, unreachable) agent keeps its allocations but gets no offers."""
        agent = self._agent(agent_id)
        if not active and self._gangs.earmarker is not None:
            self._gangs.earmarker.earmarked.discard(agent_id)
        self._ledger.set_agent_active(agent, active)

    # ------------------------------------------------------------------ frameworks

    def _framework(self, framework_id: FrameworkID) -> FrameworkState:
        fw = self._ledger.frameworks.get(framework_id)
        if fw is None:
            raise AllocatorError(f"unknown framework {framework_id!r}")
        return fw

    def add_framework(
        self,
        framework_id: FrameworkID,
        roles: Iterable[str],
        now: float,
        suppressed_roles: Iterable[str] = (),
        revocable: bool = False,
    ) -> None:
        """Subscribe a framework to ``roles``; ``suppressed_roles`` survive re-subscription;
        ``revocable``: it takes revocable offers (what unmet guarantees lend)."""
        if framework_id in self._ledger.frameworks:
            raise AllocatorError(f"framework {framework_id!r} already added")
        role_set = _role_set(roles)
        for role in role_set:
            if not isinstance(role, str) or not role:
                raise AllocatorError(f"bad role {role!r} for framework {framework_id!r}")
        fw = FrameworkState(
            framework_id, role_set, _role_set(suppressed_roles) & role_set, revocable
        )
        self._ledger.frameworks[framework_id] = fw
        self._ledger.subscribe(fw)
        self._ledger.sync_framework(framework_id)

    def remove_framework(self, framework_id: FrameworkID) -> None:
        """Release everything the framework holds; drop its filters, offer slots and gangs."""
        ledger = self._ledger
        fw = ledger.frameworks.pop(framework_id, None)
        self._gangs.drop_framework(framework_id)
        ledger.release_all(framework_id)
        self._filters.clear_framework(framework_id, None)
        for agent in ledger.agents.values():
            if agent.slots:
                for slot in [s for s in agent.slots if s[0] == framework_id]:
                    agent.slots.discard(slot)
        if fw is not None:
            ledger.unsubscribe(fw)
        ledger.sync_framework(framework_id)

    def set_framework_active(self, framework_id: FrameworkID, active: bool) -> None:
        """An inactive (disconnected) framework keeps its allocations but gets no offers."""
        fw = self._framework(framework_id)
        if fw.active != active:
            fw.active = active
            self._ledger.sync_framework(framework_id)
            self._ledger.epoch += 1
            if not active:
                self._gangs.framework_inactive(framework_id)

    def set_framework_revocable(self, framework_id: FrameworkID, revocable: bool) -> None:
        """Whether it takes revocable offers (its capabilities may change on re-subscription)."""
        self._framework(framework_id).revocable = revocable

    def _roles_of(self, fw: FrameworkState, roles: Iterable[str] | None) -> frozenset[str]:
        return fw.roles if roles is None else _role_set(roles) & fw.roles

    def suppress(self, framework_id: FrameworkID, roles: Iterable[str] | None = None) -> None:
        """No more ordinary offers in ``roles`` (None: all its roles). Gangs still flow."""
        fw = self._framework(framework_id)
        fw.suppressed |= self._roles_of(fw, roles)
        self._ledger.sync_framework(framework_id)

    def revive(self, framework_id: FrameworkID, roles: Iterable[str] | None = None) -> None:
        """Unsuppress ``roles`` (None: all) and clear the framework's filters in them."""
        fw = self._framework(framework_id)
        chosen = self._roles_of(fw, roles)
        fw.suppressed -= chosen
        self._ledger.sync_framework(framework_id)
        self._filters.clear_framework(framework_id, None if roles is None else chosen)

    def suppressed_roles(self, framework_id: FrameworkID) -> frozenset[str]:
        return frozenset(self._framework(framework_id).suppressed)

    # ------------------------------------------------------------------ roles

    def set_weight(self, role: str, weight: float) -> None:
        """The role's DRF weight (> 0, default 1): its share is divided by it."""
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise AllocatorError(f"weight of {role!r} must be a number")
        if not math.isfinite(weight) or weight <= 0:
            raise AllocatorError(f"weight of {role!r} must be finite and > 0, got {weight!r}")
        self._ledger.set_weight(role, float(weight))

    def set_quota(self, role: str, guarantee: Resources, limit: Resources | None = None) -> None:
        """Scalar guarantee and optional limit for ``role``; an empty guarantee and no limit
        remove the quota. Roles inside the given resources are ignored (quantities)."""
        for what, res in (("guarantee", guarantee), ("limit", limit)):
            if res is not None and not is_scalar_only(res):
                raise AllocatorError(f"quota {what} of {role!r} must be scalars only, got {res}")
        g = guarantee.scalar_totals_milli()
        lim = None if limit is None else limit.scalar_totals_milli()
        if lim is not None:
            over = {n: v for n, v in g.items() if n in lim and v > lim[n]}
            if over:
                raise AllocatorError(f"quota of {role!r}: guarantee above limit for {sorted(over)}")
        if not g and lim is None:
            self._quotas.pop(role, None)
        else:
            self._quotas[role] = Quota(g, lim)
        self._ledger.epoch += 1

    # ------------------------------------------------------------------ resource flow

    def recover_resources(
        self,
        framework_id: FrameworkID,
        agent_id: AgentID,
        role: str,
        resources: Resources,
        now: float,
        refuse_seconds: float | None = None,
    ) -> None:
        """Resources offered to or used by (framework, role) on the agent come back.

        With ``refuse_seconds`` > 0 the framework is not offered, on that agent in that role,
        a candidate contained in ``resources`` until ``now + refuse_seconds`` and until at
        least one full batch ran. Unknown framework/agent/allocation: ignored. Resources not
        in the allocation: AllocatorError.
        """
        ledger = self._ledger
        agent = ledger.agents.get(agent_id)
        if agent is None or (framework_id, role) not in agent.allocs or not resources:
            return
        ledger.release(framework_id, agent, role, resources)
        if refuse_seconds is not None and refuse_seconds > 0 and framework_id in ledger.frameworks:
            self._filters.add(
                framework_id,
                agent_id,
                role,
                resources,
                now=now,
                refuse_seconds=refuse_seconds,
                batches=self._batches,
            )

    def convert(
        self,
        agent_id: AgentID,
        framework_id: FrameworkID,
        role: str,
        before: Resources,
        after: Resources,
    ) -> None:
        """Dynamic reservation: ``before`` becomes ``after`` in the framework's allocation in
        ``role`` on the agent and in the agent's total (RESERVE: unreserved -> reserved to
        ``role``; UNRESERVE: the inverse).

        ``before`` and ``after`` must hold the same amounts (roles aside), use only ``"*"``
        and ``role``, and ``before`` must be within the allocation. When the converted
        resources come back (:meth:`recover_resources` of ``after``), reserved ones are
        offered only to frameworks of ``role``. Misuse: AllocatorError, nothing changes.
        """
        agent = self._agent(agent_id)
        if role == UNRESERVED:
            raise AllocatorError("nothing can be reserved to or unreserved from role '*'")
        allowed = {UNRESERVED, role}
        for what, res in (("before", before), ("after", after)):
            extra = res.roles() - allowed
            if extra:
                raise AllocatorError(
                    f"convert in role {role!r}: {what} {res} uses other roles {sorted(extra)}"
                )
        if before.flatten() != after.flatten():
            raise AllocatorError(
                f"convert must keep the amounts: {before} and {after} differ beyond roles"
            )
        current = agent.allocs.get((framework_id, role))
        if current is None or not current.contains(before):
            raise AllocatorError(
                f"cannot convert {before} of {framework_id!r} on {agent_id!r} in role "
                f"{role!r}: only {current or Resources()} is allocated"
            )
        if before != after:
            self._ledger.convert(framework_id, agent, role, before, after)

    def offer_closed(
        self, framework_id: FrameworkID, agent_id: AgentID, role: str, revocable: bool = False
    ) -> None:
        """The outstanding offer of (framework, agent, role) is gone: a new one may be made.
        ``revocable``: the revocable one (a framework may hold one of each)."""
        agent = self._ledger.agents.get(agent_id)
        if agent is not None:
            self._ledger.offer_closed(agent, framework_id, lent_slot(role) if revocable else role)

    # ------------------------------------------------------------------ gangs

    def request_gang(self, framework_id: FrameworkID, request: GangRequest, now: float) -> None:
        self._gangs.request(framework_id, request, now)

    def cancel_gang(self, framework_id: FrameworkID, gang_id: GangID) -> None:
        """Withdraw a pending gang (no-op if it is not pending any more)."""
        self._gangs.cancel(framework_id, gang_id)

    def expire(self, now: float) -> list[GangExpired]:
        """Gangs past their hold timeout: their earmarks are released, and they are reported."""
        return self._gangs.expire(now)

    # ------------------------------------------------------------------ allocation

    def allocate(
        self, now: float, agent_ids: Iterable[AgentID] | None = None
    ) -> list[Allocation | GangAllocation]:
        """One allocation run: gang offers first, then ordinary offers.

        ``agent_ids`` None: a full batch over every active agent (counts for filters);
        otherwise an event-triggered run over just those agents.
        """
        ledger = self._ledger
        out: list[Allocation | GangAllocation] = []
        if self._gangs:
            out.extend(self._gangs.run(now, agent_ids is None))
        if agent_ids is None:
            agents = [a for a in ledger.agents.values() if a.active]
            self._rng.shuffle(agents)
        else:
            agents = []
            seen: set[AgentID] = set()
            for agent_id in agent_ids:
                agent = ledger.agents.get(agent_id)
                if agent is not None and agent.active and agent_id not in seen:
                    seen.add(agent_id)
                    agents.append(agent)
        if ledger.roles and agents:
            if self._quotas:
                self._quota_offers.run(agents, now, self._batches, out)
            else:
                self._offer(agents, now, out)
        if agent_ids is None:
            self._batches += 1
        return out

    def _min_ok(self, milli: Mapping[str, int], candidate: Resources) -> bool:
        if not self._any_min:
            return True
        get = milli.get
        for need in self._min_scalar:
            for name, value in need.items():
                if get(name, 0) < value:
                    break
            else:
                return True
        if self._min_other:
            flat = candidate.flatten()
            return any(flat.contains(need) for need in self._min_other)
        return False

    def _pick(
        self,
        agent: AgentState,
        role: RoleState,
        candidate: Resources,
        now: float,
        lend: bool = False,
    ) -> FrameworkState | None:
        """The first framework of the role, in sorter order, that may get ``candidate``
        (``lend``: only those that take revocable offers)."""
        frameworks = self._ledger.frameworks
        name = role.name
        slots = agent.slots
        on_agent = self._filters.on_agent(agent.id)
        for framework_id in role.sorter:
            fw = frameworks.get(framework_id)
            if (
                fw is None
                or not fw.active
                or name in fw.suppressed
                or name not in fw.roles
                or (framework_id, lent_slot(name) if lend else name) in slots
                or (lend and not fw.revocable)
            ):
                continue
            if on_agent is not None and self._filters.refuses(
                on_agent, framework_id, agent.id, name, candidate, now, self._batches
            ):
                continue
            return fw
        return None

    def _offer(
        self, agents: list[AgentState], now: float, out: list[Allocation | GangAllocation]
    ) -> None:
        """Ordinary offers without quota: each pick gets all the agent has for the role."""
        ledger = self._ledger
        roles = ledger.roles
        role_sorter = ledger.role_sorter
        single = next(iter(roles.values())) if len(roles) == 1 else None
        for agent in agents:
            if not agent.free:
                continue
            order = [single] if single is not None else [roles[r] for r in role_sorter.sort()]
            for role in order:
                if agent.earmark or agent.reserved:
                    candidate = ledger.offerable(agent, role.name)
                    if not candidate:
                        continue
                    milli = candidate.scalar_totals_milli()
                else:
                    candidate = agent.free
                    if not candidate:
                        break
                    milli = agent.free_milli
                if not self._min_ok(milli, candidate):
                    continue
                fw = self._pick(agent, role, candidate, now)
                if fw is None:
                    continue
                ledger.grant(fw.id, agent, role.name, candidate, milli)
                agent.slots.add((fw.id, role.name))
                out.append(Allocation(fw.id, agent.id, role.name, candidate))

    # ------------------------------------------------------------------ reclaim

    def claims(self, now: float) -> list[Claim]:
        """Roles below their guarantee that want resources now, and what reclaim owes them
        (see :mod:`agora.master.allocator.claims`)."""
        if not self._quotas:
            return []
        return claims(self._ledger, self._quotas, self._filters, self._gangs, now, self._batches)

    def plan_reclaim(
        self,
        claims: list[Claim],
        candidates: Iterable[Candidate],
        now: float,
        config: ReclaimConfig,
    ) -> list[Victim]:
        """What to take back for ``claims`` among ``candidates`` (see
        :mod:`agora.master.allocator.reclaim`)."""
        if not claims:
            return []
        ledger = self._ledger
        return plan(
            claims,
            candidates,
            {name: state.alloc for name, state in ledger.roles.items()},
            {name: q.guarantee for name, q in self._quotas.items()},
            ledger.cluster_total,
            now,
            config,
        )

    # ------------------------------------------------------------------ introspection

    def has_agent(self, agent_id: AgentID) -> bool:
        return agent_id in self._ledger.agents

    def available(self, agent_id: AgentID) -> Resources:
        """Free on the agent: not offered, not used (earmarked resources included)."""
        return self._agent(agent_id).free

    def earmarked(self, agent_id: AgentID) -> Resources:
        """What of :meth:`available` is set aside for the head gang."""
        return self._agent(agent_id).earmark

    def total(self, agent_id: AgentID) -> Resources:
        return self._agent(agent_id).total

    def scalars(self, agent_id: AgentID) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """The agent's total and :meth:`available` scalars in thousandths, as the allocator
        keeps them (read only)."""
        agent = self._agent(agent_id)
        return agent.total_milli, agent.free_milli

    def busiest(self) -> Iterator[AgentID]:
        """Every agent, the busiest first: by the largest share of any of its scalars that
        frameworks hold (offered or in use), to the whole percent rounded up; agents at the
        same percent in the order they reached it. Lazy: the first n cost O(n + 100)."""
        for bucket in reversed(self._ledger.by_busy):
            yield from bucket

    def busy_percent(self, agent_id: AgentID) -> int:
        """The agent's place in :meth:`busiest`: its largest held share, in percent."""
        return self._agent(agent_id).busy

    def allocated_scalars(self) -> dict[str, int]:
        """Scalars held by frameworks (offered or in use) over every agent, in thousandths:
        kept per role as allocations change, so this costs the number of roles, not agents."""
        out: dict[str, int] = {}
        for state in self._ledger.roles.values():
            for name, milli in state.alloc.items():
                out[name] = out.get(name, 0) + milli
        return out

    def share(self, framework_id: FrameworkID) -> float:
        """Weighted dominant share within its roles' framework sorters (the largest, if several)."""
        best = 0.0
        found = framework_id in self._ledger.frameworks or framework_id in self._ledger.allocs
        for state in self._ledger.roles.values():
            if framework_id in state.sorter:
                found = True
                best = max(best, state.sorter.share(framework_id))
        if not found:
            raise AllocatorError(f"unknown framework {framework_id!r}")
        return best

    def role_share(self, role: str) -> float:
        """The role's weighted dominant share of the active cluster (0.0 for an unknown role)."""
        sorter = self._ledger.role_sorter
        return sorter.share(role) if role in sorter else 0.0

    def allocated(self, framework_id: FrameworkID) -> dict[tuple[AgentID, str], Resources]:
        """What the framework holds (offered + in use), per (agent, role)."""
        return dict(self._ledger.allocs.get(framework_id, {}))

    def role_allocation(self, role: str) -> dict[str, int]:
        """What the role holds (offered + in use), in thousandths per scalar."""
        state = self._ledger.roles.get(role)
        return dict(state.alloc) if state is not None else {}

    def outstanding(self, framework_id: FrameworkID) -> frozenset[tuple[AgentID, str]]:
        """The (agent, role) pairs where the framework has an offer not yet closed."""
        return frozenset(
            (agent.id, role.removesuffix(lent_slot("")))
            for agent in self._ledger.agents.values()
            for fid, role in agent.slots
            if fid == framework_id
        )

    def pending_gangs(self) -> int:
        return len(self._gangs)
