"""``agora local``: a whole cluster on this machine (one master, N agents) until Ctrl-C.

It prints the master's address on stdout (one line, nothing else) and records it in
``$AGORA_HOME/master`` so that the other commands find it; progress and the log locations go to
stderr. On Ctrl-C, SIGTERM or SIGHUP it stops every daemon (a second signal: kill at once),
sweeps up whatever executor or task a daemon left behind, and removes the address file. A daemon
that dies on its own is started again (:mod:`agora.sdk.cli.supervision`), each restart reported
on stderr and in ``<work dir>/logs/local.log``; one that keeps crashing makes ``agora local`` stop
the rest and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from agora.sdk.attributes import parse_attributes
from agora.sdk.cli.cluster import ClusterError, LocalCluster, Stopped, or_stop
from agora.sdk.cli.common import CliError, positive_float
from agora.sdk.cli.local_keys import ensure_local_keys
from agora.sdk.cli.supervision import (
    Crashed,
    GaveUp,
    Restarted,
    StoodDown,
    SupervisionEvent,
    supervise,
)
from agora.sdk.discovery import agora_home, keys_dir
from agora.sdk.logs import LOG_LEVELS
from agora.sdk.resources import ResourceError, Resources
from rich.console import Console
from rich.markup import escape

__all__ = [
    "add_parser",
    "cmd_local",
    "file_logger",
    "remove_address",
    "report_supervision",
    "write_address",
]

_DESCRIPTION = """\
Run one master and N agents on 127.0.0.1 (free ports) as child processes until Ctrl-C, with
the batch service (agora batch …) unless --no-batch.

Prints the master's address on stdout and records it in $AGORA_HOME/master (default
~/.agora/master) so that agora run/state/tasks/kill find it. Every link is encrypted and
authenticated with CURVE: the keys (the masters', the agents', the batch service's and yours,
user-<name>) and the ACL are in $AGORA_HOME/keys (mode 0700, made once, then reused), where the
other commands find yours; any other local user is refused. The daemons' logs go to
DIR/logs/master.log and DIR/logs/agent-<i>.log, their state to DIR/master and DIR/agent-<i>.
Ctrl-C, SIGTERM or SIGHUP stops them all (a second signal kills at once) and removes the address
file. A daemon that dies on its own is started again on its work dir and ports, after 0.5 s,
then 1 s, 2 s, ... up to 10 s while it keeps dying; each restart is reported here and in
DIR/logs/local.log. A daemon that crashes 5 times within 60 s makes agora local stop the rest
and exit 1. An agent that exits with status 0 on its own (marked gone) is not started again.
"""

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser(
        "local",
        help="run a master and agents on this machine until Ctrl-C",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    local.add_argument(
        "--agents", type=_count, default=2, metavar="N", help="number of agents (default 2)"
    )
    local.add_argument(
        "--masters",
        type=int,
        choices=(1, 3, 5),
        default=1,
        metavar="N",
        help="1 master, or an election group of 3 or 5 that fails over (default 1)",
    )
    local.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="where the daemons keep their state and logs (default: a fresh temporary dir)",
    )
    local.add_argument(
        "--agent-resources",
        action="append",
        metavar="TEXT",
        help="agents' resources, e.g. 'cpus:4;mem:4096': given once, every agent's; given once "
        "per agent, each agent's own, in order (default: detected from the host)",
    )
    local.add_argument(
        "--agent-attributes",
        action="append",
        metavar="TEXT",
        help="agents' attributes, e.g. 'rack:a;zone:w': given once, every agent's; given once "
        "per agent, each agent's own, in order",
    )
    local.add_argument(
        "--batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the batch service (agora batch …), recorded in $AGORA_HOME/batch "
        "(default: on)",
    )
    local.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="the daemons' log level"
    )
    local.add_argument(
        "--timeout",
        type=positive_float,
        default=30.0,
        metavar="S",
        help="give up when the cluster is not up within S seconds (default 30)",
    )
    local.set_defaults(func=cmd_local)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError("expected 1 to 64 agents")
    return value


def _per_agent(
    flag: str, values: list[str] | None, agents: int, check: Callable[[str], None]
) -> tuple[str, ...]:
    """One value for every agent, or one per agent; CliError (exit 2) for anything else."""
    given = tuple(values or ())
    if len(given) not in (0, 1, agents):
        raise CliError(
            f"{flag} given {len(given)} times: give it once, or once per agent ({agents})", code=2
        )
    for value in given:
        try:
            check(value)
        except ValueError as exc:
            raise CliError(f"{flag} {value!r}: {exc}", code=2) from None
    return given


def _resources(text: str) -> None:
    try:
        Resources.parse(text)
    except ResourceError as exc:
        raise ValueError(str(exc)) from None


def _attributes(text: str) -> None:
    parse_attributes(text)


def cmd_local(args: argparse.Namespace) -> int:
    resources = _per_agent("--agent-resources", args.agent_resources, args.agents, _resources)
    attributes = _per_agent("--agent-attributes", args.agent_attributes, args.agents, _attributes)
    try:
        work_dir: Path = args.work_dir or Path(tempfile.mkdtemp(prefix="agora-local-"))
        work_dir = work_dir.expanduser().resolve()
        work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot use the work dir: {exc}") from None
    try:
        keys = ensure_local_keys(keys_dir())
    except OSError as exc:
        raise CliError(f"cannot write the cluster's CURVE keys in {keys_dir()}: {exc}") from None
    cluster = LocalCluster(
        work_dir,
        args.agents,
        masters=args.masters,
        agent_resources=resources,
        agent_attributes=attributes,
        log_level=args.log_level,
        batch=args.batch,
        keys=keys,
    )
    return asyncio.run(
        serve(cluster, args.timeout, Console(stderr=True, soft_wrap=True, highlight=False))
    )


async def serve(cluster: LocalCluster, timeout: float, console: Console) -> int:
    """Start ``cluster``, announce it, run until a signal or a daemon's death, stop it."""
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            hurry.set()
        stop.set()

    for signo in _SIGNALS:
        loop.add_signal_handler(signo, on_signal)
    address_file: Path | None = None
    http_file: Path | None = None
    code = 0
    try:
        n = len(cluster.agent_names)
        m = len(cluster.master_names)
        masters = "a master" if m == 1 else f"{m} masters"
        console.print(f"agora local: starting {masters} and {n} agent{'s' if n > 1 else ''}")
        console.print(escape(f"  work dir {cluster.work_dir}; logs in {cluster.logs}/"))
        endpoint = await cluster.start(timeout, stop)
        try:
            address_file = write_address(endpoint)
            where = f"address in {escape(str(address_file))}"
        except OSError as exc:
            where = escape(f"could not record the address: {exc}")
        print(endpoint, flush=True)
        console.print(
            f"agora local: master{'s' if m > 1 else ''} [bold]{endpoint}[/bold] with agents "
            f"{', '.join(cluster.agent_names)}; {where}. Ctrl-C stops."
        )
        if cluster.http_urls:
            urls = ",".join(cluster.http_urls)
            with contextlib.suppress(OSError):
                http_file = write_address(urls, name="master.http")
            console.print(
                escape(f"agora local: operator HTTP API {urls} (/state, /metrics); in {http_file}")
            )
        if cluster.batch_url:
            console.print(
                escape(f"agora local: batch service {cluster.batch_url} (agora batch submit …)")
            )

        with open(cluster.logs / "local.log", "a", encoding="utf-8") as log_file:
            log = file_logger(log_file)
            log.info("cluster_up", endpoint=endpoint, work_dir=str(cluster.work_dir))
            await or_stop(supervise(cluster, lambda e: report_supervision(e, console, log)), stop)
        code = 1
    except Stopped:
        console.print("agora local: stopping")
    except ClusterError as exc:
        console.print(f"[red]agora local: {escape(str(exc))}[/red]")
        code = 1
    finally:
        forced = await cluster.stop(hurry)
        if forced:
            console.print(f"agora local: had to kill {', '.join(forced)}")
        if address_file is not None:
            remove_address(address_file, cluster.endpoint or "")
        if http_file is not None:
            remove_address(http_file, ",".join(cluster.http_urls))
        for signo in _SIGNALS:
            loop.remove_signal_handler(signo)
    console.print("agora local: stopped")
    return code


def file_logger(file: Any) -> Any:
    """A structlog logger writing key-value lines to ``file`` (``agora local``'s own log)."""
    return structlog.wrap_logger(
        structlog.WriteLogger(file),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
        ],
        # Not the CLI's own (quiet) filter: this log has every event.
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )


def report_supervision(event: SupervisionEvent, console: Console, log: Any) -> None:
    """One line on stderr for each exit and each give-up; every event in the log."""
    child = event.child
    if isinstance(event, Crashed):
        log.warning(
            "daemon_restarting",
            daemon=child.name,
            status=event.status,
            attempt=event.attempt,
            delay=event.delay,
        )
        console.print(
            f"[yellow]agora local: {escape(child.name)} {escape(event.status)}; restarting it "
            f"in {event.delay:g} s (attempt {event.attempt}; log: {escape(str(child.log))})"
            "[/yellow]"
        )
    elif isinstance(event, Restarted):
        log.info("daemon_restarted", daemon=child.name, pid=event.pid, restarts=child.restarts)
    elif isinstance(event, StoodDown):
        log.info("daemon_stood_down", daemon=child.name, status=child.exit_status())
        console.print(
            f"[yellow]agora local: {escape(child.describe_exit())}; "
            "the cluster carries on without it[/yellow]"
        )
    elif isinstance(event, GaveUp):
        log.error(
            "daemon_gave_up",
            daemon=child.name,
            status=event.status,
            crashes=event.crashes,
            window=event.window,
        )
        console.print(
            f"[red]agora local: {escape(child.name)} crashed {event.crashes} times within "
            f"{event.window:g} s (the last: {escape(event.status)}); giving up, stopping the "
            f"cluster (log: {escape(str(child.log))})[/red]" + escape(child.log_tail())
        )


def write_address(
    endpoint: str, environ: Mapping[str, str] | None = None, *, name: str = "master"
) -> Path:
    """Record ``endpoint`` in ``$AGORA_HOME/<name>`` (atomically); the file's path."""
    home = agora_home(environ)
    home.mkdir(parents=True, exist_ok=True)
    path = home / name
    with tempfile.NamedTemporaryFile(
        "w", dir=home, prefix=f".{name}.", delete=False, encoding="utf-8"
    ) as tmp:
        tmp.write(endpoint + "\n")
    os.replace(tmp.name, path)
    return path


def remove_address(path: Path, endpoint: str) -> None:
    """Remove ``path`` unless another ``agora local`` has since written its own address."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8").strip() == endpoint:
            path.unlink()
