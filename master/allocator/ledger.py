"""The ledger: where every resource is, and the only code that moves it.

Every agent's total is split into *free* (which includes what is *earmarked* for the head
gang) and *allocations* per (framework, role) — offered or in use. The ledger moves
resources between the two (:meth:`Ledger.grant`, :meth:`Ledger.release`) and keeps every
derived number in step: the per-agent scalar mirrors, the cluster-wide totals (of every
agent, and of the free resources of active ones), the role and framework sorters, and the
*epoch* (bumped whenever something might let a waiting gang fit: resources freed, an agent
added or activated, an offer closed), and the agents ranked by how much of them is held.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

from agora.master.allocator.amounts import EMPTY, add_into, subtract_into
from agora.master.allocator.sorter import DRFSorter, RandomSorter, Sorter
from agora.master.allocator.state import AgentState, FrameworkState, RoleState
from agora.master.allocator.types import AllocatorConfig, AllocatorError
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.resources import UNRESERVED, ResourceError, Resources

__all__ = ["Ledger"]

_Milli = dict[str, int]


class Ledger:
    __slots__ = (
        "_alloc_count",
        "_seeds",
        "_sorter_kind",
        "agents",
        "allocs",
        "by_busy",
        "cluster_total",
        "earmark_total",
        "earmark_unres",
        "epoch",
        "frameworks",
        "free_total",
        "free_unres",
        "freed",
        "role_sorter",
        "roles",
        "topology",
        "track_freed",
        "weights",
    )

    def __init__(self, config: AllocatorConfig) -> None:
        self._sorter_kind = config.sorter
        self._seeds = random.Random(config.seed + 1)
        self.agents: dict[AgentID, AgentState] = {}
        self.frameworks: dict[FrameworkID, FrameworkState] = {}
        # Allocations by framework (known or not yet added): (agent, role) -> resources.
        self.allocs: dict[FrameworkID, dict[tuple[AgentID, str], Resources]] = {}
        self._alloc_count: dict[tuple[FrameworkID, str], int] = {}  # agents holding some
        self.roles: dict[str, RoleState] = {}
        self.role_sorter: Sorter[str] = self.new_sorter()
        self.weights: dict[str, float] = {}
        # Scalars: the total over every agent, and over active agents free (roles flattened),
        # free unreserved, and the part of free that is earmarked (flattened / unreserved).
        self.cluster_total: _Milli = {}
        self.free_total: _Milli = {}
        self.free_unres: _Milli = {}
        self.earmark_total: _Milli = {}
        self.earmark_unres: _Milli = {}
        self.epoch = 0
        self.topology = 0  # bumped when agents come, go, or change activity
        self.freed: set[AgentID] = set()  # agents whose offerable grew, while track_freed
        self.track_freed = False
        #: Agents by ``AgentState.busy`` (0 to 100 percent held), each bucket in the order its
        #: agents entered it: the busiest agents are read without looking at the others.
        self.by_busy: list[dict[AgentID, None]] = [{} for _ in range(101)]

    # ------------------------------------------------------------------ sorters and roles

    def new_sorter(self) -> Sorter[Any]:
        if self._sorter_kind == "random":
            return RandomSorter(self._seeds.getrandbits(64))
        return DRFSorter()

    def role(self, name: str) -> RoleState:
        """The role's state, creating it (and its place in the role sorter) if needed."""
        state = self.roles.get(name)
        if state is None:
            state = self.roles[name] = RoleState(name, self.new_sorter())
            state.sorter.add_total(self.cluster_total)
            self.role_sorter.add(name, self.weights.get(name, 1.0))
        return state

    def maybe_drop_role(self, name: str) -> None:
        state = self.roles.get(name)
        if state is not None and not state.subscribers and not len(state.sorter):
            del self.roles[name]
            self.role_sorter.remove(name)

    def _track(self, framework_id: FrameworkID, role: str) -> RoleState:
        state = self.role(role)
        if framework_id not in state.sorter:
            state.sorter.add(framework_id)
            state.sorter.set_active(framework_id, self._offerable(framework_id, role))
        return state

    def _offerable(self, framework_id: FrameworkID, role: str) -> bool:
        fw = self.frameworks.get(framework_id)
        return fw is not None and fw.active and role in fw.roles and role not in fw.suppressed

    def sync_framework(self, framework_id: FrameworkID) -> None:
        """The framework was (de)activated, (un)suppressed or removed: only the role sorters
        whose offers it may take now list it in their order."""
        for role, state in self.roles.items():
            if framework_id in state.sorter:
                state.sorter.set_active(framework_id, self._offerable(framework_id, role))

    def _maybe_untrack(self, framework_id: FrameworkID, role: str) -> None:
        if self._alloc_count.get((framework_id, role)):
            return
        fw = self.frameworks.get(framework_id)
        if fw is not None and role in fw.roles:
            return
        state = self.roles.get(role)
        if state is not None and framework_id in state.sorter:
            state.sorter.remove(framework_id)
            self.maybe_drop_role(role)

    def subscribe(self, fw: FrameworkState) -> None:
        for role in fw.roles:
            self._track(fw.id, role).subscribers += 1

    def unsubscribe(self, fw: FrameworkState) -> None:
        """After ``fw`` left ``frameworks``: drop it from the sorters it has nothing in."""
        for role in fw.roles:
            self.roles[role].subscribers -= 1
            self._maybe_untrack(fw.id, role)
            self.maybe_drop_role(role)

    def set_weight(self, role: str, weight: float) -> None:
        if role in self.roles:
            self.role_sorter.set_weight(role, weight)
        self.weights[role] = weight

    def _all_sorters(self) -> Iterator[Sorter[Any]]:
        yield self.role_sorter
        for state in self.roles.values():
            yield state.sorter

    # ------------------------------------------------------------------ agents

    def _changed(self, agent: AgentState) -> None:
        self.epoch += 1
        if self.track_freed:
            self.freed.add(agent.id)

    def _rank(self, agent: AgentState, busy: int | None = None) -> None:
        """Move the agent to the bucket of its share held now (after its free part changed);
        ``busy``: that share, when the caller knows it (all of the agent held, or none)."""
        if busy is None:
            busy = 0
            free = agent.free_milli
            for name, whole in agent.total_milli.items():
                if whole > 0:
                    held = whole - free.get(name, 0)
                    if held > 0:
                        percent = -(-held * 100 // whole)
                        if percent > busy:
                            busy = percent
        if busy != agent.busy:
            del self.by_busy[agent.busy][agent.id]
            self.by_busy[busy][agent.id] = None
            agent.busy = busy

    def _unreserved(self, agent: AgentState, res: Resources, milli: _Milli) -> _Milli:
        return res.unreserved().scalar_totals_milli() if agent.reserved else milli

    def _count_total(self, agent: AgentState, sign: int) -> None:
        """The agent's total in the cluster's and every sorter's totals (the denominators of
        the DRF shares): counted while the allocator knows the agent, active or not, as Mesos
        keeps a deactivated agent, so the tasks still on a drained agent do not make shares
        grow past 1."""
        op = add_into if sign > 0 else subtract_into
        op(self.cluster_total, agent.total_milli)
        for sorter in self._all_sorters():
            if sign > 0:
                sorter.add_total(agent.total_milli)
            else:
                sorter.remove_total(agent.total_milli)

    def _count_active(self, agent: AgentState, sign: int) -> None:
        """The agent's free and earmarked resources in the offerable totals (active agents)."""
        op = add_into if sign > 0 else subtract_into
        op(self.free_total, agent.free_milli)
        op(self.free_unres, self._unreserved(agent, agent.free, agent.free_milli))
        op(self.earmark_total, agent.earmark_milli)
        op(self.earmark_unres, self._unreserved(agent, agent.earmark, agent.earmark_milli))

    def add_agent(
        self,
        agent_id: AgentID,
        total: Resources,
        used: dict[tuple[FrameworkID, str], Resources],
        order: int,
    ) -> AgentState:
        if agent_id in self.agents:
            raise AllocatorError(f"agent {agent_id!r} already added")
        in_use = EMPTY
        for res in used.values():
            in_use = in_use + res
        if not total.contains(in_use):
            raise AllocatorError(f"agent {agent_id!r}: used {in_use} exceeds total {total}")
        agent = AgentState(agent_id, total, order)
        self.agents[agent_id] = agent
        self.by_busy[0][agent_id] = None
        self._count_total(agent, +1)
        if in_use:  # what its tasks hold comes off its free part at once, not grant by grant
            agent.free = total - in_use
            agent.free_milli = agent.free.scalar_totals_milli()
        self._count_active(agent, +1)
        for (framework_id, role), res in used.items():
            if res:
                self._hold(framework_id, agent, role, res, res.scalar_totals_view())
        self._rank(agent, None if in_use else 0)
        self._changed(agent)
        self.topology += 1
        return agent

    def remove_agent(self, agent: AgentState) -> None:
        self.clear_earmark(agent)
        self._count_total(agent, -1)
        if agent.active:
            self._count_active(agent, -1)
        for (framework_id, role), res in list(agent.allocs.items()):
            self._forget_alloc(framework_id, agent, role)
            self._unaccount(framework_id, role, res.scalar_totals_milli())
        del self.agents[agent.id]
        del self.by_busy[agent.busy][agent.id]
        self.freed.discard(agent.id)
        self.topology += 1

    def set_agent_active(self, agent: AgentState, active: bool) -> None:
        if agent.active == active:
            return
        self.topology += 1
        if not active:
            self.clear_earmark(agent)
            self._count_active(agent, -1)
            agent.active = False
        else:
            agent.active = True
            self._count_active(agent, +1)
            self._changed(agent)

    def offer_closed(self, agent: AgentState, framework_id: FrameworkID, role: str) -> None:
        if (framework_id, role) in agent.slots:
            agent.slots.discard((framework_id, role))
            self._changed(agent)

    # ------------------------------------------------------------------ moving resources

    def _account(self, framework_id: FrameworkID, role: str, milli: Mapping[str, int]) -> None:
        state = self._track(framework_id, role)
        state.sorter.allocated(framework_id, milli)
        self.role_sorter.allocated(role, milli)
        add_into(state.alloc, milli)

    def _unaccount(self, framework_id: FrameworkID, role: str, milli: _Milli) -> None:
        state = self.roles[role]
        state.sorter.unallocated(framework_id, milli)
        self.role_sorter.unallocated(role, milli)
        subtract_into(state.alloc, milli)
        self._maybe_untrack(framework_id, role)

    def _forget_alloc(self, framework_id: FrameworkID, agent: AgentState, role: str) -> None:
        del agent.allocs[(framework_id, role)]
        mine = self.allocs[framework_id]
        del mine[(agent.id, role)]
        if not mine:
            del self.allocs[framework_id]
        key = (framework_id, role)
        left = self._alloc_count[key] - 1
        if left:
            self._alloc_count[key] = left
        else:
            del self._alloc_count[key]

    def grant(
        self,
        framework_id: FrameworkID,
        agent: AgentState,
        role: str,
        res: Resources,
        milli: _Milli,
    ) -> None:
        """Move ``res`` (scalars ``milli``) from the agent's offerable part to the framework.

        The caller ensures ``res`` is within ``free - earmark``.
        """
        whole = res is agent.free
        if whole:
            agent.free = EMPTY
            agent.free_milli = {}
        else:
            agent.free = agent.free - res
            subtract_into(agent.free_milli, milli)
        if agent.active:
            subtract_into(self.free_total, milli)
            subtract_into(self.free_unres, self._unreserved(agent, res, milli))
        self._hold(framework_id, agent, role, res, milli)
        self._rank(agent, 100 if whole and agent.total_milli else None)

    def _hold(
        self,
        framework_id: FrameworkID,
        agent: AgentState,
        role: str,
        res: Resources,
        milli: Mapping[str, int],
    ) -> None:
        """Count ``res`` (scalars ``milli``), no longer in the agent's free part, as the
        framework's on the agent."""
        key = (framework_id, role)
        current = agent.allocs.get(key)
        if current is None:
            new = res
            self._alloc_count[key] = self._alloc_count.get(key, 0) + 1
        else:
            new = current + res
        agent.allocs[key] = new
        mine = self.allocs.get(framework_id)
        if mine is None:
            mine = self.allocs[framework_id] = {}
        mine[(agent.id, role)] = new
        self._account(framework_id, role, milli)

    def release(
        self, framework_id: FrameworkID, agent: AgentState, role: str, res: Resources
    ) -> None:
        """Give ``res`` of the framework's allocation on the agent back to the agent's free."""
        current = agent.allocs[(framework_id, role)]
        try:
            left = current - res
        except ResourceError:
            raise AllocatorError(
                f"cannot recover {res} from {framework_id!r} on {agent.id!r} in role "
                f"{role!r}: only {current} is allocated"
            ) from None
        milli = res.scalar_totals_milli()
        if left:
            agent.allocs[(framework_id, role)] = left
            self.allocs[framework_id][(agent.id, role)] = left
        else:
            self._forget_alloc(framework_id, agent, role)
        agent.free = agent.free + res
        add_into(agent.free_milli, milli)
        if agent.active:
            add_into(self.free_total, milli)
            add_into(self.free_unres, self._unreserved(agent, res, milli))
        self._unaccount(framework_id, role, milli)
        self._rank(agent, None if agent.allocs else 0)
        self._changed(agent)

    def convert(
        self,
        framework_id: FrameworkID,
        agent: AgentState,
        role: str,
        before: Resources,
        after: Resources,
    ) -> None:
        """Replace ``before`` by ``after`` in the allocation of (framework, role) and in the
        agent's total: a dynamic reservation (RESERVE / UNRESERVE).

        The caller ensures the allocation holds ``before`` and that both have the same
        quantities. Scalar quantities do not change, so ``total_milli``, the cluster totals,
        the sorters and the role allocations stay as they are; ``free`` and ``earmark`` are
        untouched (the converted resources are allocated), so ``free_unres`` and
        ``earmark_unres`` stay right too.
        """
        key = (framework_id, role)
        new = agent.allocs[key] - before + after
        agent.allocs[key] = new
        self.allocs[framework_id][(agent.id, role)] = new
        agent.total = agent.total - before + after
        agent.reserved = agent.total.roles() - {UNRESERVED} != frozenset()
        agent.role_totals.clear()
        # What each role could ever get on the agent changed: gang plans are remade.
        self.topology += 1
        self.epoch += 1

    def release_all(self, framework_id: FrameworkID) -> None:
        for (agent_id, role), res in list(self.allocs.get(framework_id, {}).items()):
            self.release(framework_id, self.agents[agent_id], role, res)

    # ------------------------------------------------------------------ earmarks

    def set_earmark(self, agent: AgentState, res: Resources) -> None:
        """Earmark exactly ``res`` (within ``free``) on the agent, replacing what was there."""
        self.clear_earmark(agent, bump=not res.contains(agent.earmark))
        if not res:
            return
        agent.earmark = res
        agent.earmark_milli = res.scalar_totals_milli()
        if agent.active:
            add_into(self.earmark_total, agent.earmark_milli)
            add_into(self.earmark_unres, self._unreserved(agent, res, agent.earmark_milli))

    def clear_earmark(self, agent: AgentState, *, bump: bool = True) -> None:
        if not agent.earmark:
            return
        if agent.active:
            subtract_into(self.earmark_total, agent.earmark_milli)
            subtract_into(
                self.earmark_unres,
                self._unreserved(agent, agent.earmark, agent.earmark_milli),
            )
        agent.earmark = EMPTY
        agent.earmark_milli = {}
        if bump:
            self._changed(agent)

    # ------------------------------------------------------------------ reading

    def offerable(self, agent: AgentState, role: str, *, with_earmark: bool = False) -> Resources:
        """What a framework of ``role`` could be given on the agent now."""
        pool = agent.free if with_earmark or not agent.earmark else agent.free - agent.earmark
        return pool.allocatable_to(role) if agent.reserved else pool

    def offerable_milli(
        self, agent: AgentState, role: str, *, with_earmark: bool = False
    ) -> _Milli:
        if not agent.reserved:
            if with_earmark or not agent.earmark:
                return agent.free_milli
            out = dict(agent.free_milli)
            subtract_into(out, agent.earmark_milli)
            return out
        return self.offerable(agent, role, with_earmark=with_earmark).scalar_totals_milli()
