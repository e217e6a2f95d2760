"""The child processes of ``agora local``: one master (or a group of 3 or 5), N agents and,
when asked, the batch service.

Each daemon runs as ``python -m agora.master.server`` / ``python -m agora.agent.server`` in a
session of its own (so a Ctrl-C in the terminal reaches only ``agora local``, which then stops
them in order: agents first, so that they stop their executors and tasks, then the master). Each
child's stdout and stderr go to ``<work dir>/logs/<name>.log``. The batch service runs as
``python -m agora.frameworks.batch`` (a process: the SDK imports no framework); it is stopped
first, leaving nothing of its own behind (its tasks end with the agents).

Once up, every daemon keeps its ports: a lone master and the batch service are started again
with the ports they first got (:meth:`LocalCluster.relaunch` restarts a daemon that died, see
:mod:`agora.sdk.cli.supervision`), so the address files stay valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from agora.sdk.cli.common import ask_master
from agora.sdk.cli.local_keys import AGENT_KEY, BATCH_KEY, LocalKeys
from agora.sdk.cli.restarts import RestartLimits, RestartPolicy
from agora.sdk.discovery import MASTER_KEY
from agora.sdk.transport import CurveClient

__all__ = [
    "Child",
    "ClusterError",
    "LocalCluster",
    "Stopped",
    "free_ports",
    "leftover_pids",
    "or_stop",
]

T = TypeVar("T")

#: The batch service's child name (and its work dir's).
BATCH = "batch"

_POLL = 0.05  # seconds between looks at a file or the master's state while starting
_AGENT_GRACE = 15.0  # an agent stops its executors (and their tasks) before it exits
_MASTER_GRACE = 5.0
_RELEASE_TIMEOUT = 20.0  # the cgroup cleanup of agents that did not drain
_SWEEP_GRACE = 3.0
_LAUNCH_TIMEOUT = 10.0  # a restart under way when the cluster stops
#: Settings the daemons would take from the environment but must not, here. The local cluster
#: gives its daemons its own keys (or none) by flag, and $AGORA_CURVE_SECRET_KEY /
#: $AGORA_CURVE_SERVER_KEY may well be set for the CLI's own use (the master would read the
#: first as its own secret key, the agents both as theirs); $AGORA_INSECURE, set for the CLI
#: to skip its keys, would be read by the daemons as their --insecure. The HTTP settings name
#: one port and address, which several daemons on one host cannot all take: each agent picks a
#: free port instead.
_DAEMON_ENV = frozenset(
    {
        "AGORA_CURVE_SECRET_KEY",
        "AGORA_CURVE_SERVER_KEY",
        "AGORA_CURVE_AUTHORIZED_KEYS",
        "AGORA_INSECURE",
        "AGORA_ACL",
        "AGORA_HTTP_PORT",
        "AGORA_HTTP_BIND",
        "AGORA_ADVERTISE_HOST",
    }
)


class ClusterError(Exception):
    """The cluster could not start, or a daemon failed."""


class Stopped(Exception):
    """A stop was requested (signal) while waiting for something."""


async def or_stop(aw: Awaitable[T], stop: asyncio.Event) -> T:
    """``aw``'s result, or :class:`Stopped` as soon as ``stop`` is set (``aw`` is cancelled)."""
    goal = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({goal, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if goal.done():
            return goal.result()
        raise Stopped
    finally:
        for fut in (goal, stopper):
            if not fut.done():
                fut.cancel()
        await asyncio.gather(goal, stopper, return_exceptions=True)


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: asyncio.subprocess.Process | None = None
    waiter: asyncio.Task[int] | None = field(default=None, repr=False)
    #: When to start it again after a crash (see :mod:`agora.sdk.cli.restarts`).
    policy: RestartPolicy = field(default_factory=RestartPolicy, repr=False)
    #: How many times it was started again.
    restarts: int = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def exit_status(self) -> str:
        """``was killed by signal 9``, ``exited with status 1``."""
        code = None if self.proc is None else self.proc.returncode
        if code is not None and code < 0:
            return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def describe_exit(self) -> str:
        return f"{self.name} {self.exit_status()} (log: {self.log})"

    def log_tail(self) -> str:
        """The last lines of its log, introduced on a line of their own ("" if none)."""
        return _tail(self.log)


class LocalCluster:
    """``masters`` masters (1, or an election group of 3 or 5) and ``agents`` agents under
    ``work_dir``, all on 127.0.0.1 with free ports; with ``keys``, every link is CURVE (each
    daemon its own identity from ``keys``), else the daemons run without it."""

    def __init__(
        self,
        work_dir: Path,
        agents: int,
        *,
        masters: int = 1,
        agent_resources: str | Sequence[str] | None = None,
        agent_attributes: Sequence[str] = (),
        log_level: str = "info",
        python: str = sys.executable,
        batch: bool = False,
        restart_limits: RestartLimits | None = None,
        keys: LocalKeys | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.keys = keys
        self.restart_limits = restart_limits or RestartLimits()
        #: Where the batch service (``batch=True``) writes its HTTP API's URL.
        self.batch_url_file: Path | None = work_dir / "batch.url" if batch else None
        #: The batch service's URL once it is up.
        self.batch_url: str | None = None
        self.logs = work_dir / "logs"
        self.endpoint_file = work_dir / "master.endpoint"
        #: The master's endpoint, or every master's, comma-separated (what clients are given).
        self.endpoint: str | None = None
        #: Each master's operator HTTP API (/state, /metrics, operator calls), once up.
        self.http_urls: list[str] = []
        self.master_names = (
            ["master"] if masters == 1 else [f"master-{i}" for i in range(1, masters + 1)]
        )
        self.python = python
        self.log_level = log_level
        #: Every agent's resources (one value) or each agent's own, in order; likewise attributes.
        self.agent_resources: tuple[str, ...] = (
            (agent_resources,) if isinstance(agent_resources, str) else tuple(agent_resources or ())
        )
        self.agent_attributes = tuple(agent_attributes)
        self.agent_names = [f"agent-{i}" for i in range(1, agents + 1)]
        self.children: list[Child] = []
        self._launching: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- start

    async def start(self, timeout: float, stop: asyncio.Event) -> str:
        """Start everything; the master's endpoint once every agent has registered.

        Raises ClusterError when a daemon dies or the deadline passes, Stopped on ``stop``.
        """
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            self.endpoint_file.unlink(missing_ok=True)
        except OSError as exc:
            raise ClusterError(f"cannot use the work dir {self.work_dir}: {exc}") from None
        try:
            async with asyncio.timeout(timeout):
                if len(self.master_names) == 1:
                    master = await self._spawn("master", self._master_argv())
                    endpoint = await or_stop(self._read_file(self.endpoint_file), stop)
                    # (Written before the endpoint file, so already there.)
                    http_file = self.endpoint_file.with_name(self.endpoint_file.name + ".http")
                    self.http_urls = [await or_stop(self._read_file(http_file), stop)]
                    # A restart takes the same ports: clients keep the address they were given.
                    master.argv = self._master_argv(endpoint, _port_of(self.http_urls[0]))
                else:
                    endpoint = await self._spawn_group()
                self.endpoint = endpoint
                for name in self.agent_names:
                    await self._spawn(name, self._agent_argv(name, endpoint))
                await or_stop(self._registered(endpoint), stop)
                if self.batch_url_file is not None:
                    self.batch_url_file.unlink(missing_ok=True)
                    argv = self._batch_argv(self.batch_url_file, endpoint)
                    batch = await self._spawn(BATCH, argv)
                    self.batch_url = await or_stop(self._read_file(self.batch_url_file), stop)
                    batch.argv = self._batch_argv(
                        self.batch_url_file, endpoint, _port_of(self.batch_url)
                    )
        except TimeoutError:
            raise ClusterError(
                f"the cluster did not come up within {timeout:g}s (logs in {self.logs})"
            ) from None
        return endpoint

    def _master_argv(self, bind: str = "tcp://127.0.0.1:0", http_port: int = 0) -> list[str]:
        return [
            *(self.python, "-m", "agora.master.server"),
            *("--bind", bind),
            *("--endpoint-file", str(self.endpoint_file)),
            *("--http-port", str(http_port)),
            *("--work-dir", str(self.work_dir / "master")),
            *("--log-level", self.log_level),
            *self._master_curve(),
        ]

    def _master_curve(self) -> list[str]:
        return self.keys.master_flags() if self.keys is not None else ["--insecure"]

    def _client_curve(self, name: str) -> list[str]:
        return self.keys.client_flags(name) if self.keys is not None else []

    def _agent_http(self) -> list[str]:
        """The agents' HTTP API takes the tokens the masters' does (the user's is an operator's:
        it reads every task's output); without keys, the agents run --insecure, which leaves it
        as open as the rest."""
        if self.keys is None:
            return ["--insecure"]
        return ["--http-credentials", str(self.keys.http_credentials)]

    def client_curve(self) -> CurveClient | None:
        """The credentials of the user who started the cluster (None without keys)."""
        if self.keys is None:
            return None
        return CurveClient(self.keys.secret(self.keys.user), self.keys.public(MASTER_KEY))

    async def _spawn_group(self) -> str:
        """Start an election group on free ports; every member is named in every --masters."""
        ports = free_ports(2 * len(self.master_names))
        endpoints = [f"tcp://127.0.0.1:{port}" for port in ports[0::2]]
        self.http_urls = [f"http://127.0.0.1:{port}" for port in ports[1::2]]
        group = ",".join(endpoints)
        for name, endpoint, http_port in zip(
            self.master_names, endpoints, ports[1::2], strict=True
        ):
            argv = [
                *(self.python, "-m", "agora.master.server"),
                *("--bind", endpoint),
                *("--http-port", str(http_port)),
                *("--masters", group),
                *("--advertise", endpoint),
                *("--work-dir", str(self.work_dir / name)),
                *("--log-level", self.log_level),
                *self._master_curve(),
            ]
            await self._spawn(name, argv)
        return group

    def _agent_argv(self, name: str, endpoint: str) -> list[str]:
        argv = [
            *(self.python, "-m", "agora.agent.server"),
            *("--master", endpoint),
            *("--work-dir", str(self.work_dir / name)),
            *("--hostname", name),
            *("--log-level", self.log_level),
            *self._client_curve(AGENT_KEY),
            *self._agent_http(),
        ]
        index = self.agent_names.index(name) if name in self.agent_names else 0
        resources = _for_agent(self.agent_resources, index)
        if resources:
            argv += ["--resources", resources]
        attributes = _for_agent(self.agent_attributes, index)
        if attributes:
            argv += ["--attributes", attributes]
        if os.geteuid() == 0:
            # The user running the cluster is trusted with their own identity: under a root
            # `agora local`, tasks that name no user run as root, as the cluster does.
            argv.append("--allow-root-tasks")
        return argv

    async def _spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(
            name, argv, self.logs / f"{name}.log", policy=RestartPolicy(self.restart_limits)
        )
        await self._launch(child)
        self.children.append(child)
        return child

    async def _launch(self, child: Child) -> None:
        """Start ``child``'s process (again) with its argv, its output appended to its log."""
        try:
            with open(child.log, "ab") as log:
                proc = await asyncio.create_subprocess_exec(
                    *child.argv,
                    env={k: v for k, v in os.environ.items() if k not in _DAEMON_ENV},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise ClusterError(f"cannot start {child.name}: {exc}") from None
        child.proc = proc
        child.waiter = asyncio.ensure_future(proc.wait())

    async def relaunch(self, child: Child) -> None:
        """Start a child that died again, on its work dir and ports. Raises ClusterError when it
        cannot be started. The start itself is not cancelled with the caller: :meth:`stop`
        waits for it, so a process started while the cluster stops is stopped too."""
        launch = asyncio.ensure_future(self._launch(child))
        self._launching.add(launch)
        launch.add_done_callback(self._launching.discard)
        await asyncio.shield(launch)

    def _batch_argv(self, url_file: Path, endpoint: str, http_port: int = 0) -> list[str]:
        return [
            *(self.python, "-m", "agora.frameworks.batch"),
            *("--master", endpoint),
            *("--work-dir", str(self.work_dir / BATCH)),
            *("--endpoint-file", str(url_file)),
            *("--http-port", str(http_port)),
            *("--log-level", self.log_level),
            *self._client_curve(BATCH_KEY),
            # Over TCP it takes the masters' tokens (the user's is an operator's); local users
            # submit through its Unix socket, $AGORA_HOME/batch.sock, each as themself.
            *(
                ["--http-credentials", str(self.keys.http_credentials)]
                if self.keys is not None
                else ["--insecure-http"]
            ),
        ]

    async def _read_file(self, path: Path) -> str:
        while True:
            self._check_alive()
            with contextlib.suppress(OSError):
                text = path.read_text(encoding="utf-8").strip()
                if text:
                    return text
            await asyncio.sleep(_POLL)

    async def _registered(self, endpoint: str) -> None:
        wanted = set(self.agent_names)
        curve = self.client_curve()
        while True:
            self._check_alive()
            with contextlib.suppress(Exception):  # the master may not answer yet
                reply = await ask_master(endpoint, 1.0, lambda c: c.get_state(timeout=1.0), curve)
                active = {a.hostname for a in reply.agents if a.status == "ACTIVE"}
                if wanted <= active:
                    return
            await asyncio.sleep(_POLL)

    def _check_alive(self) -> None:
        for child in self.children:
            if not child.running:
                raise ClusterError(child.describe_exit() + _tail(child.log))

    # ---------------------------------------------------------------- stop

    async def stop(self, hurry: asyncio.Event) -> list[str]:
        """Stop every child (agents, then the master) and anything left of their executors.

        Agents get SIGUSR1 (drain: kill their executors, unregister; SIGTERM would leave their
        executors running for a restarted agent to adopt), the master SIGTERM; then SIGKILL to
        the child's process group after its grace period, or at once when ``hurry`` is set.
        Returns what had to be killed, for the record.
        """
        forced: list[str] = []
        if self._launching:  # a restart under way: let it finish, then stop what it started
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_LAUNCH_TIMEOUT):
                    await asyncio.gather(*self._launching, return_exceptions=True)
        services = [c for c in self.children if c.name == BATCH]
        agents = [c for c in self.children if c.name not in self.master_names and c.name != BATCH]
        masters = [c for c in self.children if c.name in self.master_names]
        for group, grace in (
            (services, _MASTER_GRACE),
            (agents, _AGENT_GRACE),
            (masters, _MASTER_GRACE),
        ):
            results = await asyncio.gather(*(_stop_child(c, grace, hurry) for c in group))
            forced += [c.name for c, killed in zip(group, results, strict=True) if killed]
        swept = await sweep(self.work_dir)
        forced += [f"pid {pid}" for pid in swept]
        # An agent that did not drain (killed, crashed) left its containers' cgroups behind.
        undrained = [c for c in agents if c.proc is not None and c.proc.returncode != 0]
        if undrained and os.geteuid() == 0:
            await _release_cgroups(self.python, [self.work_dir / c.name for c in undrained])
        return forced


def _port_of(url: str) -> int:
    """The port of ``tcp://host:port`` or ``http://host:port``."""
    port = urlsplit(url).port
    if port is None:
        raise ClusterError(f"no port in {url!r}")
    return port


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports on 127.0.0.1 that were free a moment ago (an election group's members
    must know each other's ports before any of them binds)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


async def _stop_child(child: Child, grace: float, hurry: asyncio.Event) -> bool:
    """Stop one child; True when it had to be killed."""
    proc = child.proc
    if proc is None or child.waiter is None:
        return False
    if proc.returncode is None:
        stop = signal.SIGUSR1 if child.name.startswith("agent") else signal.SIGTERM
        _signal_group(proc.pid, stop)
    try:
        async with asyncio.timeout(grace):
            await or_stop(asyncio.shield(child.waiter), hurry)
        killed = False
    except (TimeoutError, Stopped):
        killed = True
    if proc.returncode is None:  # not reaped yet, so its pid (= its group id) is still its own
        _signal_group(proc.pid, signal.SIGKILL)
    await child.waiter
    return killed


async def _release_cgroups(python: str, work_dirs: list[Path]) -> None:
    """Run the agent's own cleanup for these work dirs (a process: the SDK imports no agent)."""
    args = [python, "-m", "agora.agent.server.release", *map(str, work_dirs)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with asyncio.timeout(_RELEASE_TIMEOUT):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


def _signal_group(pgid: int, signo: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signo)


def leftover_pids(work_dir: Path) -> list[int]:
    """Our processes (executors, tasks, their children) whose AGORA_SANDBOX is under work_dir.

    The agent gives every executor AGORA_SANDBOX, and the command executor gives it to every task
    (inherited by their children), so this finds what a killed agent left behind, and nothing of
    anyone else's. Linux only (reads /proc); elsewhere it finds nothing.
    """
    root = os.path.realpath(work_dir)
    me, uid = os.getpid(), os.getuid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"AGORA_SANDBOX="):
                sandbox = os.path.realpath(os.fsdecode(item[len(b"AGORA_SANDBOX=") :]))
                if sandbox == root or sandbox.startswith(root + os.sep):
                    found.append(int(entry))
                break
    return found


async def sweep(work_dir: Path) -> list[int]:
    """SIGTERM, then SIGKILL, whatever :func:`leftover_pids` finds; the pids it found."""
    pids = leftover_pids(work_dir)
    if not pids:
        return []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SWEEP_GRACE
    while loop.time() < deadline and any(_alive(p) for p in pids):
        await asyncio.sleep(_POLL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("\n--- last lines of its log ---\n" + "\n".join(text)) if text else ""


def _for_agent(values: tuple[str, ...], index: int) -> str | None:
    """The value for agent ``index``: the only one given, or its own."""
    if not values:
        return None
    return values[0] if len(values) == 1 else values[index]
