"""Offer filters: "do not offer me this again on that agent for a while".

A filter is made when a framework declines (or leaves unused) resources with
``refuse_seconds``. Like Mesos's ``RefusedOfferFilter`` it applies to a later candidate
offer for the same (framework, agent, role) when the refused resources *contain* the
candidate: the framework said no to all of it already. A candidate holding anything more
(something freed since) is offered whole.

A filter lasts until ``now + refuse_seconds`` AND until at least one full batch allocation
has run after it was made, so a refusal shorter than the batch interval still skips one
batch (Mesos ``HierarchicalAllocatorTest.SmallOfferFilterTimeout``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.resources import Resources

__all__ = ["MAX_REFUSE_SECONDS", "FilterBook", "OfferFilter"]

MAX_REFUSE_SECONDS = 365 * 24 * 3600.0

_Slot = tuple[FrameworkID, str]


@dataclass(frozen=True, slots=True)
class OfferFilter:
    resources: Resources
    expires: float
    batch: int  # full batches completed when the filter was made

    def alive(self, now: float, batches: int) -> bool:
        return now < self.expires or batches <= self.batch

    def refuses(self, candidate: Resources) -> bool:
        return self.resources.contains(candidate)


class FilterBook:
    """Every live filter, indexed by agent (the hot lookup) and by framework (revive)."""

    __slots__ = ("_agents_of", "_by_agent")

    def __init__(self) -> None:
        self._by_agent: dict[AgentID, dict[_Slot, list[OfferFilter]]] = {}
        self._agents_of: dict[FrameworkID, set[AgentID]] = {}

    def __len__(self) -> int:
        return sum(len(fs) for slots in self._by_agent.values() for fs in slots.values())

    def on_agent(self, agent_id: AgentID) -> dict[_Slot, list[OfferFilter]] | None:
        """The filters on one agent, keyed by (framework, role); None when there are none."""
        return self._by_agent.get(agent_id)

    def add(
        self,
        framework_id: FrameworkID,
        agent_id: AgentID,
        role: str,
        resources: Resources,
        *,
        now: float,
        refuse_seconds: float,
        batches: int,
    ) -> None:
        seconds = min(refuse_seconds, MAX_REFUSE_SECONDS)
        slots = self._by_agent.setdefault(agent_id, {})
        live = [f for f in slots.get((framework_id, role), ()) if f.alive(now, batches)]
        live.append(OfferFilter(resources, now + seconds, batches))
        slots[(framework_id, role)] = live
        self._agents_of.setdefault(framework_id, set()).add(agent_id)

    def refuses(
        self,
        filters: dict[_Slot, list[OfferFilter]],
        framework_id: FrameworkID,
        agent_id: AgentID,
        role: str,
        candidate: Resources,
        now: float,
        batches: int,
    ) -> bool:
        """Whether a live filter of (framework, agent, role) refuses ``candidate``.

        ``filters`` is :meth:`on_agent` of ``agent_id``. Dead filters met on the way are dropped.
        """
        slot = (framework_id, role)
        found = filters.get(slot)
        if not found:
            return False
        live = [f for f in found if f.alive(now, batches)]
        if len(live) != len(found):
            if live:
                filters[slot] = live
            else:
                self._forget(framework_id, agent_id, role)
        return any(f.refuses(candidate) for f in live)

    def declines(
        self,
        framework_id: FrameworkID,
        role: str,
        amount: Mapping[str, int],
        now: float,
        batches: int,
    ) -> bool:
        """Whether the framework declined, in ``role`` and lately (a live filter), resources of
        at least ``amount`` (thousandths per scalar): it does not want that much now."""
        for agent_id in self._agents_of.get(framework_id, ()):
            for f in self._by_agent.get(agent_id, {}).get((framework_id, role), ()):
                if f.alive(now, batches):
                    have = f.resources.scalar_totals_milli()
                    if all(have.get(name, 0) >= value for name, value in amount.items()):
                        return True
        return False

    def _forget(self, framework_id: FrameworkID, agent_id: AgentID, role: str) -> None:
        slots = self._by_agent.get(agent_id)
        if slots is None:
            return
        slots.pop((framework_id, role), None)
        if not slots:
            del self._by_agent[agent_id]
        if not slots or all(fw != framework_id for fw, _ in slots):
            agents = self._agents_of.get(framework_id)
            if agents is not None:
                agents.discard(agent_id)
                if not agents:
                    del self._agents_of[framework_id]

    def clear_framework(self, framework_id: FrameworkID, roles: frozenset[str] | None) -> None:
        """Drop the framework's filters (only those of ``roles`` unless None)."""
        for agent_id in list(self._agents_of.get(framework_id, ())):
            slots = self._by_agent.get(agent_id, {})
            for fw, role in list(slots):
                if fw == framework_id and (roles is None or role in roles):
                    self._forget(framework_id, agent_id, role)

    def drop_agent(self, agent_id: AgentID) -> None:
        slots = self._by_agent.pop(agent_id, None)
        if slots is None:
            return
        for framework_id in {fw for fw, _ in slots}:
            agents = self._agents_of.get(framework_id)
            if agents is not None:
                agents.discard(agent_id)
                if not agents:
                    del self._agents_of[framework_id]
