"""``agora top``'s event feed: what changed between two successive :class:`StateReply` snapshots
that an operator should notice (agents lost, drained or back, frameworks gone or reconnected, a
new leader, tasks that failed and why)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agora.sdk.messages import StateReply, TaskState, TaskSummary

__all__ = ["Event", "diff_states"]

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


def diff_states(prev: StateReply | None, cur: StateReply, now: float) -> list[Event]:
    """What changed from ``prev`` to ``cur`` that an operator should notice, oldest-first."""
    if prev is None:
        return []
    out: list[Event] = []
    was, info = prev.master_info, cur.master_info
    if (was.address, was.epoch, was.master_id) != (info.address, info.epoch, info.master_id):
        text = f"leader changed to {info.address} ({info.master_id}, epoch {info.epoch})"
        out.append(Event(now, text, "yellow"))
    before_agents = {a.agent_id: a for a in prev.agents}
    now_agents = {a.agent_id: a for a in cur.agents}
    for aid, a in now_agents.items():
        old = before_agents.get(aid)
        if old is None:
            out.append(Event(now, f"agent {a.hostname} registered", "green"))
        else:
            if old.status != a.status:
                style = "green" if a.status == "ACTIVE" else "red"
                out.append(Event(now, f"agent {a.hostname} became {a.status}", style))
            if old.draining != a.draining:
                done = ("drained", "yellow") if a.draining else ("reactivated", "green")
                out.append(Event(now, f"agent {a.hostname} {done[0]}", done[1]))
    for aid, a in before_agents.items():
        if aid not in now_agents:
            out.append(Event(now, f"agent {a.hostname} removed", "red"))
    before_fw = {f.framework_id: f for f in prev.frameworks}
    now_fw = {f.framework_id: f for f in cur.frameworks}
    for fid, f in now_fw.items():
        old_fw = before_fw.get(fid)
        if old_fw is None:
            out.append(Event(now, f"framework {f.name} registered", "green"))
            continue
        if old_fw.active and not f.active:
            out.append(Event(now, f"framework {f.name} removed", "red"))
        elif old_fw.connected and not f.connected:
            out.append(Event(now, f"framework {f.name} disconnected", "yellow"))
        elif not old_fw.connected and f.connected:
            out.append(Event(now, f"framework {f.name} reconnected", "green"))
    for fid, f in before_fw.items():
        if fid not in now_fw:
            out.append(Event(now, f"framework {f.name} removed", "red"))
    before_tasks = {(t.framework_id, t.task_id): t.state for t in prev.tasks}
    for t in cur.tasks:
        if before_tasks.get((t.framework_id, t.task_id)) == t.state:
            continue
        if t.state is TaskState.FINISHED:
            out.append(Event(now, f"task {t.task_id} finished", "green"))
        elif t.state in _FAILED:
            out.append(Event(now, f"task {t.task_id} {t.state.name}{_why(t)}", "red"))
        elif t.state is TaskState.KILLED:
            out.append(Event(now, f"task {t.task_id} killed", "yellow"))
    return out


def _why(t: TaskSummary) -> str:
    parts = [t.reason.name] if t.reason is not None else []
    if t.exit_code is not None:
        parts.append(f"exit {t.exit_code}")
    if t.message:
        parts.append(t.message)
    return f": {', '.join(parts)}" if parts else ""
