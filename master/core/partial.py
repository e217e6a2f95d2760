"""A partial view of the master for consoles on big clusters: the rows GET_STATE's limits and
filters ask for, and the counts and sums of the whole cluster that the rows left out would have
given.

Without a filter it costs the rows chosen, not the cluster: the agents come from the
allocator's busiest-first index after the few an operator must see, the tasks from the master's
recency order, and the counts and sums are kept as the state changes. A filter reads rows in
the same order until enough match.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import TypeVar

from agora.master.core.state import Agent, AgentStatus, MasterState, Task
from agora.sdk.ids import AgentID
from agora.sdk.messages import GetState
from agora.sdk.resources import Resources

__all__ = ["Selection", "select"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Selection:
    agents: list[Agent]
    tasks: list[Task]
    agents_total: int
    tasks_total: int
    agents_unreachable: int
    agents_draining: int
    resources_total: Resources
    resources_allocated: Resources


def select(st: MasterState, query: GetState) -> Selection:
    draining = _draining(st)
    rows: Iterable[Agent] = _agents_in_order(st, draining)
    needle = query.agents_filter.lower()
    if needle:
        rows = (
            a
            for a in rows
            if _contains(
                needle,
                a.agent_id,
                a.info.hostname,
                a.status.value,
                "DRAINING" if a.agent_id in draining else "",
            )
        )
    return Selection(
        agents=_take(rows, query.agents_limit),
        tasks=_tasks(st, query),
        agents_total=len(st.agents),
        tasks_total=st.tally.total(),
        agents_unreachable=len(st.offline_agents),
        agents_draining=len(draining),
        resources_total=_scalars(st.agent_totals),
        resources_allocated=_scalars(st.allocator.allocated_scalars()),
    )


def _draining(st: MasterState) -> set[AgentID]:
    """ACTIVE agents an operator drained (they get no offers)."""
    out = set()
    for aid in st.registry.draining:
        agent = st.agents.get(aid)
        if agent is not None and agent.status is AgentStatus.ACTIVE:
            out.add(aid)
    return out


def _agents_in_order(st: MasterState, draining: set[AgentID]) -> Iterator[Agent]:
    """Every agent: the ones an operator must see (not ACTIVE, or drained) first, the busiest
    of those first; then the others, busiest first (see ``Allocator.busiest``)."""
    alloc = st.allocator

    def busy(aid: AgentID) -> int:
        return alloc.busy_percent(aid) if alloc.has_agent(aid) else 0

    notable = sorted(chain(st.offline_agents, draining), key=lambda aid: (-busy(aid), aid))
    agents = st.agents
    for aid in chain(notable, (aid for aid in alloc.busiest() if aid not in draining)):
        agent = agents.get(aid)
        if agent is not None:
            yield agent


def _tasks(st: MasterState, query: GetState) -> list[Task]:
    """The tasks the master changed last (launched, or given a status), live and completed."""
    rows: Iterable[Task] = st.recency.latest()
    needle = query.tasks_filter.lower()
    if needle:
        rows = (
            task
            for task in rows
            if _contains(needle, task.info.task_id, task.info.name, task.state.value, task.agent_id)
        )
    return _take(rows, query.tasks_limit)


def _take(rows: Iterable[R], limit: int | None) -> list[R]:
    return list(rows if limit is None else islice(rows, limit))


def _contains(needle: str, *fields: str) -> bool:
    return any(needle in field.lower() for field in fields)


def _scalars(milli: dict[str, int]) -> Resources:
    return Resources.from_dict({name: v / 1000 for name, v in milli.items() if v > 0})
