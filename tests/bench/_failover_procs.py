"""The failover bench's processes (3 masters, N agents) and its probes of the masters.

:class:`Group` starts daemons as processes of their own sessions and ends every one of them (and
whatever their executors left) in :meth:`Group.close`, which is safe to call twice and from a
``finally``. :class:`Probe` keeps one DEALER per master and asks it ``DETECT_LEADER`` (and, of the
leader, ``GET_STATE``), remembering the newest answer of each kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from agora.agent.server.isolation import release_cgroups_of
from agora.sdk.cli.cluster import free_ports, leftover_pids
from agora.sdk.messages import DetectLeader, GetState, LeaderInfo, StateReply
from agora.sdk.transport import TransportClosed
from agora.sdk.transport.zmq_client import ZmqClient

log = structlog.get_logger(__name__)

_AGENT_GRACE = 15.0  # an agent drains (kills its executors) before it exits
_MASTER_GRACE = 5.0


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: Killed on purpose (and not restarted since).
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.killed = False
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("AGORA_")},
                start_new_session=True,
            )

    def signal(self, signo: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signo)

    def kill(self) -> None:
        """SIGKILL the daemon's process group and reap it."""
        self.killed = True
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()


@dataclass
class Group:
    """3 masters (a Raft group) and ``agents`` agents under ``work_dir``, on 127.0.0.1."""

    work_dir: Path
    agents: int
    election_timeout: float = 1.0
    agent_resources: str = "cpus:1;mem:256;disk:256"
    masters: list[Daemon] = field(default_factory=list)
    agent_daemons: list[Daemon] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    #: Each master's operator HTTP port, when started with ``http=True``.
    http_ports: list[int] = field(default_factory=list)

    @property
    def group(self) -> str:
        return ",".join(self.endpoints)

    def start_masters(self, extra: tuple[str, ...] = (), *, http: bool = False) -> None:
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        ports = free_ports(6 if http else 3)
        self.endpoints = [f"tcp://127.0.0.1:{p}" for p in ports[:3]]
        self.http_ports = ports[3:]
        for i, endpoint in enumerate(self.endpoints, 1):
            http_args = ("--http-port", str(self.http_ports[i - 1])) if http else ()
            argv = [
                *(sys.executable, "-m", "agora.master.server"),
                *("--bind", endpoint, "--masters", self.group, "--advertise", endpoint),
                "--insecure",  # CURVE off on purpose: the bench measures the election itself
                *("--work-dir", str(self.work_dir / f"master-{i}")),
                *("--election-timeout", str(self.election_timeout)),
                *("--election-heartbeat", str(self.election_timeout / 10)),
                *("--log-level", "warning"),
                *http_args,
                *extra,
            ]
            daemon = Daemon(f"master-{i}", argv, self.work_dir / "logs" / f"master-{i}.log")
            self.masters.append(daemon)
            daemon.start()

    def start_agents(self) -> None:
        for i in range(1, self.agents + 1):
            name = f"agent-{i}"
            argv = [
                *(sys.executable, "-m", "agora.agent.server"),
                *("--master", self.group, "--work-dir", str(self.work_dir / name)),
                *("--hostname", name, "--isolation", "posix", "--http-port", "none"),
                *("--resources", self.agent_resources, "--executor-bind", "tcp://127.0.0.1:0"),
                *("--log-level", "warning"),
                "--allow-root-tasks",  # the bench's tasks name no user; it may run as root
                "--insecure",  # as the masters: CURVE off on purpose
            ]
            daemon = Daemon(name, argv, self.work_dir / "logs" / f"{name}.log")
            self.agent_daemons.append(daemon)
            daemon.start()

    def master_at(self, endpoint: str) -> Daemon:
        return self.masters[self.endpoints.index(endpoint)]

    def check_alive(self) -> None:
        for daemon in (*self.masters, *self.agent_daemons):
            if daemon.proc is not None and not daemon.alive and not daemon.killed:
                tail = daemon.log.read_text(errors="replace").splitlines()[-10:]
                raise RuntimeError(f"{daemon.name} exited; log tail:\n" + "\n".join(tail))

    def close(self) -> None:
        """Drain the agents (SIGUSR1), then kill what is left: masters, executors, tasks."""
        for daemon in self.agent_daemons:
            daemon.signal(signal.SIGUSR1)
        for group, grace in ((self.agent_daemons, _AGENT_GRACE), (self.masters, _MASTER_GRACE)):
            deadline = time.monotonic() + grace
            for daemon in group:
                if group is self.masters:
                    daemon.signal(signal.SIGTERM)
                if daemon.proc is None:
                    continue
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.proc.wait(max(0.1, deadline - time.monotonic()))
                daemon.kill()
        for pid in leftover_pids(self.work_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for daemon in self.agent_daemons:
            with contextlib.suppress(Exception):
                release_cgroups_of(str(self.work_dir / daemon.name))


class Probe:
    """One DEALER per master; the newest LEADER and STATE answer of each, with arrival times."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.info: dict[str, LeaderInfo] = {}
        self.state: dict[str, tuple[float, StateReply]] = {}
        self._clients: dict[str, ZmqClient] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Probe:
        for endpoint in self.endpoints:
            client = ZmqClient.connect(endpoint)
            self._clients[endpoint] = client
            self._readers.append(asyncio.create_task(self._read(endpoint, client)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for client in self._clients.values():
            client.close()

    async def _read(self, endpoint: str, client: ZmqClient) -> None:
        while True:
            try:
                received = await client.recv()
            except TransportClosed:
                return
            message = received.message
            if isinstance(message, LeaderInfo):
                self.info[message.responder] = message
            elif isinstance(message, StateReply):
                self.state[endpoint] = (time.perf_counter(), message)

    def ask_leader(self, endpoints: list[str]) -> None:
        for endpoint in endpoints:
            with contextlib.suppress(Exception):
                self._clients[endpoint].try_send(DetectLeader())

    def ask_state(self, endpoint: str, query: GetState | None = None) -> None:
        with contextlib.suppress(Exception):
            self._clients[endpoint].try_send(query or GetState())

    def active_leader(self, among: list[str], above_epoch: int = -1) -> LeaderInfo | None:
        """A master of ``among`` that says it is the active leader at an epoch > above_epoch."""
        for endpoint in among:
            info = self.info.get(endpoint)
            if info is not None and info.leader == endpoint and info.epoch > above_epoch:
                return info
        return None

    async def wait_leader(
        self, among: list[str], above_epoch: int, deadline: float, every: float = 0.01
    ) -> LeaderInfo:
        """Poll ``among`` every ``every`` seconds until one is the active leader."""
        for endpoint in among:
            self.info.pop(endpoint, None)
        while True:
            self.ask_leader(among)
            await asyncio.sleep(every)
            found = self.active_leader(among, above_epoch)
            if found is not None:
                return found
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no active leader above epoch {above_epoch} among {among}")

    async def wait_follower(self, endpoint: str, leader: str, epoch: int, deadline: float) -> None:
        """Until ``endpoint`` names ``leader`` at ``epoch`` (it rejoined the group)."""
        while True:
            self.ask_leader([endpoint])
            await asyncio.sleep(0.05)
            info = self.info.get(endpoint)
            if info is not None and info.leader == leader and info.epoch == epoch:
                return
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{endpoint} did not rejoin under {leader} at epoch {epoch}")

    async def wait_active_agents(
        self, leader: str, count: int, deadline: float, after: float = 0.0, every: float = 0.05
    ) -> float:
        """Ask ``leader`` for its state until ``count`` agents are ACTIVE; the reply's time."""
        self.state.pop(leader, None)
        while True:
            # Counts, not rows: the whole state of 100,000 tasks does not fit in one message.
            self.ask_state(leader, _COUNTS)
            await asyncio.sleep(every)
            seen = self.state.get(leader)
            if seen is not None and seen[0] > after:
                at, reply = seen
                if _active(reply) >= count:
                    return at
            if time.perf_counter() > deadline:
                raise TimeoutError(f"fewer than {count} agents ACTIVE at {leader}")


#: Counts only: a partial answer's counts are the whole cluster's.
_COUNTS = GetState(agents_limit=0, tasks_limit=0)


def _active(reply: StateReply) -> int:
    """ACTIVE agents in the cluster (``agents_unreachable`` counts every agent not ACTIVE)."""
    if reply.partial:
        return reply.agents_total - reply.agents_unreachable
    return sum(1 for a in reply.agents if a.status == "ACTIVE")


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "max": round(ordered[-1], 3)}
