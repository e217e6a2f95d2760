"""A real cluster for integration tests: one master and N agents as processes on 127.0.0.1.

Every port is ephemeral (the master binds port 0 and writes the endpoint it got; agents bind their
executor sockets likewise). ``stop`` ends every process the cluster started, executors included
(their pids are in ``executor.pid`` files under the agents' work dirs), so a test leaves nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agora.agent.server.isolation import release_cgroups_of
from agora.sdk.messages import StateReply
from agora.sdk.operator import OperatorClient
from agora.sdk.transport import CurveClient

from support.insecure import insecure_unless_curve
from support.polling import wait_for

#: Executors of a SIGKILLed agent give up on it this fast in tests.
TEST_RECOVERY_TIMEOUT = "3"


@dataclass
class LocalCluster:
    work_dir: Path
    agents: int = 2
    agent_resources: str | None = "cpus:4;mem:4096;disk:4096"
    master_args: Sequence[str] = ()
    agent_args: Sequence[str] = ()
    endpoint: str = ""
    #: The credentials the kit's own state calls use when the master runs CURVE.
    client_curve: CurveClient | None = None
    master: subprocess.Popen[bytes] | None = None
    agent_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # --- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> LocalCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        endpoint_file = self.work_dir / "master.endpoint"
        self.master = self._spawn(
            "master",
            [
                "-m",
                "agora.master.server",
                "--bind",
                "tcp://127.0.0.1:0",
                "--endpoint-file",
                str(endpoint_file),
                "--work-dir",
                str(self.work_dir / "master"),
                *insecure_unless_curve(self.master_args),
                *self.master_args,
            ],
        )
        self.endpoint = wait_for(
            lambda: endpoint_file.exists() and endpoint_file.read_text().strip(),
            timeout,
            "the master's endpoint file",
        )
        for i in range(self.agents):
            self.start_agent(i)
        wait_for(lambda: len(self.active_agents()) == self.agents, timeout, "agents to register")
        return self

    def start_agent(self, i: int) -> subprocess.Popen[bytes]:
        args = [
            "-m",
            "agora.agent.server",
            "--master",
            self.endpoint,
            "--work-dir",
            str(self.work_dir / f"agent-{i}"),
            "--hostname",
            f"agent-{i}",
            "--recovery-timeout",
            TEST_RECOVERY_TIMEOUT,
            "--allow-root-tasks",  # the tests' tasks name no user; the suite may run as root
        ]
        if self.agent_resources:
            args += ["--resources", self.agent_resources]
        args += insecure_unless_curve(self.agent_args)
        proc = self._spawn(f"agent-{i}", [*args, *self.agent_args])
        if i < len(self.agent_procs):
            self.agent_procs[i] = proc
        else:
            self.agent_procs.append(proc)
        return proc

    def stop(self) -> None:
        procs = [p for p in (*self.agent_procs, self.master) if p is not None]
        for proc in procs:
            if proc.poll() is None:
                # Agents drain on SIGUSR1 (SIGTERM would leave their executors for a restart).
                proc.send_signal(signal.SIGTERM if proc is self.master else signal.SIGUSR1)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.kill_leftover_executors()
        for agent_dir in sorted(self.work_dir.glob("agent-*")):
            release_cgroups_of(str(agent_dir))

    def kill_leftover_executors(self) -> list[int]:
        """SIGKILL the process group of every executor still alive; returns their pids."""
        alive = []
        for pid_file in self.work_dir.glob("agent-*/frameworks/*/executors/*/executor.pid"):
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
                alive.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        return alive

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()  # what started before the failure must not outlive the test
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- observation ---------------------------------------------------------------------
    def state(self, timeout: float = 5.0) -> StateReply:
        client = OperatorClient(self.endpoint, curve=self.client_curve)
        return client.get_state_sync(timeout=timeout)

    def active_agents(self) -> list[str]:
        try:
            state = self.state(timeout=2.0)
        except Exception:
            return []
        return [a.agent_id for a in state.agents if a.status == "ACTIVE"]

    def log(self, name: str) -> str:
        path = self.work_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = dict(os.environ, AGORA_LOG_LEVEL=os.environ.get("AGORA_TEST_LOG_LEVEL", "info"))
        try:
            return subprocess.Popen(
                [sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        finally:
            log.close()
