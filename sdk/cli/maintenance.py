"""``agora maintenance schedule|status|cancel``: plan downtime of agents (operator calls).

A window covers the hosts of the agents named: from ``--start`` for ``--duration``. Frameworks
with tasks there get inverse offers and answer them; at the start the agents drain, and what
still runs at the window's end is killed. ``status`` shows every window and the answers.
Times: absolute (``2026-12-05T14:00``, local time unless it has an offset; or seconds since the
epoch) or relative to now (``now``, ``+10m``); durations: ``90``, ``30s``, ``10m``, ``2h``, ``1d``.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Sequence
from datetime import datetime

from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    call_master,
    resolve_curve,
    resolve_master,
)
from agora.sdk.ids import AgentID
from agora.sdk.messages import CancelMaintenance, ScheduleMaintenance, StateReply

__all__ = ["add_parser", "duration", "format_status", "moment"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_YEAR = 365 * 86400.0


def duration(text: str) -> float:
    """argparse type: a positive duration (``90``, ``30s``, ``10m``, ``2h``, ``1d``), at most a
    year."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 90, 30s, 10m or 2h: {text!r}"
        )
    seconds = float(match[1]) * _UNITS[match[2]]
    if not 0 < seconds <= _YEAR:
        raise argparse.ArgumentTypeError(
            f"the duration must be above 0 and at most a year: {text!r}"
        )
    return seconds


def moment(text: str, now: float | None = None) -> float:
    """argparse type: a time as seconds since the epoch, from ``now``, ``+DURATION``, an ISO 8601
    date and time, or a number of seconds since the epoch."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    if value.startswith("+"):
        return now + duration(value[1:])
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number) or number < 0:
            raise argparse.ArgumentTypeError(f"not a time: {text!r}")
        return number
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a time such as +10m, now, 2026-12-05T14:00 or epoch seconds: {text!r}"
        ) from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "maintenance",
        help="plan maintenance windows of agents; inverse offers (operator calls)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="schedule|status|cancel")
    schedule = verbs.add_parser("schedule", help="plan a window for the agents' hosts")
    schedule.add_argument("agents", nargs="+", metavar="AGENT_ID")
    schedule.add_argument("--start", type=moment, required=True, metavar="T", help="e.g. +10m")
    schedule.add_argument("--duration", type=duration, required=True, metavar="D", help="e.g. 2h")
    status = verbs.add_parser("status", help="the windows and the frameworks' answers")
    cancel = verbs.add_parser("cancel", help="remove the windows of the agents' hosts")
    cancel.add_argument("agents", nargs="+", metavar="AGENT_ID")
    for verb in (schedule, status, cancel):
        add_master_options(verb)
        verb.set_defaults(func=_run)


def _ids(texts: Sequence[str]) -> tuple[AgentID, ...]:
    ids = tuple(AgentID(t.strip()) for t in texts)
    if any(not i for i in ids):
        raise CliError("an AGENT_ID is empty", code=2)
    return ids


def _run(args: argparse.Namespace) -> int:
    master, curve, timeout = resolve_master(args), resolve_curve(args), float(args.timeout)
    if args.verb == "status":
        state = call_master(master, timeout, lambda c: c.get_state(timeout), curve)
        print(format_status(state, time.time()))
        return 0
    if args.verb == "schedule":
        message: ScheduleMaintenance | CancelMaintenance = ScheduleMaintenance(
            agent_ids=_ids(args.agents), start=args.start, duration=args.duration
        )
    else:
        message = CancelMaintenance(agent_ids=_ids(args.agents))
    done = call_master(master, timeout, lambda c: c.call(message, timeout), curve)
    print(done.message or f"{done.call} done")
    return 0


def format_status(state: StateReply, now: float) -> str:
    """One block per window: host, status, when, agents, and each framework's answer."""
    if not state.maintenance:
        return "no maintenance scheduled"
    lines = []
    for w in state.maintenance:
        start = datetime.fromtimestamp(w.start).isoformat(timespec="seconds")
        when = f"in {w.start - now:.0f}s" if w.start > now else f"{now - w.start:.0f}s ago"
        lines.append(
            f"{w.hostname}  {w.status}  from {start} ({when}) for {w.duration:g}s  "
            f"agents: {', '.join(w.agent_ids) or '-'}"
        )
        for a in w.answers:
            lines.append(f"  {a.framework_id} on {a.agent_id}: {a.answer}")
    return "\n".join(lines)
