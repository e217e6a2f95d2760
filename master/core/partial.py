"""A partial view of the master for consoles on big clusters: the rows GET_STATE's limits and
filters ask for, and the counts and sums of the whole cluster that the rows left out would have
given. Linear in agents and tasks, with no per-row records built for the rows not chosen."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from agora.master.core.state import Agent, AgentStatus, Framework, MasterState, Task
from agora.sdk.ids import AgentID
from agora.sdk.messages import GetState
from agora.sdk.resources import Resources

__all__ = ["Selection", "select"]


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
    registry = st.registry.agents
    alloc = st.allocator
    total: dict[str, int] = {}
    used: dict[str, int] = {}
    unreachable = draining = 0
    #: (0 for agents an operator must see, 1 for the others; then the allocated share)
    ranked: list[tuple[int, float, AgentID]] = []
    needle = query.agents_filter.lower()
    for aid, agent in st.agents.items():
        entry = registry.get(aid)
        drained = entry is not None and entry.draining
        share = 0.0
        agent_total = agent.info.resources.scalar_totals_view()
        _add(total, agent_total)
        if agent.status is AgentStatus.ACTIVE:
            draining += drained
            if alloc.has_agent(aid):
                held_total, free = alloc.scalars(aid)
                for n, v in held_total.items():
                    held = v - free.get(n, 0)
                    if held:
                        used[n] = used.get(n, 0) + held
                        whole = agent_total.get(n)
                        if whole and held / whole > share:
                            share = held / whole
        else:
            unreachable += 1
        status = "DRAINING" if drained and agent.status is AgentStatus.ACTIVE else ""
        if needle and not _contains(needle, aid, agent.info.hostname, agent.status.value, status):
            continue
        notable = agent.status is not AgentStatus.ACTIVE or drained
        ranked.append((0 if notable else 1, -share, aid))
    limit = query.agents_limit
    chosen = heapq.nsmallest(limit, ranked) if limit is not None else sorted(ranked)
    tasks = _tasks(st, query)
    return Selection(
        agents=[st.agents[aid] for _, _, aid in chosen],
        tasks=tasks,
        agents_total=len(st.agents),
        tasks_total=st.tally.total(),
        agents_unreachable=unreachable,
        agents_draining=draining,
        resources_total=_scalars(total),
        resources_allocated=_scalars(used),
    )


def _tasks(st: MasterState, query: GetState) -> list[Task]:
    """The tasks updated last (by their latest status), live and completed."""
    needle = query.tasks_filter.lower()
    candidates: Iterator[Task] = (
        task
        for task in _every_task(st)
        if not needle
        or _contains(needle, task.info.task_id, task.info.name, task.state.value, task.agent_id)
    )
    limit = query.tasks_limit
    if limit is None:
        return list(candidates)
    return heapq.nlargest(limit, candidates, key=_updated)


def _updated(task: Task) -> float:
    return 0.0 if task.status is None else task.status.timestamp


def _every_task(st: MasterState) -> Iterator[Task]:
    yield from st.tasks.values()
    for fw in _all_frameworks(st):
        yield from fw.completed


def _all_frameworks(st: MasterState) -> Iterator[Framework]:
    yield from st.frameworks.values()
    yield from st.completed_frameworks


def _contains(needle: str, *fields: str) -> bool:
    return any(needle in field.lower() for field in fields)


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for name, milli in amounts.items():
        into[name] = into.get(name, 0) + milli


def _scalars(milli: dict[str, int]) -> Resources:
    return Resources.from_dict({name: v / 1000 for name, v in milli.items() if v > 0})
