"""The gang queue: pending gang requests, the head gang's earmarks, and gang offers.

Gangs are served FIFO by request time. On every allocation run, before ordinary offers:

1. every live gang of an active framework that fits *now* — in free, un-earmarked resources
   of active agents where its framework holds no outstanding offer in its role (the
   earmarking gang may also use its own earmarks) — is emitted whole;
2. the *head* — the oldest live gang of an active framework that could ever fit on the
   active agents (under its placement and its role's quota limit) — plans where to wait and
   earmarks free resources there, up to what its plan still needs. Earmarks are withheld
   from ordinary offers and from other gangs. Once the plan is fully earmarked (and no
   outstanding offer of the framework sits on its agents) the gang is emitted.

A gang that can never fit does not earmark (the next one does) and simply expires. Emitting,
expiring or cancelling a gang, or deactivating its framework, releases its earmarks.

Work is kept off the event path: a gang that did not fit is not looked at again until the
ledger's epoch says something was freed, and an aggregate check over the cluster's free
totals rules most gangs out before any per-agent scan.
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.master.allocator.amounts import EMPTY, carve, covers, is_scalar_only, scaled
from agora.master.allocator.gang import (
    Gang,
    PlanCandidate,
    per_agent_cap,
    place,
    plan_earmarks,
    progress,
    slots_on,
)
from agora.master.allocator.ledger import Ledger
from agora.master.allocator.quota import Quota
from agora.master.allocator.types import Allocation, AllocatorError, GangAllocation, GangExpired
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import GangRequest, Placement

__all__ = ["GangQueue"]


class GangQueue:
    __slots__ = ("_gangs", "_ledger", "_order", "_quotas", "_seq", "earmarker")

    def __init__(self, ledger: Ledger, quotas: Mapping[str, Quota]) -> None:
        self._ledger = ledger
        self._quotas = quotas
        self._gangs: dict[tuple[FrameworkID, GangID], Gang] = {}
        self._order: list[Gang] | None = []  # FIFO, rebuilt lazily
        self._seq = 0
        self.earmarker: Gang | None = None

    def __bool__(self) -> bool:
        return bool(self._gangs)

    def __len__(self) -> int:
        return len(self._gangs)

    def roles_waiting(self) -> set[str]:
        """The roles with a gang request pending (of an active framework)."""
        frameworks = self._ledger.frameworks
        return {
            g.role
            for g in self._gangs.values()
            if (fw := frameworks.get(g.framework_id)) is not None and fw.active
        }

    def _fifo(self) -> list[Gang]:
        if self._order is None:
            self._order = sorted(self._gangs.values(), key=lambda g: (g.requested, g.seq))
        return self._order

    def _changed(self) -> None:
        self._order = None
        self._ledger.track_freed = bool(self._gangs)
        if not self._gangs:
            self._ledger.freed.clear()

    # ------------------------------------------------------------------ requests

    def request(self, framework_id: FrameworkID, request: GangRequest, now: float) -> None:
        fw = self._ledger.frameworks.get(framework_id)
        if fw is None:
            raise AllocatorError(f"gang request from unknown framework {framework_id!r}")
        key = (framework_id, request.gang_id)
        pending = self._gangs.get(key)
        if pending is not None:
            asked = (
                request.role,
                request.count,
                request.shape.flatten(),
                request.placement,
                per_agent_cap(request.placement, request.max_per_agent, request.count),
            )
            held = (pending.role, pending.count, pending.shape, pending.placement, pending.cap)
            if asked == held:
                # Asked again (a retry, or after re-subscribing): it keeps its place and deadline.
                return
            raise AllocatorError(
                f"{framework_id!r} already has a different pending gang {request.gang_id!r}"
            )
        if request.role not in fw.roles:
            raise AllocatorError(
                f"gang {request.gang_id!r}: {framework_id!r} is not subscribed to role "
                f"{request.role!r}"
            )
        if not request.shape or not is_scalar_only(request.shape):
            raise AllocatorError(
                f"gang {request.gang_id!r}: shape must be non-empty scalars, got {request.shape}"
            )
        if request.count < 1 or request.max_per_agent < 0 or not request.hold_timeout > 0:
            raise AllocatorError(f"gang {request.gang_id!r}: bad count, cap or hold timeout")
        shape = request.shape.flatten()
        self._seq += 1
        self._gangs[key] = Gang(
            framework_id=framework_id,
            gang_id=request.gang_id,
            role=request.role,
            count=request.count,
            shape=shape,
            shape_milli=shape.scalar_totals_milli(),
            placement=request.placement,
            cap=per_agent_cap(request.placement, request.max_per_agent, request.count),
            requested=now,
            deadline=now + request.hold_timeout,
            seq=self._seq,
        )
        self._changed()

    def _drop(self, gang: Gang) -> None:
        if gang is self.earmarker:
            self._release_earmarks()
        del self._gangs[gang.key]
        self._changed()

    def cancel(self, framework_id: FrameworkID, gang_id: GangID) -> None:
        gang = self._gangs.get((framework_id, gang_id))
        if gang is not None:
            self._drop(gang)

    def drop_framework(self, framework_id: FrameworkID) -> None:
        for gang in [g for g in self._gangs.values() if g.framework_id == framework_id]:
            self._drop(gang)

    def framework_inactive(self, framework_id: FrameworkID) -> None:
        if self.earmarker is not None and self.earmarker.framework_id == framework_id:
            self._release_earmarks()

    def expire(self, now: float) -> list[GangExpired]:
        out = []
        for gang in list(self._fifo()):
            if now >= gang.deadline:
                self._drop(gang)
                out.append(
                    GangExpired(
                        gang.framework_id,
                        gang.gang_id,
                        f"hold timeout of {gang.deadline - gang.requested:g}s expired before "
                        f"{gang.count} x {gang.shape} could be offered",
                    )
                )
        return out

    def earmarked_by(self, agent_id: AgentID) -> tuple[FrameworkID, GangID] | None:
        g = self.earmarker
        return g.key if g is not None and agent_id in g.earmarked else None

    # ------------------------------------------------------------------ the run

    def run(self, now: float, full: bool) -> list[GangAllocation]:
        ledger = self._ledger
        live: list[Gang] = []
        for gang in self._fifo():
            if now < gang.deadline:
                live.append(gang)
            elif gang is self.earmarker:
                self._release_earmarks()  # expired: reported by expire()
        out: list[GangAllocation] = []
        frameworks = ledger.frameworks
        for gang in live:
            fw = frameworks.get(gang.framework_id)
            if fw is None or not fw.active or gang.seen_epoch == ledger.epoch:
                continue
            placed = self._fit_now(gang) if self._within_limit(gang) else None
            if placed is None:
                gang.seen_epoch = ledger.epoch
            else:
                out.append(self._emit(gang, placed))
        head = None
        for gang in live:
            fw = frameworks.get(gang.framework_id)
            if gang.key in self._gangs and fw is not None and fw.active and self._plan(gang):
                head = gang
                break
        fresh = full or head is not self.earmarker
        if head is not self.earmarker:
            self._release_earmarks()
            self.earmarker = head
        if head is not None:
            done = self._top_up(head, fresh)
            if done is not None:
                out.append(done)
        ledger.freed.clear()
        return out

    def _within_limit(self, gang: Gang) -> bool:
        quota = self._quotas.get(gang.role)
        if quota is None or quota.limit is None:
            return True
        state = self._ledger.roles.get(gang.role)
        used = state.alloc if state is not None else {}
        need = gang.total_need()
        return all(used.get(n, 0) + need.get(n, 0) <= limit for n, limit in quota.limit.items())

    def _fit_now(self, gang: Gang) -> list[tuple[AgentID, int]] | None:
        ledger = self._ledger
        mine = gang is self.earmarker
        have = ledger.free_total
        if not mine and ledger.earmark_total:
            have = dict(have)
            for name, value in ledger.earmark_total.items():
                have[name] -= value
        if not covers(have, gang.total_need()):
            return None
        slot = (gang.framework_id, gang.role)
        spread = gang.placement is not Placement.PACK
        found: list[tuple[AgentID, int]] = []
        total = 0
        for agent in ledger.agents.values():
            if not agent.active or slot in agent.slots:
                continue
            n = slots_on(
                ledger.offerable_milli(agent, gang.role, with_earmark=mine),
                gang.shape_milli,
                gang.cap,
            )
            if n:
                found.append((agent.id, n))
                total += n
                if spread and total >= gang.count:
                    break
        return place(found, gang.count, gang.placement)

    def _emit(self, gang: Gang, placed: list[tuple[AgentID, int]]) -> GangAllocation:
        ledger = self._ledger
        if gang is self.earmarker:
            self._release_earmarks()
        parts = []
        for agent_id, slots in placed:
            agent = ledger.agents[agent_id]
            need = scaled(gang.shape_milli, slots)
            if agent.reserved:
                res = carve(ledger.offerable(agent, gang.role), gang.role, need)
            else:
                res = gang.shape * slots
            ledger.grant(gang.framework_id, agent, gang.role, res, need)
            agent.slots.add((gang.framework_id, gang.role))
            parts.append(Allocation(gang.framework_id, agent_id, gang.role, res))
        del self._gangs[gang.key]
        self._changed()
        return GangAllocation(gang.framework_id, gang.gang_id, gang.role, tuple(parts))

    # ------------------------------------------------------------------ earmarks

    def _release_earmarks(self) -> None:
        gang = self.earmarker
        if gang is None:
            return
        agents = self._ledger.agents
        for agent_id in gang.earmarked:
            agent = agents.get(agent_id)
            if agent is not None:
                self._ledger.clear_earmark(agent)
        gang.earmarked.clear()
        self.earmarker = None

    def _plan(self, gang: Gang) -> bool:
        """Make sure ``gang`` has a plan for the current agents; False if it can never fit."""
        ledger = self._ledger
        if gang.plan_topology == ledger.topology:
            return gang.plan is not None
        gang.plan_topology = ledger.topology
        plan = None
        quota = self._quotas.get(gang.role)
        if quota is None or quota.limit is None or covers(quota.limit, gang.total_need()):
            candidates = []
            for agent in ledger.agents.values():
                if not agent.active:
                    continue
                slots = slots_on(agent.total_for(gang.role), gang.shape_milli, gang.cap)
                if slots:
                    now_free = ledger.offerable_milli(agent, gang.role, with_earmark=True)
                    candidates.append(
                        PlanCandidate(
                            agent.id,
                            slots,
                            progress(now_free, gang.shape_milli, min(slots, gang.count)),
                            agent.order,
                        )
                    )
            plan = plan_earmarks(candidates, gang.count, gang.placement)
        if gang is self.earmarker:
            keep = plan or {}
            for agent_id in [a for a in gang.earmarked if a not in keep]:
                dropped = ledger.agents.get(agent_id)
                if dropped is not None:
                    ledger.clear_earmark(dropped)
                gang.earmarked.discard(agent_id)
        gang.plan = plan
        gang.plan_fresh = True
        return plan is not None

    def _top_up(self, gang: Gang, fresh: bool) -> GangAllocation | None:
        """Earmark what the plan still needs where it is free; emit the gang once complete."""
        ledger = self._ledger
        plan = gang.plan
        assert plan is not None
        todo = plan.keys() if fresh or gang.plan_fresh else plan.keys() & ledger.freed
        gang.plan_fresh = False
        for agent_id in todo:
            agent = ledger.agents[agent_id]
            target = scaled(gang.shape_milli, plan[agent_id])
            have = ledger.offerable_milli(agent, gang.role, with_earmark=True)
            want = {n: min(v, have.get(n, 0)) for n, v in target.items()}
            want = {n: v for n, v in want.items() if v > 0}
            if want == agent.earmark_milli:
                continue
            res = carve(ledger.offerable(agent, gang.role, with_earmark=True), gang.role, want)
            ledger.set_earmark(agent, res if want else EMPTY)
            if want:
                gang.earmarked.add(agent_id)
            else:
                gang.earmarked.discard(agent_id)
        slot = (gang.framework_id, gang.role)
        for agent_id, slots in plan.items():
            planned = ledger.agents[agent_id]
            if slot in planned.slots or not covers(
                planned.earmark_milli, scaled(gang.shape_milli, slots)
            ):
                return None
        if not self._within_limit(gang):
            return None
        return self._emit(gang, list(plan.items()))
