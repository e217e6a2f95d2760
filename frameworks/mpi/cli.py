"""``agora mpirun -n N [options] -- PROGRAM …``: one MPI job on the cluster, its ranks' output
here (each line prefixed with its rank), its exit code ``mpirun``'s.

A plug-in of the ``agora`` command (entry point group ``agora.cli``). It is the job's own
framework: it subscribes, asks for a gang, runs the job (retrying it whole while ``--retries``
last) and tears itself down at the end, or on Ctrl-C, which kills every rank.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import TextIO

from agora.frameworks.mpi.job import MpiJob
from agora.frameworks.mpi.scheduler import MpiScheduler
from agora.frameworks.mpi.setup import missing
from agora.frameworks.mpi.visibility import unseen
from agora.sdk.cli.common import (
    CliError,
    guard_handshake,
    positive_float,
    resolve_curve,
    resolve_master,
)
from agora.sdk.discovery import agora_home
from agora.sdk.messages import FrameworkInfo
from agora.sdk.messages.enums import FrameworkCapability
from agora.sdk.runtime import runtime_paths
from agora.sdk.scheduler import SchedulerDriver

__all__ = ["add_parser", "cmd_mpirun"]

TICK = 0.25
STOP_GRACE = 15.0

_DESCRIPTION = """\
Run an Open MPI program on the cluster: all its ranks start together on a gang of agents
(one gang offer, all or nothing), mpirun runs in the first agent's executor and reaches the
others through Agora (no ssh). Each output line is printed with its rank ("2: text"); the
exit code is mpirun's. A dead rank, a lost agent or the --timeout ends the attempt and kills
every rank; the job is then retried whole while --retries last.

examples:
  agora mpirun -n 4 -- python -m mpi4py examples/mpi_allreduce.py
  agora mpirun -n 8 --ntasks-per-node 2 --cpus-per-rank 1 --mem-per-rank 512 -- ./ring
  agora mpirun -n 4 --timeout 60 --retries 2 --interface eth0 -- python -m mpi4py app.py

Python ranks should run as `python -m mpi4py app.py`: a rank that exits then aborts the job
instead of leaving the others hanging. `python` is the Python Agora runs with.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "mpirun",
        help="run an MPI job on a gang of agents",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--np", dest="ranks", type=int, required=True, metavar="N")
    p.add_argument("--ntasks-per-node", type=int, default=0, metavar="K", help="ranks per agent")
    p.add_argument("--cpus-per-rank", type=float, default=1.0, metavar="C", help="default 1")
    p.add_argument("--mem-per-rank", type=float, default=256.0, metavar="MIB", help="default 256")
    p.add_argument(
        "--timeout", dest="job_timeout", type=positive_float, metavar="S",
        help="kill an attempt that runs longer than S seconds (mpirun --timeout)",
    )  # fmt: skip
    p.add_argument("--retries", type=int, default=0, metavar="R", help="whole-job retries")
    p.add_argument(
        "--interface", default="lo",
        help="the network interface or CIDR Open MPI uses between agents (default lo: agents "
        "on this machine)",
    )  # fmt: skip
    p.add_argument("--queue", default="*", metavar="ROLE", help="the role to run in (default *)")
    p.add_argument(
        "--chdir", "--wdir", dest="chdir", metavar="DIR",
        help="where the ranks start (default: this directory; on several machines it must "
        "exist on each, as with mpirun)",
    )  # fmt: skip
    p.add_argument("--log", type=Path, metavar="FILE", help="also keep mpirun's output here")
    # The master options of the other commands, but --timeout is the job's here (as mpirun's).
    p.add_argument("--master", metavar="ADDR", help="master endpoint (default: as agora run)")
    p.add_argument(
        "--connect-timeout", type=positive_float, default=30.0, metavar="S",
        help="give up on subscribing to the master after S seconds (default 30)",
    )  # fmt: skip
    p.add_argument("--curve-secret-key", metavar="FILE", help="as for agora run")
    p.add_argument("--curve-server-key", metavar="FILE", help="as for agora run")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ...")
    # The job log is closed by then; the interpreter's teardown of its modules only costs time.
    p.set_defaults(func=cmd_mpirun, fast_exit=True)


def cmd_mpirun(args: argparse.Namespace) -> int:
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    workdir = os.path.realpath(args.chdir or os.getcwd())
    hidden = unseen(command, workdir, runtime_paths())
    if hidden is not None:  # before anything starts: the ranks would each fail with a traceback
        raise CliError(hidden)
    problems = missing()
    if problems:
        lines = "\n  ".join(problems)
        raise CliError(f"this machine cannot run MPI jobs yet:\n  {lines}")
    try:
        job = MpiJob(
            ranks=args.ranks,
            command=tuple(command),
            cpus=args.cpus_per_rank,
            mem=args.mem_per_rank,
            per_node=args.ntasks_per_node,
            timeout=args.job_timeout,
            retries=args.retries,
            interface=args.interface,
            role=args.queue,
            workdir=workdir,
        )
    except ValueError as exc:
        raise CliError(str(exc), code=2) from None
    log_path: Path = args.log or agora_home() / "mpi" / "last.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file: TextIO = open(log_path, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot write the job log {log_path}: {exc}") from None
    with log_file:
        return asyncio.run(_run(args, job, log_file))


async def _run(args: argparse.Namespace, job: MpiJob, log_file: TextIO) -> int:
    master = resolve_master(args)
    curve = resolve_curve(args)
    sched = MpiScheduler(job, log_file=log_file)
    framework = FrameworkInfo(
        name=f"mpi: {shlex.join(job.command)}"[:200],
        user=getpass.getuser(),
        hostname=socket.gethostname(),
        roles=(job.role,),
        capabilities=(FrameworkCapability.GANG,),
    )
    driver = SchedulerDriver(sched, framework, master, curve=curve)
    runner = asyncio.create_task(driver.run())
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    for signo in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signo, interrupted.set)
    ticker = asyncio.create_task(_tick(sched))
    try:
        try:
            async with asyncio.timeout(args.connect_timeout):
                await guard_handshake(master, curve, driver.start())
        except TimeoutError:
            raise CliError(f"could not subscribe to the master at {master}") from None
        waits = [asyncio.ensure_future(e.wait()) for e in (sched.done, interrupted)]
        await asyncio.wait([*waits, runner], return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if interrupted.is_set():
            print("agora mpirun: interrupted; killing every rank", file=sys.stderr)
            return 130
        if not sched.done.is_set():
            exc = runner.exception() if runner.done() and not runner.cancelled() else None
            raise CliError(f"the framework driver stopped: {exc or 'stopped by the master'}")
        return sched.exit_code
    finally:
        for signo in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signo)
        ticker.cancel()
        with contextlib.suppress(Exception):
            driver.stop()  # teardown: the master kills whatever is left
        try:
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.gather(runner, return_exceptions=True)
        except TimeoutError:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


async def _tick(sched: MpiScheduler) -> None:
    while True:
        await asyncio.sleep(TICK)
        with contextlib.suppress(Exception):
            sched.tick()
