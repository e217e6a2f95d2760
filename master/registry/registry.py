"""The registry: the masters' small durable state, changed only by committed operations.

Every master applies the same committed operations in the same order, so every replica holds the
same registry; a new leader starts from its own. Applying is pure and total: an operation that no
longer makes sense (readmitting an agent that is gone, removing an unknown framework) changes
nothing, so a replica never diverges on a stale or duplicated entry. The snapshot is the whole
registry as one record, which keeps Raft's log compaction trivial.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Annotated, Final, TypeVar

from agora.master.registry.ops import (
    AdmitAgent,
    AgentEntry,
    DrainAgent,
    FrameworkEntry,
    MaintenanceWindow,
    MarkUnreachable,
    Operation,
    QuotaEntry,
    ReadmitAgent,
    RemoveAgent,
    RemoveFramework,
    SetMaintenance,
    SetQuota,
    SetWeights,
    UpsertFramework,
)
from agora.sdk.codec import pack_record, unpack_record
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import MaxItems, Record, RoleWeight
from msgspec.structs import replace

__all__ = ["MAX_REMOVED", "Registry"]

#: Ids of removed agents and frameworks remembered (oldest forgotten first), so that one that
#: comes back is refused; bounded so the registry stays small (Mesos bounds its gone list too).
MAX_REMOVED: Final = 100_000
_MANY: Final = 1_000_000


class _Snapshot(Record, frozen=True, kw_only=True):
    agents: Annotated[tuple[AgentEntry, ...], MaxItems(_MANY)] = ()
    removed_agents: Annotated[tuple[AgentID, ...], MaxItems(_MANY)] = ()
    frameworks: Annotated[tuple[FrameworkEntry, ...], MaxItems(_MANY)] = ()
    removed_frameworks: Annotated[tuple[FrameworkID, ...], MaxItems(_MANY)] = ()
    weights: Annotated[tuple[RoleWeight, ...], MaxItems(_MANY)] = ()
    quotas: Annotated[tuple[QuotaEntry, ...], MaxItems(_MANY)] = ()
    maintenance: Annotated[tuple[MaintenanceWindow, ...], MaxItems(_MANY)] = ()


@dataclass(slots=True)
class Registry:
    """One master's replica. Mutate only through :meth:`apply` (or :meth:`restore`)."""

    agents: dict[AgentID, AgentEntry] = field(default_factory=dict)
    #: Insertion-ordered (a dict used as an ordered set): oldest first, for the bound.
    removed_agents: dict[AgentID, None] = field(default_factory=dict)
    frameworks: dict[FrameworkID, FrameworkEntry] = field(default_factory=dict)
    removed_frameworks: dict[FrameworkID, None] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    quotas: dict[str, QuotaEntry] = field(default_factory=dict)
    maintenance: dict[str, MaintenanceWindow] = field(default_factory=dict)
    #: The ids of the agents in ``agents`` that are draining (kept with them, not replicated):
    #: a drain's checks and the console's view look at these, not at every agent.
    draining: set[AgentID] = field(default_factory=set)
    #: Index of the last log entry applied (0: none); kept by the shell, not in the snapshot.
    applied_index: int = 0

    # ------------------------------------------------------------------ reading

    def admitted(self) -> list[AgentEntry]:
        """Agents expected back after a failover: admitted and not unreachable."""
        return [a for a in self.agents.values() if a.unreachable_since is None]

    def is_removed_agent(self, agent_id: AgentID) -> bool:
        return agent_id in self.removed_agents

    def is_removed_framework(self, framework_id: FrameworkID) -> bool:
        return framework_id in self.removed_frameworks

    # ------------------------------------------------------------------ changing

    def apply(self, op: Operation) -> bool:
        """Apply one committed operation; False when it changed nothing (stale or duplicate)."""
        if isinstance(op, AdmitAgent):
            entry = op.agent
            if entry.agent_id in self.removed_agents:
                return False
            self._set_agent(replace(entry, unreachable_since=None))
            return True
        if isinstance(op, ReadmitAgent):
            return self._update_agent(op.agent_id, unreachable_since=None)
        if isinstance(op, MarkUnreachable):
            return self._update_agent(op.agent_id, unreachable_since=op.time)
        if isinstance(op, DrainAgent):
            deadline = op.deadline if op.draining else None
            return self._update_agent(op.agent_id, draining=op.draining, drain_deadline=deadline)
        if isinstance(op, RemoveAgent):
            self.agents.pop(op.agent_id, None)
            self.draining.discard(op.agent_id)
            return _remember(self.removed_agents, op.agent_id)
        if isinstance(op, UpsertFramework):
            fw = op.framework
            if fw.framework_id in self.removed_frameworks:
                return False
            changed = self.frameworks.get(fw.framework_id) != fw
            self.frameworks[fw.framework_id] = fw
            return changed
        if isinstance(op, RemoveFramework):
            self.frameworks.pop(op.framework_id, None)
            return _remember(self.removed_frameworks, op.framework_id)
        if isinstance(op, SetWeights):
            before = dict(self.weights)
            self.weights.update((w.role, w.weight) for w in op.weights)
            return self.weights != before
        if isinstance(op, SetQuota):
            if op.quota is None:
                return self.quotas.pop(op.role, None) is not None
            self.quotas[op.role] = replace(op.quota, role=op.role)
            return True
        if isinstance(op, SetMaintenance):
            if op.window is None:
                return self.maintenance.pop(op.hostname, None) is not None
            self.maintenance[op.hostname] = replace(op.window, hostname=op.hostname)
            return True
        return False

    def _update_agent(self, agent_id: AgentID, **changes: float | bool | None) -> bool:
        entry = self.agents.get(agent_id)
        if entry is None:
            return False
        updated = replace(entry, **changes)
        self._set_agent(updated)
        return updated != entry

    def _set_agent(self, entry: AgentEntry) -> None:
        self.agents[entry.agent_id] = entry
        if entry.draining:
            self.draining.add(entry.agent_id)
        else:
            self.draining.discard(entry.agent_id)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The whole registry as bytes (for Raft compaction and a follower far behind)."""
        return pack_record(
            _Snapshot(
                agents=tuple(self.agents.values()),
                removed_agents=tuple(self.removed_agents),
                frameworks=tuple(self.frameworks.values()),
                removed_frameworks=tuple(self.removed_frameworks),
                weights=tuple(RoleWeight(role=r, weight=w) for r, w in self.weights.items()),
                quotas=tuple(self.quotas.values()),
                maintenance=tuple(self.maintenance.values()),
            )
        )

    @classmethod
    def from_snapshot(cls, data: bytes) -> Registry:
        """The registry :meth:`snapshot` made ``data`` from; ProtocolError if it is not one."""
        snap = unpack_record(_Snapshot, data)
        return cls(
            agents={a.agent_id: a for a in snap.agents},
            removed_agents=dict.fromkeys(snap.removed_agents),
            frameworks={f.framework_id: f for f in snap.frameworks},
            removed_frameworks=dict.fromkeys(snap.removed_frameworks),
            weights={w.role: w.weight for w in snap.weights},
            quotas={q.role: q for q in snap.quotas},
            maintenance={m.hostname: m for m in snap.maintenance},
            draining={a.agent_id for a in snap.agents if a.draining},
        )

    def restore(self, data: bytes) -> None:
        """Replace this replica's content with a snapshot's (in place: holders keep it)."""
        other = Registry.from_snapshot(data)
        for name in (
            "agents",
            "removed_agents",
            "frameworks",
            "removed_frameworks",
            "weights",
            "quotas",
            "maintenance",
            "draining",
        ):
            setattr(self, name, getattr(other, name))

    def digest(self) -> str:
        """A short fingerprint of the content, for comparing replicas in tests and histories."""
        return hashlib.blake2b(self.snapshot(), digest_size=8).hexdigest()


_K = TypeVar("_K", bound=str)


def _remember(removed: dict[_K, None], key: _K) -> bool:
    if key in removed:
        return False
    removed[key] = None
    while len(removed) > MAX_REMOVED:
        del removed[next(iter(removed))]
    return True
