"""``agora top``'s event feed: what changed between two successive :class:`StateReply` snapshots
that an operator should notice (agents lost, drained or back, frameworks gone, failed over or
reconnected, a new leader, tasks that failed and why).

A big cluster's replies are partial: a window of rows (the agents an operator must see, then the
busiest; the tasks updated last) with the whole cluster's counts. Then a row that enters or leaves
the window is not news in itself. The rules:

* ``registered`` and ``removed`` only when both replies hold every agent;
* an agent already in the previous window reports its changes as always (``became UNREACHABLE``,
  ``drained``, ...); one that enters the window not ACTIVE, or drained, reports that once (the
  master puts such agents first, so they enter the window when they change);
* a task that enters the window in an end state reports its outcome (the window holds the tasks
  updated last, so it has just ended);
* frameworks are always all there: their events are as for full replies;
* when the query changed between the two replies (a new filter, a taller screen), rows that
  entered the window report nothing: they came in because the window moved (``window_moved``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agora.sdk.messages import AgentSummary, StateReply, TaskState, TaskSummary

__all__ = ["Event", "all_agents", "all_tasks", "diff_states"]

_FAILED: Final = frozenset(
    {
        TaskState.FAILED,
        TaskState.ERROR,
        TaskState.LOST,
        TaskState.DROPPED,
        TaskState.GONE,
        TaskState.GONE_BY_OPERATOR,
    }
)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the event feed."""

    when: float
    text: str
    style: str = ""


def all_agents(state: StateReply) -> bool:
    """Whether ``state`` lists every agent of the cluster (a full reply, or a partial one whose
    window held them all)."""
    return not state.partial or len(state.agents) == state.agents_total


def all_tasks(state: StateReply) -> bool:
    """Whether ``state`` lists every task the master knows (see :func:`all_agents`)."""
    return not state.partial or len(state.tasks) == state.tasks_total


def diff_states(
    prev: StateReply | None, cur: StateReply, now: float, *, window_moved: bool = False
) -> list[Event]:
    """What changed from ``prev`` to ``cur`` that an operator should notice, oldest-first (the
    rules for partial replies are in the module's docstring)."""
    if prev is None:
        return []
    out: list[Event] = []
    was, info = prev.master_info, cur.master_info
    if (was.address, was.epoch, was.master_id) != (info.address, info.epoch, info.master_id):
        text = f"leader changed to {info.address} ({info.master_id}, epoch {info.epoch})"
        out.append(Event(now, text, "yellow"))
    out += _agents(prev, cur, now, window_moved=window_moved)
    out += _frameworks(prev, cur, now)
    before_tasks = {(t.framework_id, t.task_id): t.state for t in prev.tasks}
    complete = all_tasks(prev) and all_tasks(cur)
    for t in cur.tasks:
        old = before_tasks.get((t.framework_id, t.task_id))
        if old == t.state or (old is None and window_moved and not complete):
            continue
        if t.state is TaskState.FINISHED:
            out.append(Event(now, f"task {t.task_id} finished", "green"))
        elif t.state in _FAILED:
            out.append(Event(now, f"task {t.task_id} {t.state.name}{_why(t)}", "red"))
        elif t.state is TaskState.KILLED:
            out.append(Event(now, f"task {t.task_id} killed", "yellow"))
    return out


def _agents(prev: StateReply, cur: StateReply, now: float, *, window_moved: bool) -> list[Event]:
    out: list[Event] = []
    complete = all_agents(prev) and all_agents(cur)
    before = {a.agent_id: a for a in prev.agents}
    current = {a.agent_id: a for a in cur.agents}
    for aid, a in current.items():
        old = before.get(aid)
        if old is not None:
            out += _agent_changes(old, a, now)
        elif complete:
            out.append(Event(now, f"agent {a.hostname} registered", "green"))
        elif not window_moved:
            out += _agent_changes(None, a, now)
    if complete:
        for aid, a in before.items():
            if aid not in current:
                out.append(Event(now, f"agent {a.hostname} removed", "red"))
    return out


def _agent_changes(old: AgentSummary | None, a: AgentSummary, now: float) -> list[Event]:
    """``a``'s status and drain changes since ``old``; None: it just entered a partial window,
    so only a status other than ACTIVE, or a drain, is worth a line."""
    out: list[Event] = []
    was_status, was_draining = ("ACTIVE", False) if old is None else (old.status, old.draining)
    if was_status != a.status:
        style = "green" if a.status == "ACTIVE" else "red"
        out.append(Event(now, f"agent {a.hostname} became {a.status}", style))
    if was_draining != a.draining:
        done = ("drained", "yellow") if a.draining else ("reactivated", "green")
        out.append(Event(now, f"agent {a.hostname} {done[0]}", done[1]))
    if a.drained and (old is None or not old.drained):
        out.append(Event(now, f"agent {a.hostname} is DRAINED (empty)", "yellow"))
    return out


def _frameworks(prev: StateReply, cur: StateReply, now: float) -> list[Event]:
    out: list[Event] = []
    before = {f.framework_id: f for f in prev.frameworks}
    current = {f.framework_id: f for f in cur.frameworks}
    for fid, f in current.items():
        old = before.get(fid)
        if old is None:
            out.append(Event(now, f"framework {f.name} registered", "green"))
            continue
        if old.active and not f.active:
            out.append(Event(now, f"framework {f.name} removed", "red"))
        elif old.connected and not f.connected:
            out.append(Event(now, f"framework {f.name} disconnected", "yellow"))
        elif f.failovers > old.failovers:  # a new scheduler took over, maybe between polls
            out.append(Event(now, f"framework {f.name} failed over", "yellow"))
        elif not old.connected and f.connected:
            out.append(Event(now, f"framework {f.name} reconnected", "green"))
    for fid, f in before.items():
        if fid not in current:
            out.append(Event(now, f"framework {f.name} removed", "red"))
    return out


def _why(t: TaskSummary) -> str:
    parts = [t.reason.name] if t.reason is not None else []
    if t.exit_code is not None:
        parts.append(f"exit {t.exit_code}")
    if t.message:
        parts.append(t.message)
    return f": {', '.join(parts)}" if parts else ""
