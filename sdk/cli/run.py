"""``agora run -- CMD ...``: a one-task framework, in the manner of ``mesos-execute``.

It subscribes a framework, waits for an offer that holds ``--cpus``/``--mem``, launches the
command there with the label ``agora.stream_output=1`` (so the command executor streams its output
back as framework messages), writes that output to its own stdout/stderr as it arrives, exits with
the task's exit status (:func:`exit_code_for`) and tears the framework down. The command line and
the exit statuses are described in ``_DESCRIPTION`` (``agora run --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import shlex
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    guard_handshake,
    positive_float,
    resolve_curve,
    resolve_master,
)
from agora.sdk.cli.run_output import OutputRelay, read_rest
from agora.sdk.executor.output import OUTPUT_LABEL, decode_output_at
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    Filters,
    FrameworkInfo,
    MasterInfo,
    Offer,
    Reason,
    TaskState,
    TaskStatus,
    is_terminal,
)
from agora.sdk.resources import Resources
from agora.sdk.scheduler import Scheduler, SchedulerDriver, TaskSpec, fit_resources
from agora.sdk.transport import CurveClient

__all__ = [
    "RunOptions",
    "RunScheduler",
    "add_parser",
    "cmd_run",
    "describe",
    "exit_code_for",
    "run_task",
]

_DESCRIPTION = """\
Run CMD as one task on the cluster and relay its stdout/stderr here as it runs, like
mesos-execute. The words after -- are joined with shlex.join and run by /bin/sh -c on the agent,
so each arrives as one argument, exactly as typed; for shell syntax say so:
  agora run -- sh -c 'echo $HOME | wc -c'

Exit status: the task's. FINISHED 0; FAILED the command's status (128+N when killed by signal N);
KILLED 143 (128+SIGTERM) unless the command's status says otherwise; LOST, ERROR, DROPPED, GONE
and the like 1. Whenever the master or agent gave a reason (a memory or disk limit, a health
check, LOST...), the state, reason and message go to stderr. Ctrl-C or SIGTERM kills the task
first and exits with its status; a second one stops waiting.
"""

#: How long, after the task ended or was given up, the framework gets to tear itself down.
_STOP_GRACE = 5.0
#: How long a Ctrl-C waits for the killed task's last status before giving up.
_KILL_WAIT = 30.0
T = TypeVar("T")

#: How many times a launch refused for a vanished offer is retried on another one.
_MAX_RELAUNCHES = 10
#: States after which nothing more will come for a framework that is not partition-aware.
_FINAL = frozenset({TaskState.LOST, TaskState.UNREACHABLE, TaskState.GONE_BY_OPERATOR})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run one command as a task and relay its output (like mesos-execute)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--cpus", type=positive_float, default=0.1, help="cpus (default 0.1)")
    run.add_argument("--mem", type=positive_float, default=32.0, help="memory in MB (default 32)")
    run.add_argument("--name", default="agora-run", help="task and framework name")
    run.add_argument(
        "--user",
        help="Unix user to run the task as (default: yours); the master's ACL and the agent's "
        "flags decide whether it may",
    )
    run.add_argument(
        "--task-id", help="task id (default: the name and a random suffix, unique per run)"
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="report the task's progress on stderr"
    )
    add_master_options(
        run, timeout=30.0, what="give up after S seconds without a subscription and a fitting offer"
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    # Nothing of `agora run` outlives cmd_run (its driver and sockets are closed): exit at once.
    run.set_defaults(func=cmd_run, fast_exit=True)


@dataclass(frozen=True)
class RunOptions:
    master: str
    argv: tuple[str, ...]
    cpus: float = 0.1
    mem: float = 32.0
    name: str = "agora-run"
    task_id: str | None = None
    timeout: float = 30.0
    verbose: bool = False
    #: The framework's Unix user, whom the task runs as (None: the invoking user).
    user: str | None = None
    #: CURVE credentials, for a master with CURVE on.
    curve: CurveClient | None = None

    @property
    def shape(self) -> Resources:
        return Resources.scalars(cpus=self.cpus, mem=self.mem)


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise CliError("no command given (agora run [options] -- CMD ...)", code=2)
    curve = resolve_curve(args)
    opts = RunOptions(
        master=resolve_master(args),
        argv=tuple(argv),
        cpus=args.cpus,
        mem=args.mem,
        name=args.name,
        task_id=args.task_id,
        timeout=args.timeout,
        verbose=args.verbose,
        user=args.user,
        curve=curve,
    )
    return asyncio.run(run_task(opts, sys.stdout.buffer, sys.stderr.buffer))


def exit_code_for(status: TaskStatus) -> tuple[int, str | None]:
    """The exit status ``agora run`` ends with for ``status``, and a line for stderr (or None).

    The line gives the state, reason and message; it is left out only when the exit status says
    it all (the command's own exit, or a kill, with no reason given)."""
    state, code = status.state, status.exit_code
    if state is TaskState.FINISHED:
        return 0, None
    why = describe(status, "ended") if status.reason is not None else None
    if state is TaskState.FAILED:
        if code is None or code == 0:
            return 1, describe(status, "ended")
        return (128 - code if code < 0 else code), why
    if state is TaskState.KILLED:
        if code is None or code == 0:
            return 128 + signal.SIGTERM, why
        return (128 - code if code < 0 else code), why
    return 1, describe(status, "ended")


def describe(status: TaskStatus, verb: str = "is") -> str:
    """``task T <verb> STATE, reason R: message`` (the parts the status has)."""
    parts = [f"task {status.task_id} {verb} {status.state.name}"]
    if status.reason is not None:
        parts.append(f"reason {status.reason.name}")
    line = ", ".join(parts)
    return f"{line}: {status.message}" if status.message else line


class RunScheduler(Scheduler):
    """Launches one task on the first offer that fits it, and reports how it ends."""

    def __init__(self, opts: RunOptions, task_id: TaskID, out: BinaryIO, err: BinaryIO) -> None:
        self.opts = opts
        self.task_id = task_id
        self.out, self.err = out, err
        self.spec = TaskSpec(
            name=opts.name,
            task_id=task_id,
            command=shlex.join(opts.argv),
            resources=opts.shape,
            labels={OUTPUT_LABEL: "1"},
        )
        self.registered_event = asyncio.Event()
        #: Set at the first launch (ends the wait for an offer).
        self.launched = asyncio.Event()
        #: A launch is out and its offer still valid, as far as we know.
        self.placed = False
        self.relaunches = 0
        self.final: asyncio.Future[TaskStatus] = asyncio.get_running_loop().create_future()
        self.last_error: str | None = None
        self.relay = OutputRelay()
        #: Reading a gap in the output from the sandbox (at most one at a time).
        self.filling: asyncio.Task[None] | None = None

    def note(self, text: str) -> None:
        if self.opts.verbose:
            self.write(self.err, f"agora run: {text}\n".encode())

    def write(self, stream: BinaryIO, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed pipe must not end the run
            stream.write(data)
            stream.flush()

    def registered(self, driver: Any, framework_id: FrameworkID, master_info: MasterInfo) -> None:
        self.note(f"framework {framework_id} subscribed to {master_info.address}")
        self.registered_event.set()

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self.relay.resubscribed = True  # output sent meanwhile may be lost: see read_rest
        self.registered_event.set()

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        for offer in offers:
            fits = fit_resources(self.opts.shape, offer.resources, offer.role) is not None
            if self.placed or self.final.done() or not fits:
                # Once placed, ask not to be offered this agent again for a long while.
                refuse = 3600.0 if self.placed else 5.0
                driver.decline([offer.offer_id], Filters(refuse_seconds=refuse))
                continue
            driver.launch(offer, [self.spec])
            self.placed = True
            self.launched.set()
            driver.suppress()
            self.note(f"launching task {self.task_id} on {offer.hostname} ({offer.agent_id})")

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.task_id != self.task_id or self.final.done():
            return
        self.note(describe(status))
        if status.reason is Reason.INVALID_OFFERS and self.relaunches < _MAX_RELAUNCHES:
            # The offer went away (rescinded, expired) before the launch reached the master.
            self.relaunches += 1
            self.placed = False
            driver.revive()
            self.note("the offer was gone; waiting for another")
            return
        if is_terminal(status.state) or status.state in _FINAL:
            self.final.set_result(status)

    def framework_message(
        self, driver: Any, agent_id: AgentID, executor_id: ExecutorID, data: bytes
    ) -> None:
        try:
            task_id, stream, chunk, offset = decode_output_at(data)
        except ValueError:
            return
        if task_id == self.task_id:
            self.write_stream(stream, self.relay.chunk(stream, chunk, offset))
            if self.relay.gaps and self.filling is None:
                # A chunk was lost (a master failed over): read the gap from the sandbox now.
                self.filling = asyncio.get_running_loop().create_task(self.fill(driver, agent_id))

    async def fill(self, driver: Any, agent_id: AgentID) -> None:
        """Read what the relay lost from the sandbox (CliError: noted; the next chunk past a gap,
        or the task's end, tries again)."""
        try:
            await read_rest(
                self.relay,
                self.write_stream,
                self.opts.master,
                self.opts.curve,
                self.opts.timeout,
                driver.framework_id,
                agent_id,
                self.task_id,
            )
        except CliError as exc:
            self.note(f"could not read the lost output yet: {exc}")
        finally:
            self.filling = None

    def write_stream(self, stream: str, data: bytes) -> None:
        if data:
            self.write(self.out if stream == "stdout" else self.err, data)

    def error(self, driver: Any, message: str) -> None:
        # Reported when the driver stops over it; otherwise (a stale offer...) only noted.
        self.last_error = message
        self.note(f"the master says: {message}")

    def disconnected(self, driver: Any) -> None:
        self.note("lost the master; re-subscribing")


async def run_task(opts: RunOptions, out: BinaryIO, err: BinaryIO) -> int:
    """Run ``opts.argv`` as one task; the exit status to end with."""
    task_id = TaskID(opts.task_id or f"{opts.name}-{uuid.uuid4().hex[:8]}")
    sched = RunScheduler(opts, task_id, out, err)
    user = opts.user or getpass.getuser()
    framework = FrameworkInfo(name=opts.name, user=user, hostname=socket.gethostname())
    driver = SchedulerDriver(sched, framework, opts.master, curve=opts.curve)
    runner = asyncio.create_task(driver.run())
    interrupts = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signo, interrupts.put_nowait, signo)
    try:
        return await _supervise(opts, sched, driver, runner, interrupts)
    finally:
        if sched.filling is not None:
            sched.filling.cancel()
        for signo in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signo)
        await _stop(driver, runner)


async def _supervise(
    opts: RunOptions,
    sched: RunScheduler,
    driver: SchedulerDriver,
    runner: asyncio.Task[None],
    interrupts: asyncio.Queue[int],
) -> int:
    # Phase 1: subscribe and launch, within --timeout (a refused handshake ends it at once).
    try:
        async with asyncio.timeout(opts.timeout):
            launched = guard_handshake(opts.master, opts.curve, sched.launched.wait())
            await _until(launched, runner, interrupts, sched)
    except TimeoutError:
        if not sched.registered_event.is_set():
            raise CliError(
                f"could not subscribe to the master at {opts.master} within {opts.timeout:g}s"
            ) from None
        raise CliError(
            f"no offer with {opts.shape} arrived within {opts.timeout:g}s "
            "(are agents registered, with that much free?)"
        ) from None
    except _Interrupted:
        return 130
    # Phase 2: relay output until the task ends; an interrupt kills it first.
    try:
        status = await _until(asyncio.shield(sched.final), runner, interrupts, sched)
    except _Interrupted:
        sched.write(sched.err, f"agora run: killing task {sched.task_id}\n".encode())
        driver.kill(sched.task_id)
        try:
            async with asyncio.timeout(_KILL_WAIT):
                status = await _until(asyncio.shield(sched.final), runner, interrupts, sched)
        except (TimeoutError, _Interrupted):
            sched.write(sched.err, b"agora run: gave up waiting for the task to end\n")
            return 130
    await _write_rest(opts, sched, driver, status)
    code, message = exit_code_for(status)
    if message:
        sched.write(sched.err, f"agora run: {message}\n".encode())
    return code


async def _write_rest(
    opts: RunOptions, sched: RunScheduler, driver: SchedulerDriver, status: TaskStatus
) -> None:
    """Output the relay lost (sent while a master failed over), from the task's sandbox."""
    if sched.filling is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(sched.filling), opts.timeout)
    if not sched.relay.incomplete or status.agent_id is None:
        return
    try:
        await read_rest(
            sched.relay,
            sched.write_stream,
            opts.master,
            opts.curve,
            opts.timeout,
            driver.framework_id,
            status.agent_id,
            sched.task_id,
        )
    except CliError as exc:
        if sched.relay.gaps:
            what = f"some {' and '.join(sorted(sched.relay.gaps))} was lost on the way"
        else:
            what = "the master failed over while the task ran: its output may lack its end"
        sched.write(sched.err, f"agora run: {what} ({exc})\n".encode())


class _Interrupted(Exception):
    pass


async def _until(
    awaitable: Awaitable[T],
    runner: asyncio.Task[None],
    interrupts: asyncio.Queue[int],
    sched: RunScheduler,
) -> T:
    """``awaitable``'s result; _Interrupted on a signal, CliError when the driver stops first."""
    goal = asyncio.ensure_future(awaitable)
    signalled = asyncio.ensure_future(interrupts.get())
    try:
        await asyncio.wait({goal, signalled, runner}, return_when=asyncio.FIRST_COMPLETED)
        if goal.done():
            return goal.result()
        if signalled.done():
            raise _Interrupted
        problem = sched.last_error or _runner_problem(runner)
        raise CliError(f"the framework driver stopped: {problem}")
    finally:
        for fut in (goal, signalled):
            if not fut.done():
                fut.cancel()


def _runner_problem(runner: asyncio.Task[None]) -> str:
    if runner.cancelled():
        return "cancelled"
    exc = runner.exception()
    if exc is None:
        return "stopped by the master"
    return str(exc) or type(exc).__name__


async def _stop(driver: SchedulerDriver, runner: asyncio.Task[None]) -> None:
    """Tear the framework down (TEARDOWN) and wait, bounded, for the driver to finish."""
    with contextlib.suppress(Exception):
        driver.stop()
    try:
        async with asyncio.timeout(_STOP_GRACE):
            await asyncio.gather(runner, return_exceptions=True)
    except TimeoutError:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
