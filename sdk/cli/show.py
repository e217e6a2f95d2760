"""``agora state``, ``agora agents``, ``agora tasks``, ``agora roles``: the master's state as
tables or JSON."""

from __future__ import annotations

import argparse
import base64
import enum
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from agora.sdk.cli.common import add_master_options, call_master, resolve_curve, resolve_master
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    MasterMember,
    Record,
    RoleSummary,
    StateReply,
    TaskState,
    TaskSummary,
    is_terminal,
)
from agora.sdk.resources import Resources
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "INSECURE",
    "add_parsers",
    "agent_status",
    "agents_json",
    "agents_table",
    "frameworks_table",
    "live_tasks",
    "roles_json",
    "roles_table",
    "state_json",
    "tasks_json",
    "tasks_table",
    "to_json",
    "with_totals",
]

#: How ``agora state`` and ``agora top`` mark a master that runs without CURVE (``--insecure``).
INSECURE = "INSECURE (no CURVE)"

#: States shown by ``agora tasks`` without ``--all``: everything but the finished ones.
_DONE_STATES = frozenset({TaskState.LOST, TaskState.GONE_BY_OPERATOR, TaskState.UNKNOWN})


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    state = sub.add_parser("state", help="the master's whole state: agents, frameworks, tasks")
    _common(state)
    state.set_defaults(func=cmd_state)

    agents = sub.add_parser("agents", help="the agents registered with the master")
    _common(agents)
    agents.set_defaults(func=cmd_agents)

    tasks = sub.add_parser("tasks", help="tasks the master knows (live ones unless --all)")
    _common(tasks)
    tasks.add_argument("--all", action="store_true", help="include finished tasks")
    tasks.set_defaults(func=cmd_tasks)

    roles = sub.add_parser(
        "roles", help="the roles the master knows: weight, quota guarantee and limit, share"
    )
    _common(roles)
    roles.set_defaults(func=cmd_roles)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_master_options(parser)


# ---------------------------------------------------------------- JSON


def to_json(value: Any) -> Any:
    """A JSON-ready copy of a wire value: records as objects, enums as names, Resources as dicts."""
    if isinstance(value, Resources):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Record):
        return {name: to_json(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [to_json(v) for v in value]
    return value


def state_json(reply: StateReply) -> dict[str, Any]:
    out: dict[str, Any] = to_json(with_totals(reply))
    return out


def with_totals(reply: StateReply) -> StateReply:
    """``reply`` with its whole-cluster counts and sums filled in. A partial reply carries them;
    a full one leaves them at zero (its rows are the whole cluster), so they are summed here:
    else ``agora state --json`` would show ``agents_total: 0`` beside the agents it lists."""
    if reply.partial:
        return reply
    total: dict[str, int] = {}
    allocated: dict[str, int] = {}
    for agent in reply.agents:
        _add_milli(total, agent.resources.scalar_totals_milli())
        _add_milli(allocated, agent.allocated.scalar_totals_milli())
    return msgspec.structs.replace(
        reply,
        agents_total=len(reply.agents),
        tasks_total=len(reply.tasks),
        agents_unreachable=sum(1 for a in reply.agents if a.status != "ACTIVE"),
        agents_draining=sum(1 for a in reply.agents if a.draining and a.status == "ACTIVE"),
        resources_total=_from_milli(total),
        resources_allocated=_from_milli(allocated),
    )


def _add_milli(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for name, milli in amounts.items():
        into[name] = into.get(name, 0) + milli


def _from_milli(milli: Mapping[str, int]) -> Resources:
    return Resources.from_dict({name: v / 1000 for name, v in milli.items() if v > 0})


def agents_json(reply: StateReply) -> list[Any]:
    return [to_json(a) for a in reply.agents]


def roles_json(reply: StateReply) -> list[Any]:
    return [to_json(r) for r in reply.roles]


def tasks_json(reply: StateReply, *, include_done: bool) -> list[Any]:
    tasks = reply.tasks if include_done else live_tasks(reply.tasks)
    return [to_json(t) for t in tasks]


def live_tasks(tasks: Iterable[TaskSummary]) -> list[TaskSummary]:
    return [t for t in tasks if not is_terminal(t.state) and t.state not in _DONE_STATES]


def _dump(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


# ---------------------------------------------------------------- commands


def _fetch(args: argparse.Namespace) -> StateReply:
    timeout: float = args.timeout
    curve = resolve_curve(args)
    return call_master(resolve_master(args), timeout, lambda c: c.get_state(timeout=timeout), curve)


def masters_line(masters: Sequence[MasterMember]) -> str:
    """``tcp://a:1 (leader), tcp://b:2 (standby), tcp://c:3 (standby, unreachable)``."""
    parts = []
    for m in masters:
        how = m.role if m.reachable else f"{m.role}, unreachable"
        parts.append(f"{m.address} ({how})")
    return ", ".join(parts)


def cmd_state(args: argparse.Namespace) -> int:
    reply = _fetch(args)
    if args.json:
        _dump(state_json(reply))
        return 0
    console = _console()
    info = reply.master_info
    cluster = f"[bold]cluster[/bold] {escape(reply.cluster)}  " if reply.cluster else ""
    insecure = f"  [bold white on red]{INSECURE}[/]" if reply.insecure else ""
    console.print(
        f"{cluster}[bold]master[/bold] {info.master_id}  address {info.address}  epoch {info.epoch}"
        f"{insecure}"
    )
    if len(reply.masters) > 1:
        console.print(f"[bold]masters[/bold] {masters_line(reply.masters)}")
    console.print(agents_table(reply.agents))
    if reply.maintenance:
        from agora.sdk.cli.maintenance import format_status

        console.print("[bold]Maintenance[/bold]")
        console.print(escape(format_status(reply, time.time())))
    console.print(frameworks_table(reply.frameworks))
    if reply.roles:
        console.print(roles_table(reply.roles))
    console.print(
        tasks_table(reply.tasks, title="Tasks (live, then completed)", agents=reply.agents)
    )
    return 0


def cmd_agents(args: argparse.Namespace) -> int:
    reply = _fetch(args)
    if args.json:
        _dump(agents_json(reply))
    else:
        _console().print(agents_table(reply.agents))
    return 0


def cmd_roles(args: argparse.Namespace) -> int:
    reply = _fetch(args)
    if args.json:
        _dump(roles_json(reply))
    else:
        _console().print(roles_table(reply.roles))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    reply = _fetch(args)
    if args.json:
        _dump(tasks_json(reply, include_done=args.all))
        return 0
    tasks = reply.tasks if args.all else live_tasks(reply.tasks)
    title = "Tasks" if args.all else "Live tasks (--all shows finished ones too)"
    _console().print(tasks_table(tasks, title=title, agents=reply.agents))
    return 0


# ---------------------------------------------------------------- tables


def agent_status(agent: AgentSummary) -> str:
    """ACTIVE, DRAINING (active, but an operator drained it: no new offers), DRAINED (draining
    with no task or executor left), or UNREACHABLE."""
    if agent.draining and agent.status == "ACTIVE":
        return "DRAINED" if agent.drained else "DRAINING"
    return agent.status


def http_api(agent: AgentSummary) -> str:
    """Where the agent's HTTP API is (``agora logs`` reads task output there), or "-": none.
    (Its executor port is no use to an operator, and 0 where executors use a Unix socket.)"""
    if not agent.http_port:
        return "-"
    host = agent.address or agent.hostname
    return f"[{host}]:{agent.http_port}" if ":" in host else f"{host}:{agent.http_port}"


def agents_table(agents: Sequence[AgentSummary]) -> Table:
    table = Table(title=f"Agents ({len(agents)})", title_justify="left")
    table.add_column("ID", no_wrap=True)
    for name in ("HOSTNAME", "HTTP API", "STATUS", "RESOURCES", "ALLOCATED", "ATTRIBUTES"):
        table.add_column(name, overflow="fold")
    for a in agents:
        attrs = ";".join(f"{k}:{v}" for k, v in sorted(a.attributes.items()))
        status = agent_status(a)
        if status in ("DRAINING", "DRAINED"):
            status = f"[bold yellow]{status}[/bold yellow]"
        elif status != "ACTIVE":
            status = f"[red]{status}[/red]"
        table.add_row(
            escape(str(a.agent_id)),
            escape(a.hostname),
            escape(http_api(a)),  # an IPv6 address in brackets is not markup
            status,
            a.resources.to_text(),
            a.allocated.to_text(),
            escape(attrs),
        )
    return table


def frameworks_table(frameworks: Sequence[FrameworkSummary]) -> Table:
    table = Table(title=f"Frameworks ({len(frameworks)})", title_justify="left")
    table.add_column("ID", no_wrap=True)
    for name in ("NAME", "ROLES", "ACTIVE", "CONNECTED", "USER", "PRINCIPAL"):
        table.add_column(name, overflow="fold")
    table.add_column("SHARE", justify="right")
    table.add_column("OFFERS", justify="right")
    for f in frameworks:
        table.add_row(
            str(f.framework_id),
            f.name,
            ",".join(f.roles),
            _yes(f.active),
            _yes(f.connected),
            f.user,
            f.principal or "",
            _percent(f.share),
            str(f.offers),
        )
    return table


def roles_table(roles: Sequence[RoleSummary]) -> Table:
    """One row per role; a guarantee or limit of ``-`` is none (no quota, no limit)."""
    table = Table(title=f"Roles ({len(roles)})", title_justify="left")
    table.add_column("NAME", no_wrap=True)
    table.add_column("WEIGHT", justify="right")
    table.add_column("GUARANTEE", overflow="fold")
    table.add_column("LIMIT", overflow="fold")
    table.add_column("SHARE", justify="right")
    for r in roles:
        table.add_row(
            escape(r.name),
            f"{r.weight:g}",
            _quota(r.guarantee),
            _quota(r.limit),
            _percent(r.share),
        )
    return table


def _quota(amount: Resources | None) -> str:
    text = amount.to_text() if amount is not None else ""
    return text or "-"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def tasks_table(
    tasks: Sequence[TaskSummary],
    *,
    title: str = "Tasks",
    agents: Sequence[AgentSummary] = (),
) -> Table:
    """One row per task; ``agents`` (when given) name each task's host."""
    hosts = {a.agent_id: a.hostname for a in agents}
    table = Table(title=f"{title} ({len(tasks)})", title_justify="left")
    table.add_column("ID", no_wrap=True)
    for name in ("NAME", "STATE", "EXIT", "REASON", "HOST", "FRAMEWORK", "RESOURCES"):
        table.add_column(name, overflow="fold")
    table.add_column("UPDATED", no_wrap=True)
    table.add_column("MESSAGE", overflow="fold")
    for t in tasks:
        table.add_row(
            str(t.task_id),
            t.name,
            _state(t.state),
            "" if t.exit_code is None else str(t.exit_code),
            t.reason.name if t.reason is not None else "",
            hosts.get(t.agent_id, str(t.agent_id)),
            str(t.framework_id),
            t.resources.to_text(),
            _when(t.timestamp),
            t.message,
        )
    return table


def _console() -> Console:
    """A console for tables: the terminal's width, or room for whole rows when piped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=240)
    return console


_STATE_STYLE = {
    TaskState.RUNNING: "green",
    TaskState.FINISHED: "blue",
    TaskState.FAILED: "red",
    TaskState.ERROR: "red",
    TaskState.LOST: "red",
    TaskState.KILLED: "yellow",
    TaskState.KILLING: "yellow",
}


def _state(state: TaskState) -> str:
    style = _STATE_STYLE.get(state)
    return f"[{style}]{state.name}[/{style}]" if style else state.name


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _when(timestamp: float) -> str:
    if timestamp <= 0:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(timestamp))
