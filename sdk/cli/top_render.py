"""``agora top``'s screen as a pure function of (state, history, events, size); the event feed
itself comes from :mod:`top_events`.

Nothing here talks to the master or the terminal, so every frame can be rendered (and tested) with
a recording rich Console. The work per frame is linear in the state with small constants, and only
the rows that fit are built, so a frame for 10,000 agents stays well under a second.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agora.sdk.cli.common import duration
from agora.sdk.cli.show import INSECURE, agent_status
from agora.sdk.cli.top_events import Event, all_agents, all_tasks
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    MasterMember,
    StateReply,
    TaskState,
    TaskSummary,
)
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = [
    "FOCUSABLE",
    "HISTORY",
    "MAX_ROWS",
    "RESOURCES",
    "History",
    "Rows",
    "Totals",
    "View",
    "bar",
    "render",
    "screen_rows",
    "sparkline",
    "totals",
]

#: The scalar resources shown as utilization bars.
RESOURCES: Final = ("cpus", "mem", "disk", "gpus")
#: Samples kept per resource for the sparklines.
HISTORY: Final = 60
#: Tables that ``tab`` cycles through (the focused one is the one ``/`` filters).
FOCUSABLE: Final = ("agents", "frameworks", "tasks")
#: Rows of a frame with no height (``--once``).
MAX_AGENT_ROWS: Final = 20
MAX_TASK_ROWS: Final = 15
#: The most rows of one table, however tall the screen.
MAX_ROWS: Final = 200
MAX_EVENTS: Final = 200

_SPARKS: Final = " ▁▂▃▄▅▆▇█"
_STATE_STYLE: Final = {
    TaskState.FINISHED: "green",
    TaskState.FAILED: "red",
    TaskState.ERROR: "red",
    TaskState.LOST: "red",
    TaskState.DROPPED: "red",
    TaskState.KILLED: "yellow",
    TaskState.KILLING: "yellow",
    TaskState.RUNNING: "cyan",
    TaskState.STAGING: "blue",
    TaskState.STARTING: "blue",
    TaskState.UNREACHABLE: "magenta",
    TaskState.GONE: "red",
    TaskState.GONE_BY_OPERATOR: "red",
}
_ACTIVE_TASK: Final = frozenset({TaskState.RUNNING, TaskState.KILLING})
_PENDING_TASK: Final = frozenset({TaskState.STAGING, TaskState.STARTING})
_AGENT_STYLE: Final = {"ACTIVE": "", "DRAINING": "bold yellow", "DRAINED": "yellow"}


# ---------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class Totals:
    """Per resource: the cluster's total and what is allocated of it (in whole units)."""

    total: dict[str, float]
    allocated: dict[str, float]

    def share(self, name: str) -> float:
        total = self.total.get(name, 0.0)
        return self.allocated.get(name, 0.0) / total if total > 0 else 0.0


@dataclass(slots=True)
class History:
    """The last :data:`HISTORY` allocated shares per resource, oldest first."""

    size: int = HISTORY
    samples: dict[str, deque[float]] = field(default_factory=dict)

    def add(self, sums: Totals) -> None:
        for name in RESOURCES:
            self.samples.setdefault(name, deque(maxlen=self.size)).append(sums.share(name))

    def of(self, name: str) -> Sequence[float]:
        return tuple(self.samples.get(name, ()))


@dataclass(frozen=True, slots=True)
class View:
    """What the operator chose: the focused table and the text its rows must contain."""

    focus: str = "agents"
    filter: str = ""
    editing: bool = False  # typing a filter after `/`
    error: str = ""  # the last failed poll, if the latest one failed


@dataclass(frozen=True, slots=True)
class Rows:
    """How many rows each table of a frame gets."""

    agents: int
    frameworks: int
    tasks: int
    events: int


def totals(state: StateReply) -> Totals:
    """The cluster's resources: the master's sums for a partial reply, else the agents' rows."""
    total: dict[str, float] = dict.fromkeys(RESOURCES, 0.0)
    alloc: dict[str, float] = dict.fromkeys(RESOURCES, 0.0)
    if state.partial:
        for sums, into in ((state.resources_total, total), (state.resources_allocated, alloc)):
            for name, milli in sums.scalar_totals_milli().items():
                if name in into:
                    into[name] = milli / 1000
        return Totals(total, alloc)
    for agent in state.agents:
        for name, milli in agent.resources.scalar_totals_milli().items():
            if name in total:
                total[name] += milli / 1000
        for name, milli in agent.allocated.scalar_totals_milli().items():
            if name in alloc:
                alloc[name] += milli / 1000
    return Totals(total, alloc)


# ---------------------------------------------------------------- small pieces


def bar(share: float, width: int) -> Text:
    """A ``width``-cell bar filled to ``share`` (0..1), green/yellow/red by level."""
    share = min(max(share, 0.0), 1.0)
    filled = round(share * width)
    style = "red" if share >= 0.9 else "yellow" if share >= 0.7 else "green"
    text = Text()
    text.append("█" * filled, style=style)
    text.append("░" * (width - filled), style="grey37")
    return text


def sparkline(samples: Iterable[float], width: int = HISTORY) -> str:
    """The last ``width`` shares (0..1) as block characters."""
    values = list(samples)[-width:]
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round(min(max(v, 0.0), 1.0) * top)] for v in values)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _num(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts > 0 else ""


def _state(state: TaskState) -> Text:
    return Text(state.name, style=_STATE_STYLE.get(state, ""))


def _matches(needle: str, *fields: str) -> bool:
    return not needle or any(needle in f.lower() for f in fields)


def _title(name: str, shown: int, total: int, view: View) -> str:
    """``Agents (20 of 10000)``: the rows shown and how many there are (of a partial reply:
    in the whole cluster)."""
    mark = "▶ " if view.focus == name else ""
    label = name.capitalize()
    count = f"{shown} of {total}" if shown < total else str(total)
    filt = f"  /{view.filter}" if view.focus == name and view.filter else ""
    return f"{mark}{label} ({count}){filt}"


def _border(name: str, view: View) -> str:
    return "bright_cyan" if view.focus == name else "grey50"


# ---------------------------------------------------------------- sections


def _header(state: StateReply, now: float, view: View) -> Group:
    """Two lines: the cluster (marked when its master runs without CURVE) and its counts (and a
    failed poll, a filter being typed); then who leads, since when, and the standbys."""
    info = state.master_info
    first = Text.assemble(
        ("agora top", "bold"),
        "  ",
        (state.cluster or "agora", "bold cyan"),
        *(("  ", (INSECURE, "bold white on red")) if state.insecure else ()),
        f"  {_clock(now)}  │ agents {_agent_count(state)}  frameworks {len(state.frameworks)}",
        f"  tasks {_task_count(state)}",
        no_wrap=True,
        overflow="ellipsis",
    )
    if view.error:
        first.append(f"  ⚠ {view.error}", style="bold red")
    if view.editing:
        first.append(f"  filter: /{view.filter}▏", style="bold")
    second = Text.assemble(
        "leader ",
        (info.address, "bold"),
        f" ({info.master_id})  epoch {info.epoch}",
        no_wrap=True,
        overflow="ellipsis",
    )
    if state.leader_since > 0:
        second.append(f"  leading for {duration(now - state.leader_since)}")
    if state.masters:
        second.append("  │ ")
        second.append_text(_standbys(state.masters))
    if state.maintenance:
        second.append("  │ ")
        second.append(maintenance_line(state, now), style="yellow")
    return Group(first, second)


def maintenance_line(state: StateReply, now: float) -> str:
    """``maintenance h1 DRAINING (1/2 accepted), h2 in 10m``: each window, briefly."""
    parts = []
    for w in state.maintenance:
        status = f"in {duration(w.start - now)}" if w.status == "SCHEDULED" else w.status
        accepted = sum(1 for a in w.answers if a.answer == "ACCEPTED")
        answers = f" ({accepted}/{len(w.answers)} accepted)" if w.answers else ""
        parts.append(f"{w.hostname} {status}{answers}")
    return "maintenance " + ", ".join(parts)


def _agent_count(state: StateReply) -> str:
    """``12`` of a full reply; ``10000 (showing 20, 3 unreachable, 1 draining)`` of a partial
    one (the counts of the whole cluster, from the master)."""
    if all_agents(state):
        return str(len(state.agents))
    notes = [f"showing {len(state.agents)}"]
    if state.agents_unreachable:
        notes.append(f"{state.agents_unreachable} unreachable")
    if state.agents_draining:
        notes.append(f"{state.agents_draining} draining")
    return f"{state.agents_total} ({', '.join(notes)})"


def _task_count(state: StateReply) -> str:
    """``5 (2 live)`` of a full reply; ``20000 (showing 20)`` of a partial one (the rows are the
    tasks updated last, so how many are live is not known)."""
    if not all_tasks(state):
        return f"{state.tasks_total} (showing {len(state.tasks)})"
    live = sum(1 for t in state.tasks if t.state in _ACTIVE_TASK or t.state in _PENDING_TASK)
    return f"{len(state.tasks)} ({live} live)"


def _standbys(masters: Sequence[MasterMember]) -> Text:
    standbys = [m for m in masters if m.role != "leader"]
    if not standbys:
        return Text("no standbys", style="yellow")
    text = Text(f"standbys {len(standbys)}")
    down = [m.address for m in standbys if not m.reachable]
    if down:
        text.append(f", {len(down)} unreachable: {', '.join(down)}", style="bold red")
    return text


def _utilization(sums: Totals, history: History, width: int) -> Panel:
    grid = Table.grid(padding=(0, 1))
    bar_width = max(10, min(40, width // 5))
    spark_width = max(10, min(HISTORY, width - bar_width - 40))
    grid.add_column(width=5)
    grid.add_column(width=bar_width)
    grid.add_column(justify="right", min_width=24)
    grid.add_column(width=spark_width, no_wrap=True)
    for name in RESOURCES:
        share = sums.share(name)
        amount = f"{_num(sums.allocated[name])}/{_num(sums.total[name])} ({share:.0%})"
        grid.add_row(
            name, bar(share, bar_width), amount, Text(sparkline(history.of(name), spark_width))
        )
    return Panel(grid, title="Utilization (allocated / total)", title_align="left", expand=True)


def _agent_rank(a: AgentSummary) -> tuple[bool, float]:
    """Agents an operator must see (not ACTIVE, or drained) first, then the busiest: the
    master's order for a partial reply."""
    return (a.status != "ACTIVE" or a.draining, _agent_share(a))


def _agent_share(a: AgentSummary) -> float:
    best = 0.0
    for name in ("cpus", "mem"):
        total = a.resources.scalar_milli(name)
        if total > 0:
            best = max(best, a.allocated.scalar_milli(name) / total)
    return best


def _agents(state: StateReply, rows: int, view: View, task_counts: Mapping[str, int]) -> Table:
    """The agents table; ``task_counts``: live tasks by agent id."""
    needle = view.filter.lower() if view.focus == "agents" else ""
    agents: Iterable[AgentSummary] = state.agents
    if needle:
        agents = [
            a for a in state.agents if _matches(needle, a.hostname, agent_status(a), a.agent_id)
        ]
    matching = agents if isinstance(agents, list | tuple) else list(agents)
    top = heapq.nlargest(rows, matching, key=_agent_rank)
    total = len(matching) if all_agents(state) else state.agents_total
    table = Table(
        title=_title("agents", len(top), total, view),
        title_justify="left",
        expand=True,
        border_style=_border("agents", view),
    )
    table.add_column("HOSTNAME", no_wrap=True, overflow="ellipsis", min_width=8, ratio=1)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("CPUS", no_wrap=True)
    table.add_column("MEM", no_wrap=True)
    table.add_column("TASKS", justify="right")
    for a in top:
        status_name = agent_status(a)
        status = Text(status_name, style=_AGENT_STYLE.get(status_name, "bold red"))
        table.add_row(
            a.hostname,
            status,
            _resource_cell(a, "cpus"),
            _resource_cell(a, "mem"),
            str(task_counts.get(a.agent_id, 0)),
        )
    return table


def _resource_cell(a: AgentSummary, name: str) -> Text:
    total = a.resources.scalar(name)
    used = a.allocated.scalar(name)
    cell = bar(used / total if total > 0 else 0.0, 8)
    cell.append(f" {_num(used)}/{_num(total)}")
    return cell


def _frameworks(state: StateReply, rows: int, view: View) -> Table:
    needle = view.filter.lower() if view.focus == "frameworks" else ""
    running: dict[str, int] = {}
    staging: dict[str, int] = {}
    if all_tasks(state):
        for t in state.tasks:
            if t.state in _ACTIVE_TASK:
                running[t.framework_id] = running.get(t.framework_id, 0) + 1
            elif t.state in _PENDING_TASK:
                staging[t.framework_id] = staging.get(t.framework_id, 0) + 1
    else:  # the rows are the tasks updated last: the master's counts
        running = {f.framework_id: f.running for f in state.frameworks}
        staging = {f.framework_id: f.staging for f in state.frameworks}
    matching = [
        f
        for f in state.frameworks
        if _matches(needle, f.name, f.framework_id, ",".join(f.roles), f.user)
    ]
    shown = sorted(matching, key=lambda f: (not f.active, -running.get(f.framework_id, 0)))[:rows]
    table = Table(
        title=_title("frameworks", len(shown), len(matching), view),
        title_justify="left",
        expand=True,
        border_style=_border("frameworks", view),
    )
    table.add_column("NAME", no_wrap=True, overflow="ellipsis", min_width=8, ratio=1)
    table.add_column("ROLES", overflow="ellipsis", no_wrap=True, min_width=5, ratio=1)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("SHARE", justify="right")
    table.add_column("RUN", justify="right")  # running (and killing) tasks
    table.add_column("STAGE", justify="right")  # staging and starting tasks
    table.add_column("OFFERS", justify="right")
    for f in shown:
        table.add_row(
            f.name,
            ",".join(f.roles),
            _framework_status(f),
            _percent(f.share),
            str(running.get(f.framework_id, 0)),
            str(staging.get(f.framework_id, 0)),
            str(f.offers),
        )
    return table


def _framework_status(f: FrameworkSummary) -> Text:
    if not f.active:
        return Text("INACTIVE", style="red")
    return Text("ACTIVE") if f.connected else Text("DISCONNECTED", style="bold yellow")


def _tasks(state: StateReply, rows: int, view: View, hosts: Mapping[str, str]) -> Table:
    needle = view.filter.lower() if view.focus == "tasks" else ""
    matching: Sequence[TaskSummary] = state.tasks
    if needle:
        matching = [
            t
            for t in state.tasks
            if _matches(
                needle, t.task_id, t.name, t.state.name, hosts.get(t.agent_id, ""), t.agent_id
            )
        ]
    latest = heapq.nlargest(rows, matching, key=lambda t: t.timestamp)
    total = len(matching) if all_tasks(state) else state.tasks_total
    table = Table(
        title=_title("tasks", len(latest), total, view),
        title_justify="left",
        expand=True,
        border_style=_border("tasks", view),
    )
    table.add_column("TASK", no_wrap=True, overflow="ellipsis", min_width=8, ratio=2)
    table.add_column("STATE", no_wrap=True)
    table.add_column("HOST", no_wrap=True, overflow="ellipsis", min_width=8, ratio=1)
    table.add_column("EXIT", justify="right")
    table.add_column("UPDATED", no_wrap=True)
    for t in latest:
        table.add_row(
            t.task_id,
            _state(t.state),
            hosts.get(t.agent_id, t.agent_id),
            "" if t.exit_code is None else str(t.exit_code),
            _clock(t.timestamp),
        )
    return table


def _events(events: Sequence[Event], rows: int) -> Table:
    table = Table(
        title=f"Events ({len(events)})", title_justify="left", expand=True, border_style="grey50"
    )
    table.add_column("TIME", no_wrap=True)
    table.add_column("EVENT", overflow="ellipsis", no_wrap=True, ratio=1)
    for e in list(events)[-rows:][::-1]:
        table.add_row(_clock(e.when), Text(e.text, style=e.style))
    return table


def _side_by_side(left: RenderableType, right: RenderableType, ratio: tuple[int, int]) -> Table:
    grid = Table.grid(expand=True, padding=(0, 1))
    grid.add_column(ratio=ratio[0])
    grid.add_column(ratio=ratio[1])
    grid.add_row(left, right)
    return grid


# ---------------------------------------------------------------- the frame

#: Below this width the four tables are stacked rather than two by two.
_WIDE: Final = 140
#: Lines a frame takes besides table rows: header 2, utilization 6, and 5 per row of tables.
_FIXED_WIDE: Final = 8 + 2 * 5
_FIXED_NARROW: Final = 8 + 4 * 5


def screen_rows(size: tuple[int, int | None]) -> Rows:
    """The rows each table gets on a screen of ``size`` = (width, height): what the height
    leaves room for (at most :data:`MAX_ROWS` each); with no height (``--once``),
    :data:`MAX_AGENT_ROWS` and :data:`MAX_TASK_ROWS`."""
    width, height = size
    if height is None:
        return Rows(MAX_AGENT_ROWS, MAX_AGENT_ROWS, MAX_TASK_ROWS, MAX_TASK_ROWS)
    if width >= _WIDE:
        room = max(2, height - _FIXED_WIDE)
        agents = max(1, min(MAX_ROWS, room // 2))
        tasks = max(1, min(MAX_ROWS, room - agents))
        return Rows(agents, agents, tasks, tasks)
    room = max(4, height - _FIXED_NARROW)
    agents = max(1, min(MAX_ROWS, room * 2 // 5))
    frameworks = max(1, min(MAX_ROWS, room // 5))
    tasks = max(1, min(MAX_ROWS, room // 5))
    return Rows(
        agents, frameworks, tasks, max(1, min(MAX_ROWS, room - agents - frameworks - tasks))
    )


def render(
    state: StateReply,
    history: History,
    events: Sequence[Event],
    size: tuple[int, int | None],
    *,
    now: float | None = None,
    view: View | None = None,
) -> RenderableType:
    """One frame for a screen of ``size`` = (width, height); height None = no limit (``--once``).

    Wide screens get the tables two by two (agents | frameworks, tasks | events), narrow ones
    stacked; the row counts follow the height (:func:`screen_rows`). A partial reply (a big
    cluster's top rows) shows the master's counts and sums of the whole cluster."""
    width, _height = size
    view = view or View()
    now = time.time() if now is None else now
    wide = width >= _WIDE
    rows = screen_rows(size)
    hosts: dict[str, str] = {a.agent_id: a.hostname for a in state.agents}
    task_counts: dict[str, int] = {}
    if all_tasks(state):
        for t in state.tasks:
            if t.state in _ACTIVE_TASK or t.state in _PENDING_TASK:
                task_counts[t.agent_id] = task_counts.get(t.agent_id, 0) + 1
    else:  # the rows are the tasks updated last: the master's counts
        task_counts = {a.agent_id: a.tasks for a in state.agents}
    sums = totals(state)
    agents = _agents(state, rows.agents, view, task_counts)
    frameworks = _frameworks(state, rows.frameworks, view)
    tasks = _tasks(state, rows.tasks, view, hosts)
    feed = _events(events, rows.events)
    head = (_header(state, now, view), _utilization(sums, history, width))
    if not wide:
        return Group(*head, agents, frameworks, tasks, feed)
    return Group(
        *head, _side_by_side(agents, frameworks, (1, 1)), _side_by_side(tasks, feed, (1, 1))
    )
