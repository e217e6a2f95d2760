"""The master's state as its readers see it: one view, rendered three ways.

A :class:`StateView` is made from the core (``Master.view()``) for one reader between two core
calls, and says, once for all of them, what the master shows: which agents, frameworks and tasks,
in which order; what each agent has allocated and reserved; each framework's share and its tasks
by state; the roles with the weights and quotas in force; the cluster's counts and sums; and,
for a console on a big cluster, the rows a GET_STATE query asks for (:mod:`partial`).

Its renderings: GET_STATE's ``StateReply`` (:mod:`operator`), the HTTP ``/state`` document
(``master/server/state_doc.py``), and ``/state/summary`` and the Prometheus metrics from
:meth:`StateView.counts`. The view holds the core's own objects, not copies, so a renderer can
stay as fast as the format allows: read it at once, never across an ``await``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from agora.master.allocator import AllocatorError
from agora.master.core import maintenance, partial
from agora.master.core.state import Agent, Framework, MasterState, OutstandingOffer, Task, TaskKey
from agora.sdk.ids import FrameworkID
from agora.sdk.messages import GetState, MaintenanceSummary, MasterInfo, RoleSummary, TaskState
from agora.sdk.resources import Resources

__all__ = ["SCALARS", "Counts", "FrameworkRow", "StateView"]

#: The scalar resources the counts sum.
SCALARS = ("cpus", "mem", "disk", "gpus")

RUNNING = frozenset({TaskState.RUNNING, TaskState.KILLING})
STAGING = frozenset({TaskState.STAGING, TaskState.STARTING})
LIVE = RUNNING | STAGING


@dataclass(frozen=True, slots=True)
class FrameworkRow:
    """One framework as the master shows it: live (``active``) or completed."""

    framework: Framework
    active: bool
    #: Its dominant share (None when completed, or unknown to the allocator).
    share: float | None

    @property
    def offers(self) -> int:
        """Outstanding offers (a completed framework holds none)."""
        return len(self.framework.offers) if self.active else 0


@dataclass(frozen=True, slots=True)
class Counts:
    """What ``/state/summary`` and ``/metrics`` report; linear in agents + frameworks + tasks."""

    agents: dict[str, int]
    frameworks: dict[str, int]
    tasks: dict[str, int]
    offers: int
    total: dict[str, float]
    allocated: dict[str, float]


class StateView:
    """A reader's view of one master core (see the module's docstring)."""

    __slots__ = ("_st",)

    def __init__(self, st: MasterState) -> None:
        self._st = st

    # ------------------------------------------------------------------ the master

    @property
    def master_info(self) -> MasterInfo:
        return self._st.master_info

    @property
    def cluster(self) -> str:
        return self._st.config.cluster

    @property
    def insecure(self) -> bool:
        return self._st.config.insecure

    @property
    def leader_since(self) -> float:
        return self._st.leader_since

    # ------------------------------------------------------------------ rows, in their order

    def agents(self) -> list[Agent]:
        """Every agent the master knows, by id."""
        agents = self._st.agents
        return [agents[aid] for aid in sorted(agents)]

    def frameworks(self) -> list[FrameworkRow]:
        """Live frameworks by id, then the completed ones the master still remembers."""
        st = self._st
        rows = [
            FrameworkRow(st.frameworks[fid], True, self._share(fid))
            for fid in sorted(st.frameworks)
        ]
        rows.extend(FrameworkRow(fw, False, None) for fw in st.completed_frameworks)
        return rows

    def tasks(self, frameworks: Iterable[FrameworkRow] | None = None) -> list[Task]:
        """Live tasks by (framework, task id), then each framework's completed tasks in the
        order of :meth:`frameworks` (pass its rows to save sorting them again)."""
        st = self._st
        live = st.tasks
        tasks = [live[key] for key in sorted(live)]
        for row in self.frameworks() if frameworks is None else frameworks:
            tasks.extend(row.framework.completed)
        return tasks

    def offers(self) -> Iterator[OutstandingOffer]:
        """Outstanding offers."""
        return iter(self._st.offers.values())

    def roles(self) -> tuple[RoleSummary, ...]:
        """Every role the master knows (configured, weighted, with quota, or a framework's),
        with the weight and quota in force and its share."""
        st = self._st
        weights = {**st.config.weights, **st.registry.weights}  # operator calls override
        quotas = dict(st.config.quotas)
        quotas.update((role, (q.guarantee, q.limit)) for role, q in st.registry.quotas.items())
        # (a removal is an empty quota in the registry)
        quotas = {r: q for r, q in quotas.items() if q[1] is not None or not q[0].is_empty()}
        names = set(st.config.roles) | weights.keys() | quotas.keys()
        for fw in st.frameworks.values():
            names.update(fw.info.roles)
        rows = []
        for role in sorted(names):
            guarantee, limit = quotas.get(role, (None, None))
            rows.append(
                RoleSummary(
                    name=role,
                    weight=weights.get(role, 1.0),
                    guarantee=guarantee,
                    limit=limit,
                    share=st.allocator.role_share(role),
                )
            )
        return tuple(rows)

    def select(self, query: GetState) -> partial.Selection:
        """The rows ``query``'s limits and filters ask for, with the whole cluster's counts."""
        return partial.select(self._st, query)

    # ------------------------------------------------------------------ per row

    def held(self, agent: Agent) -> tuple[Resources, Resources] | None:
        """The allocator's (total, free) of ``agent``; None while it offers nothing of it."""
        alloc = self._st.allocator
        aid = agent.agent_id
        return (alloc.total(aid), alloc.available(aid)) if alloc.has_agent(aid) else None

    def allocated(self, agent: Agent) -> Resources:
        held = self.held(agent)
        return Resources() if held is None else held[0] - held[1]

    def draining(self, agent: Agent) -> bool:
        return agent.agent_id in self._st.registry.draining

    def drained(self, agent: Agent) -> bool:
        """Draining with no live task and no executor left (see ``maintenance``)."""
        return maintenance.drained(self._st, agent)

    def drain_deadline(self, agent: Agent) -> float | None:
        entry = self._st.registry.agents.get(agent.agent_id)
        return entry.drain_deadline if entry is not None and entry.draining else None

    def maintenance(self) -> tuple[MaintenanceSummary, ...]:
        """Maintenance windows, as of the master's last look at them (at most a second ago)."""
        st = self._st
        return maintenance.summaries(st, st.maintenance.checked_at)

    def count(self, keys: Iterable[TaskKey], states: frozenset[TaskState]) -> int:
        """How many of the live tasks ``keys`` names are in one of ``states``."""
        tasks = self._st.tasks
        return sum(1 for k in keys if (task := tasks.get(k)) is not None and task.state in states)

    def task_states(self) -> dict[str, dict[str, int]]:
        """Registered framework id -> its live tasks by state (frameworks without one are
        absent), from the counts kept as tasks change."""
        by_framework: dict[str, dict[str, int]] = {}
        for fid, fw in self._st.frameworks.items():
            counts = {state.value: n for state, n in fw.live.items() if n}
            if counts:
                by_framework[fid] = counts
        return by_framework

    def framework_count(self, fw: Framework, states: frozenset[TaskState]) -> int:
        """How many of ``fw``'s live tasks are in one of ``states``: from its kept counts while
        it is registered, by a walk over its tasks once it was removed."""
        if self._st.frameworks.get(fw.framework_id) is fw:
            return sum(fw.live[state] for state in states)
        return self.count(fw.tasks, states)

    def _share(self, framework_id: FrameworkID) -> float | None:
        try:
            return self._st.allocator.share(framework_id)
        except AllocatorError:
            return None

    # ------------------------------------------------------------------ the whole cluster

    def counts(self) -> Counts:
        """The cluster counted: the same agents, frameworks and tasks the rows list."""
        st = self._st
        alloc = st.allocator
        agents = {"ACTIVE": 0, "UNREACHABLE": 0, "DISCONNECTED": 0, "DRAINING": 0, "DRAINED": 0}
        registry = st.registry.agents
        # Sums in thousandths (this runs on every scrape): each agent's total is read from the
        # scalars its resources keep; what frameworks hold comes summed from the allocator.
        total_milli = dict.fromkeys(SCALARS, 0)
        held = alloc.allocated_scalars()
        used_milli = {name: held.get(name, 0) for name in SCALARS}
        for agent in st.agents.values():
            agents[agent.status.value] = agents.get(agent.status.value, 0) + 1
            if agent.status.value == "ACTIVE":
                if agent.missed_pings > 1:
                    agents["DISCONNECTED"] += 1  # silent through a whole ping round
                entry = registry.get(agent.agent_id)
                if entry is not None and entry.draining:
                    agents["DRAINING"] += 1  # (active ones, as GET_STATE counts them)
                    agents["DRAINED"] += maintenance.drained(st, agent)  # (of the draining)
            _add(total_milli, agent.info.resources.scalar_totals_view())
        connected = sum(1 for fw in st.frameworks.values() if fw.connected)
        tasks = st.tally.by_state()  # kept as tasks change: no walk over them
        return Counts(
            agents=agents,
            frameworks={
                "active": len(st.frameworks),
                "inactive": len(st.completed_frameworks),
                "connected": connected,
                "disconnected": len(st.frameworks) - connected,
            },
            tasks=tasks,
            offers=len(st.offers),
            total={name: milli / 1000 for name, milli in total_milli.items()},
            allocated={name: milli / 1000 for name, milli in used_milli.items()},
        )


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for name in into:
        into[name] += amounts.get(name, 0)
