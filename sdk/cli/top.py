"""``agora top``: a live operator console (utilization, agents, frameworks, tasks, events).

The screen itself is :func:`agora.sdk.cli.top_render.render`, a pure function of the latest
state, the utilization history, the event feed and the screen size; this module polls the master
every ``--interval`` seconds, diffs successive snapshots into events, and drives a rich Live.

Keys (when stdin is a terminal, read in cbreak mode and restored on exit): ``q`` quits, ``tab``
cycles the focused table, ``/`` starts a filter on it (Enter keeps it, Esc clears it). Ctrl-C
quits too, with status 0. ``--once`` prints one frame to stdout and exits.
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
from typing import Any

from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    ask_master,
    call_master,
    positive_float,
    resolve_curve,
    resolve_master,
)
from agora.sdk.cli.top_events import Event, diff_states
from agora.sdk.cli.top_render import (
    FOCUSABLE,
    MAX_EVENTS,
    History,
    View,
    render,
    totals,
)
from agora.sdk.messages import StateReply
from agora.sdk.transport import CurveClient
from rich.console import Console, RenderableType
from rich.live import Live

__all__ = ["TopState", "add_parser", "cmd_top", "handle_key"]

#: The longest a live frame waits between refreshes, whatever --interval says (clock, keys).
_MAX_REFRESH = 1.0


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

    def update(self, reply: StateReply, now: float) -> None:
        self.events.extend(diff_states(self.state, reply, now))
        self.history.add(totals(reply))
        self.state = reply
        self.view = replace(self.view, error="")


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
        reply = call_master(master, timeout, lambda c: c.get_state(timeout=timeout), curve)
        top = TopState()
        top.update(reply, time.time())
        console = Console() if sys.stdout.isatty() else Console(width=160)
        console.print(render(reply, top.history, top.events, (console.width, None)))
        return 0
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C quits, as q does
        asyncio.run(_live(master, curve, timeout, args.interval))
    return 0


async def _live(master: str, curve: CurveClient | None, timeout: float, interval: float) -> None:
    top = TopState()
    # The first answer decides whether there is a console at all: no master, one line, exit 1.
    top.update(await _fetch(master, curve, timeout), time.time())
    console = Console()
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
        next_poll = time.monotonic() + interval
        try:
            while not top.quit:
                live.update(_frame(top, console), refresh=True)
                if poll is None and time.monotonic() >= next_poll:
                    poll = asyncio.create_task(_fetch(master, curve, timeout))
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
                        top.update(poll.result(), time.time())
                    except CliError as exc:
                        top.view = replace(top.view, error=str(exc))
                    poll = None
                    next_poll = time.monotonic() + interval
        finally:
            if poll is not None:
                poll.cancel()
                with contextlib.suppress(asyncio.CancelledError, CliError):
                    await poll


def _frame(top: TopState, console: Console) -> RenderableType:
    assert top.state is not None
    height = console.height if console.is_terminal else None
    return render(top.state, top.history, top.events, (console.width, height), view=top.view)


async def _fetch(master: str, curve: CurveClient | None, timeout: float) -> StateReply:
    return await ask_master(master, timeout, lambda c: c.get_state(timeout=timeout), curve)


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
