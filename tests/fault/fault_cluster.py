"""The fault suite's cluster on a network rig (``deploy/rig.py``): 3 masters running the election
(hosts 0-2), 2 agent hosts with 2 agents each (hosts 3, 4) and a framework host (5) running the
workload frameworks (``tests/fault/workload.py``).

Every link runs CURVE: :class:`~fault.fault_keys.FaultKeys` makes the run's keys under
``<root>/keys`` (``curve=False``: every process runs ``--insecure`` instead). Every process writes
its own JSONL history under ``<root>/history`` and its output under ``<root>/logs``; each host has
its own address, so every port is fixed. :class:`FaultCluster` is
the nemesis' :class:`~fault.nemesis.Cluster`: it finds the leader from the masters' histories
and kills, restarts, pauses and resumes masters by index.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from fault.fault_keys import OPERATOR_KEY, FaultKeys

log = structlog.get_logger(__name__)

PORT = 5050
MASTER_HOSTS: tuple[int, ...] = (0, 1, 2)
AGENT_HOSTS: tuple[int, ...] = (3, 4)
AGENTS_PER_HOST = 2
#: (host, name) of every agent.
AGENTS: tuple[tuple[int, str], ...] = tuple(
    (host, f"agent-{host}-{k}") for host in AGENT_HOSTS for k in range(AGENTS_PER_HOST)
)
FRAMEWORK_HOST = 5
#: The clients that get a key: the workload frameworks and `agora run` (by their names).
CLIENTS: tuple[str, ...] = ("fw1", "fw2", "run")
HOSTS = 6
ELECTION_TIMEOUT = 1.0

WORKLOAD = Path(__file__).resolve().parent / "workload.py"

MASTER_ARGS: tuple[str, ...] = (
    "--election-timeout",
    str(ELECTION_TIMEOUT),
    "--election-heartbeat",
    "0.1",
    "--agent-ping-interval",
    "1",
    "--max-agent-ping-timeouts",
    "5",
    "--heartbeat-interval",
    "1",
    "--peer-timeout",
    "6",
    "--allocation-interval",
    "0.5",
    "--recovery-hold-off",
    "1",
)
AGENT_ARGS: tuple[str, ...] = (
    "--executor-bind",
    "tcp://127.0.0.1:0",
    "--resources",
    "cpus:4;mem:2048;ports:[31000-31100]",
    "--http-port",
    "0",  # agora run reads output a failover lost from the sandbox through it (with its token)
    "--isolation",
    "posix",
    "--master-timeout",
    "5",
    "--registration-backoff",
    "0.2",
    "--registration-backoff-max",
    "1",
    "--status-update-retry",
    "0.5",
    "--status-update-retry-max",
    "2",
    "--recovery-timeout",
    "10",
)

# Runs on the framework host: asks every master DETECT_LEADER through a MasterLink and prints the
# endpoint of the master that says it leads (empty when none answers within the timeout).
_PROBE = """
import asyncio, os, sys
from agora.sdk.transport import CurveClient, MasterLink
async def main():
    keys = [os.environ.get(k) for k in ("AGORA_CURVE_SECRET_KEY", "AGORA_CURVE_SERVER_KEY")]
    curve = CurveClient(*keys) if all(keys) else None
    link = MasterLink.connect(sys.argv[1].split(","), curve=curve, search_interval=0.1)
    deadline = asyncio.get_running_loop().time() + float(sys.argv[2])
    try:
        while link.leader is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        print(link.leader or "", link.epoch)
    finally:
        link.close()
asyncio.run(main())
"""


def leader_in_history(path: Path) -> int | None:
    """The term this master leads per its own history (``leader`` not followed by a ``term`` or
    ``stepped_down``), else None."""
    if not path.exists():
        return None
    term: int | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        kind = event.get("kind")
        if kind == "leader":
            term = int(event["term"])
        elif kind in ("term", "stepped_down"):
            term = None
    return term


@dataclass
class FaultCluster:
    """The processes of one scenario; ``rig`` is a ``deploy/rig.py`` ``Rig``. With ``curve`` (the
    default) every process has its key from ``keys``; without, every one runs ``--insecure``."""

    rig: Any
    root: Path
    curve: bool = True
    keys: FaultKeys | None = field(default=None, init=False)
    masters: list[subprocess.Popen[bytes] | None] = field(default_factory=list)
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workloads: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        for sub in ("history", "logs", "work", "home"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.masters = [None] * len(MASTER_HOSTS)
        if self.curve:
            self.keys = FaultKeys.create(self.root / "keys", [n for _, n in AGENTS], CLIENTS)

    # ----------------------------------------------------------------- layout

    @property
    def endpoints(self) -> list[str]:
        return [f"tcp://{self.rig.hosts[h].address}:{PORT}" for h in MASTER_HOSTS]

    def history(self, name: str) -> Path:
        return self.root / "history" / f"{name}.jsonl"

    def history_files(self) -> list[Path]:
        return sorted((self.root / "history").glob("*.jsonl"))

    def _env(self, client: str | None = None) -> dict[str, str]:
        """A process's environment: none of the caller's ``AGORA_*`` settings (keys, tokens,
        ``AGORA_INSECURE``), an empty ``AGORA_HOME`` (so nothing is found in the caller's), and
        for a ``client`` its keys and token (or ``AGORA_INSECURE=1`` without CURVE)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
        env["AGORA_LOG_LEVEL"] = os.environ.get("AGORA_TEST_LOG_LEVEL", "info")
        env["AGORA_HOME"] = str(self.root / "home")
        if client is not None:
            env.update(self.keys.client_env(client) if self.keys else {"AGORA_INSECURE": "1"})
        return env

    def _spawn(
        self, host: int, name: str, argv: Sequence[str], client: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` (python's) on ``host``; ``client``: the key it runs with (a client's)."""
        out = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = self._env(client)
        try:
            proc: subprocess.Popen[bytes] = self.rig.popen(
                host, [sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        finally:
            out.close()
        return proc

    # ----------------------------------------------------------------- start

    def start_master(self, i: int) -> None:
        endpoint = self.endpoints[i]
        self.masters[i] = self._spawn(
            MASTER_HOSTS[i],
            f"master-{i}",
            [
                "-m",
                "agora.master.server",
                "--bind",
                endpoint,
                "--masters",
                ",".join(self.endpoints),
                "--advertise",
                endpoint,
                *(self.keys.master_flags() if self.keys else ["--insecure"]),
                "--work-dir",
                str(self.root / "work" / f"master-{i}"),
                "--history",
                str(self.history(f"master-{i}")),
                *MASTER_ARGS,
            ],
        )

    def start_agents(self) -> None:
        for host, name in AGENTS:
            self.agents.append(self._start_agent(host, name))

    def _start_agent(self, host: int, name: str) -> subprocess.Popen[bytes]:
        argv = [
            "-m",
            "agora.agent.server",
            "--master",
            ",".join(self.endpoints),
            "--work-dir",
            str(self.root / "work" / name),
            "--hostname",
            name,
            "--history",
            str(self.history(name)),
            "--http-bind",
            self.rig.hosts[host].address,
            "--allow-root-tasks",  # the suite's tasks name no user and it runs as root
            *(self.keys.agent_flags(name) if self.keys else ["--insecure"]),
            *AGENT_ARGS,
        ]
        return self._spawn(host, name, argv)

    def restart_agent(self, k: int, timeout: float = 15.0) -> None:
        """SIGTERM agent ``k`` (it leaves its executors running, checkpointed) and start it again
        on its work dir, where it recovers and re-adopts them. RuntimeError if it exits non-zero."""
        proc = self.agents[k]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout)
        if code != 0:
            raise RuntimeError(f"{AGENTS[k][1]} exited {code} on SIGTERM")
        self.agents[k] = self._start_agent(*AGENTS[k])

    def recoveries(self) -> dict[str, int]:
        """Agent id -> how many executors its last recovery found alive and adopted (from the
        agents' ``agent_recovered`` log lines; an agent that never recovered is not there)."""
        pattern = re.compile(r"agent_recovered\b.*\bagent_id=(\S+).*\bexecutors_alive=(\d+)")
        logs = (self.logs(name, tail=100_000) for _, name in AGENTS)
        return {m[1]: int(m[2]) for text in logs for m in pattern.finditer(text)}

    @property
    def kill_trigger(self) -> Path:
        """Workloads with trap tasks kill them once this file exists."""
        return self.root / "kill-now"

    @property
    def markers(self) -> Path:
        """Where the trap tasks' TERM traps write when their clean-up completes."""
        return self.root / "markers"

    def start_workload(
        self,
        name: str,
        *,
        seconds: float,
        seed: int,
        failover_timeout: float | None = None,
        trap_tasks: int = 0,
    ) -> None:
        extra: list[str] = []
        if failover_timeout is not None:
            extra += ["--failover-timeout", str(failover_timeout)]
        if trap_tasks:
            self.markers.mkdir(exist_ok=True)
            extra += ["--trap-tasks", str(trap_tasks), "--marker-dir", str(self.markers)]
            extra += ["--kill-trigger", str(self.kill_trigger)]
        argv = [
            str(WORKLOAD),
            "--master",
            ",".join(self.endpoints),
            "--name",
            name,
            "--history",
            str(self.history(name)),
            "--tasks",
            "100000",
            "--seconds",
            str(seconds),
            "--drain",
            "20",
            "--cpus",
            "1",
            "--mem",
            "8",
            "--seed",
            str(seed),
            "--reconcile",
            "2",
            *extra,
        ]
        self.workloads[name] = self._spawn(FRAMEWORK_HOST, name, argv, client=name)

    def start_run(self, name: str, *command: str) -> None:
        """``agora run -- COMMAND`` from the framework host (failover timeout 0, the default)."""
        argv = ["-m", "agora.sdk.cli", "run", "--master", ",".join(self.endpoints)]
        argv += ["--name", name, "--timeout", "60", "--", *command]
        self.workloads[name] = self._spawn(FRAMEWORK_HOST, name, argv, client=name)

    def start(self) -> None:
        for i in range(len(MASTER_HOSTS)):
            self.start_master(i)
        self.start_agents()

    # ----------------------------------------------------------------- nemesis Cluster

    def leader(self) -> int | None:
        """The live, running master whose history says it leads the highest term."""
        best: tuple[int, int] | None = None
        for i, proc in enumerate(self.masters):
            if proc is None or proc.poll() is not None or i in self.paused:
                continue
            term = leader_in_history(self.history(f"master-{i}"))
            if term is not None and (best is None or term > best[0]):
                best = (term, i)
        return best[1] if best is not None else None

    def kill(self, i: int) -> None:
        proc = self.masters[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.masters[i] = None

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start_master(i)

    def pause(self, i: int) -> None:
        proc = self.masters[i]
        if proc is not None:
            os.killpg(proc.pid, signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.masters[i]
        if proc is not None:
            os.killpg(proc.pid, signal.SIGCONT)
        self.paused.discard(i)

    # ----------------------------------------------------------------- observation

    def probe_leader(self, timeout: float = 5.0) -> tuple[str, int] | None:
        """Ask the masters from the framework host which one leads: (endpoint, epoch) or None."""
        argv = self.rig.command(
            FRAMEWORK_HOST, [sys.executable, "-c", _PROBE, ",".join(self.endpoints), str(timeout)]
        )
        env = self._env(OPERATOR_KEY)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 10, env=env)
        lines = done.stdout.strip().splitlines()  # the SDK logs to stdout before the answer
        words = lines[-1].split() if lines else []
        if done.returncode != 0 or len(words) != 2:
            log.warning("probe_failed", rc=done.returncode, out=done.stdout, err=done.stderr[-500:])
            return None
        return words[0], int(words[1])

    def wait_workloads(self, timeout: float) -> dict[str, int | None]:
        """Wait for every workload to exit; their exit codes (None: still running)."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for name, proc in self.workloads.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def stop(self, timeout: float = 15.0) -> None:
        """Drain the agents (SIGUSR1), then stop the masters and any workload left (SIGTERM);
        SIGKILL what does not exit in time. ``rig.down()`` removes whatever is left after."""
        for i in list(self.paused):
            self.resume(i)
        first = [p for p in self.agents if p.poll() is None]
        for proc in first:
            proc.send_signal(signal.SIGUSR1)
        self._reap(first, timeout)
        rest = [p for p in (*self.masters, *self.workloads.values()) if p is not None]
        for proc in rest:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self._reap(rest, timeout)

    @staticmethod
    def _reap(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("process_stuck", pid=proc.pid, argv=proc.args)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def logs(self, name: str, tail: int = 40) -> str:
        path = self.root / "logs" / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:])
