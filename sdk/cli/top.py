"""``agora top``: a live operator console (utilization, agents, frameworks, tasks, events).

The screen itself is :func:`agora.sdk.cli.top_render.render`, a pure function of the latest
state, the utilization history, the event feed and the screen size; this module polls the master
every ``--interval`` seconds, diffs successive snapshots into events, and drives a rich Live.

Keys (when stdin is a terminal, read in cbreak mode and restored on exit): ``q`` quits, ``tab``
cycles the focused table, ``/`` starts a filter on it (Enter keeps it, Esc clears it). Ctrl-C
quits too, with status 0. ``--once`` prints one frame to stdout and exits.

On a big cluster (:func:`is_big`) a full GET_STATE costs the master and the console about a
second a poll, so the console asks for a partial one instead (:func:`query_for`): as many agents
and tasks as the screen shows (the master picks the agents to see and the tasks updated last,
filtered as the focused table is) plus the whole cluster's counts and sums. The very first ask
is partial too (the cluster's size is not known yet); a small cluster is then asked in full.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final

from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    ask_master,
    positive_float,
    resolve_curve,
    resolve_master,
)
from agora.sdk.cli.top_events import Event, all_agents, all_tasks, diff_states
from agora.sdk.cli.top_render import (
    FOCUSABLE,
    MAX_EVENTS,
    History,
    View,
    render,
    screen_rows,
    totals,
)
from agora.sdk.messages import GetState, StateReply
from agora.sdk.transport import CurveClient
from rich.console import Console, RenderableType
from rich.live import Live

__all__ = [
    "BIG_AGENTS",
    "BIG_TASKS",
    "MAX_LIMIT",
    "MIN_LIMIT",
    "TopState",
    "add_parser",
    "cmd_top",
    "handle_key",
    "is_big",
    "query_for",
]

#: The longest a live frame waits between refreshes, whatever --interval says (clock, keys).
_MAX_REFRESH = 1.0
#: A cluster with more agents or more tasks than these is asked for a partial state.
BIG_AGENTS: Final = 500
BIG_TASKS: Final = 2000
#: The rows of each table a partial state asks for: what the screen shows, within these.
MIN_LIMIT: Final = 20
MAX_LIMIT: Final = 200
#: The longest filter sent to the master (GetState's filters are short strings).
_MAX_FILTER: Final = 64


def is_big(reply: StateReply) -> bool:
    """Whether the cluster behind ``reply`` is too big to fetch in full on every poll."""
    agents = reply.agents_total if reply.partial else len(reply.agents)
    tasks = reply.tasks_total if reply.partial else len(reply.tasks)
    return agents > BIG_AGENTS or tasks > BIG_TASKS


def query_for(reply: StateReply | None, size: tuple[int, int | None], view: View) -> GetState:
    """The GET_STATE to send after ``reply`` (None: before the first) for a screen of ``size``
    showing ``view``: in full for a small cluster, else limited to the rows the screen shows
    (:data:`MIN_LIMIT` to :data:`MAX_LIMIT` of each) and filtered as the focused table is."""
    if reply is not None and not is_big(reply):
        return GetState()
    rows = screen_rows(size)
    needle = view.filter[:_MAX_FILTER]
    return GetState(
        agents_limit=min(MAX_LIMIT, max(MIN_LIMIT, rows.agents)),
        tasks_limit=min(MAX_LIMIT, max(MIN_LIMIT, rows.tasks)),
        agents_filter=needle if view.focus == "agents" else "",
        tasks_filter=needle if view.focus == "tasks" else "",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser(
        "top",
        help="a live console: utilization, agents, frameworks, tasks, events (q quits)",
    )
    top.add_argument("--once", action="store_true", help="print one frame to stdout and exit")
    top.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="S",
        help="poll the master every S seconds (default 1)",
    )
    add_master_options(top)
    top.set_defaults(func=cmd_top)


@dataclass(slots=True)
class TopState:
    """What the console remembers between polls."""

    state: StateReply | None = None
    history: History = field(default_factory=History)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    view: View = field(default_factory=View)
    quit: bool = False
    #: The GET_STATE that ``state`` answers.
    query: GetState = field(default_factory=GetState)

    def update(self, reply: StateReply, now: float, query: GetState | None = None) -> None:
        """Take ``reply`` (the answer to ``query``; None: a full GET_STATE)."""
        query = query or GetState()
        moved = query != self.query
        self.events.extend(diff_states(self.state, reply, now, window_moved=moved))
        self.history.add(totals(reply))
        self.state = reply
        self.query = query
        self.view = replace(self.view, error="")

    def next_query(self, size: tuple[int, int | None]) -> GetState:
        """What to ask the master next for a screen of ``size`` (see :func:`query_for`)."""
        return query_for(self.state, size, self.view)


def handle_key(top: TopState, key: str) -> None:
    """Apply one key press to ``top`` (its view, or quitting)."""
    view = top.view
    if view.editing:
        if key in ("\r", "\n"):
            top.view = replace(view, editing=False)
        elif key == "\x1b":
            top.view = replace(view, editing=False, filter="")
        elif key in ("\x7f", "\b"):
            top.view = replace(view, filter=view.filter[:-1])
        elif key.isprintable():
            top.view = replace(view, filter=view.filter + key)
        return
    if key in ("q", "Q"):
        top.quit = True
    elif key == "\t":
        focus = FOCUSABLE[(FOCUSABLE.index(view.focus) + 1) % len(FOCUSABLE)]
        top.view = replace(view, focus=focus, filter="")
    elif key == "/":
        top.view = replace(view, editing=True, filter="")
    elif key == "\x1b":
        top.view = replace(view, filter="")


def cmd_top(args: argparse.Namespace) -> int:
    master = resolve_master(args)
    curve = resolve_curve(args)
    timeout: float = args.timeout
    if args.once:
        console = Console() if sys.stdout.isatty() else Console(width=160)
        top = TopState()
        reply, query = asyncio.run(_first(top, master, curve, timeout, (console.width, None)))
        top.update(reply, time.time(), query)
        console.print(render(reply, top.history, top.events, (console.width, None)))
        return 0
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits, as q does
        asyncio.run(_live(master, curve, timeout, args.interval))
    return 0


async def _live(master: str, curve: CurveClient | None, timeout: float, interval: float) -> None:
    top = TopState()
    console = Console()
    # The first answer decides whether there is a console at all: no master, one line, exit 1.
    reply, query = await _first(top, master, curve, timeout, _size(console))
    top.update(reply, time.time(), query)
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()

    def quit_on_signal() -> None:  # Ctrl-C quits as q does: through the loop, screen restored
        top.quit = True
        wake.set()

    loop.add_signal_handler(signal.SIGINT, quit_on_signal)
    try:
        await _show(top, console, wake, master, curve, timeout, interval)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _show(
    top: TopState,
    console: Console,
    wake: asyncio.Event,
    master: str,
    curve: CurveClient | None,
    timeout: float,
    interval: float,
) -> None:
    with (
        _keys(top, wake),
        Live(
            console=console,
            screen=console.is_terminal,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live,
    ):
        poll: asyncio.Task[StateReply] | None = None
        asked = top.query
        next_poll = time.monotonic() + interval
        try:
            while not top.quit:
                live.update(_frame(top, console), refresh=True)
                if poll is None and time.monotonic() >= next_poll:
                    asked = top.next_query(_size(console))
                    poll = asyncio.create_task(_fetch(master, curve, timeout, asked))
                wait = _MAX_REFRESH
                if poll is None:
                    wait = min(wait, max(0.0, next_poll - time.monotonic()))
                woken = asyncio.create_task(wake.wait())
                waiters: set[asyncio.Future[Any]] = {woken}
                if poll is not None:
                    waiters.add(poll)
                await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                wake.clear()
                if poll is not None and poll.done():
                    try:
                        top.update(poll.result(), time.time(), asked)
                    except CliError as exc:
                        top.view = replace(top.view, error=str(exc))
                    poll = None
                    next_poll = time.monotonic() + interval
        finally:
            if poll is not None:
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError, CliError):
                    await poll


def _size(console: Console) -> tuple[int, int | None]:
    return (console.width, console.height if console.is_terminal else None)


def _frame(top: TopState, console: Console) -> RenderableType:
    assert top.state is not None
    return render(top.state, top.history, top.events, _size(console), view=top.view)


async def _first(
    top: TopState,
    master: str,
    curve: CurveClient | None,
    timeout: float,
    size: tuple[int, int | None],
) -> tuple[StateReply, GetState]:
    """The first reply and the query it answers: a partial state sized for the screen, then,
    when that shows a small cluster it did not hold in full, the full state."""
    query = top.next_query(size)
    reply = await _fetch(master, curve, timeout, query)
    if not is_big(reply) and not (all_agents(reply) and all_tasks(reply)):
        query = GetState()
        reply = await _fetch(master, curve, timeout, query)
    return reply, query


async def _fetch(
    master: str, curve: CurveClient | None, timeout: float, query: GetState
) -> StateReply:
    return await ask_master(
        master, timeout, lambda c: c.get_state(timeout=timeout, query=query), curve
    )


@contextlib.contextmanager
def _keys(top: TopState, wake: asyncio.Event) -> Iterator[bool]:
    """Feed stdin's key presses to :func:`handle_key` while in the block (cbreak mode when stdin
    is a terminal; the terminal's settings are restored on the way out). Yields whether keys are
    read at all."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield False
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def on_input() -> None:
        try:
            data = os.read(fd, 64).decode(errors="replace")
        except OSError:
            return
        for key in data:
            handle_key(top, key)
        wake.set()

    try:
        tty.setcbreak(fd)
        loop.add_reader(fd, on_input)
        yield True
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
