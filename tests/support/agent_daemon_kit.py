"""Drive the real agent daemon (a subprocess) against a fake master written by hand.

The fake master is a ZmqServer speaking the master's side of the agent protocol: AGENT_REGISTERED,
RUN_TASK, STATUS_UPDATE_ACK, KILL_TASK, PING. ``agent_process`` starts ``agora-agent`` on a work
dir and kills, on exit, every process of it the test left: executors by the pid files in the work
dir, tasks by the sandbox under it they started in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agora.agent.server.isolation import release_cgroups_of
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    CommandInfo,
    FrameworkInfo,
    MasterInfo,
    Message,
    RegisterAgent,
    RunTask,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import Received, ZmqServer

from support.insecure import insecure_unless_curve

M = TypeVar("M", bound=Message)

EPOCH = 3
AGENT_ID = AgentID("agent-under-test")
FID = FrameworkID("fw-1")
FRAMEWORK = FrameworkInfo(name="test-framework", framework_id=FID)
WAIT = 20.0  # seconds: generous, every wait polls and returns as soon as it can
_MARK = "AGORA_AGENT_DAEMON_TEST"  # in the environment of every process a test starts


def wait_for_executor() -> None:
    """The command executor is written by another hand at the same time: wait for it a while."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [sys.executable, "-c", "import agora.agent.executors.command"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return
        time.sleep(1.0)
    pytest.fail("agora.agent.executors.command cannot be imported")


# ---- the fake master ---------------------------------------------------------------------------


@dataclass
class FakeMaster:
    server: ZmqServer
    endpoint: str
    peer: str | None = None
    backlog: list[Message] = field(default_factory=list)
    seen: list[Message] = field(default_factory=list)

    @classmethod
    def bind(cls, endpoint: str = "tcp://127.0.0.1:0") -> FakeMaster:
        server = ZmqServer.bind(endpoint)
        return cls(server, server.endpoint)

    def close(self) -> None:
        self.server.close()

    async def send(self, message: Message, epoch: int = EPOCH) -> None:
        assert self.peer is not None, "the agent has not said anything yet"
        assert await self.server.send(self.peer, message, epoch)

    async def _next(self, timeout: float) -> Message:
        received: Received = await asyncio.wait_for(self.server.recv(), timeout)
        assert received.message is not None, f"agent sent a bad frame: {received.error}"
        self.peer = received.peer
        self.seen.append(received.message)
        return received.message

    async def expect(
        self, kind: type[M], where: Callable[[M], bool] = lambda m: True, timeout: float = WAIT
    ) -> M:
        """The first message (backlog first) of ``kind`` matching ``where``; others are kept."""
        for i, message in enumerate(self.backlog):
            if isinstance(message, kind) and where(message):
                del self.backlog[i]
                return message
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind.__name__} within {timeout} s; got {self.backlog}")
            try:
                message = await self._next(left)
            except TimeoutError:
                continue
            if isinstance(message, kind) and where(message):
                return message
            self.backlog.append(message)

    async def register(self) -> RegisterAgent:
        reg = await self.expect(RegisterAgent)
        info = MasterInfo(master_id="fake", address=self.endpoint, epoch=EPOCH)
        await self.send(AgentRegistered(agent_id=AGENT_ID, master_info=info))
        return reg

    async def update(self, task_id: str, state: TaskState | None = None) -> TaskStatus:
        def match(m: StatusUpdateMessage) -> bool:
            s = m.update.status
            return s.task_id == task_id and (state is None or s.state == state)

        return (await self.expect(StatusUpdateMessage, match)).update.status

    async def ack(self, status: TaskStatus) -> None:
        assert status.uuid is not None
        ack = StatusUpdateAck(framework_id=FID, task_id=status.task_id, uuid=status.uuid)
        await self.send(ack)

    async def run_task(
        self, task_id: str, command: str, resources: str = "cpus:0.1;mem:16"
    ) -> None:
        task = TaskInfo(
            task_id=TaskID(task_id),
            name=task_id,
            agent_id=AGENT_ID,
            resources=Resources.parse(resources),
            command=CommandInfo(value=command),
        )
        await self.send(RunTask(framework_info=FRAMEWORK, framework_id=FID, task=task))

    async def run_to_running(
        self, task_id: str, command: str, resources: str = "cpus:0.1;mem:16"
    ) -> TaskStatus:
        await self.run_task(task_id, command, resources)
        running = await self.update(task_id, TaskState.RUNNING)
        await self.ack(running)
        return running


# ---- the agent process ---------------------------------------------------------------------------


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    work_dir: Path
    log_path: Path

    def sandbox(self, executor_id: str = "agora-command") -> Path:
        return self.work_dir / "frameworks" / FID / "executors" / executor_id

    def task_sandbox(self, task_id: str) -> Path:
        return self.sandbox() / "tasks" / task_id

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def executor_endpoint(self) -> str:
        """Where the agent serves its executors (a Unix socket by default), from its log."""
        started = [line for line in self.log().splitlines() if '"agent_started"' in line]
        assert started, "the agent has not started"
        return str(json.loads(started[-1])["executor_endpoint"])


def _agent_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env[_MARK] = "1"
    return env


@contextlib.contextmanager
def agent_process(tmp_path: Path, master: str, *extra: str) -> Iterator[AgentProcess]:
    work_dir = tmp_path / "work"
    log_path = tmp_path / "agent.log"
    argv = [
        sys.executable,
        "-m",
        "agora.agent.server",
        "--master",
        master,
        "--work-dir",
        str(work_dir),
        "--hostname",
        "test-host",
        "--attributes",
        "rack:r1;zone:z",
        "--registration-backoff",
        "0.2",
        "--status-update-retry",
        "0.3",
        "--status-update-retry-max",
        "0.6",
        "--executor-shutdown-grace-period",
        "3",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        # These tests read tasks' host pids ($$) from inside them: no pid namespace here (the
        # containers have tests of their own).
        "--isolation",
        "posix",
        # The tests run tasks that name no user under a root test run (--no-allow-root-tasks in
        # ``extra`` turns the refusal back on).
        "--allow-root-tasks",
        # No CURVE unless the test gives keys; and the HTTP API without tokens, unless the test
        # says how it is protected.
        *insecure_unless_curve(extra),
        *(
            ()
            if {"--http-credentials", "--no-insecure-http"} & set(extra)
            else ("--insecure-http",)
        ),
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, env=_agent_env(), start_new_session=True
        )
    agent = AgentProcess(proc, work_dir, log_path)
    try:
        yield agent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        # Its executors (by their pid files), then its tasks: they run in sessions of their own,
        # and with the agent killed nobody else would (found by the sandbox they started in).
        for pid in [*pids_in(work_dir), *started_in(work_dir)]:
            if ours(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        # The containers of its tasks and executors (the agent was killed: nobody else will).
        release_cgroups_of(str(work_dir))


def pids_in(work_dir: Path) -> list[int]:
    pids = []
    for path in [*work_dir.rglob("executor.pid"), *work_dir.rglob("task.pid")]:
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(path.read_text().strip()))
    return pids


def started_in(work_dir: Path) -> list[int]:
    """Pids of the processes whose AGORA_SANDBOX lies under ``work_dir``."""
    prefix = f"AGORA_SANDBOX={work_dir.resolve()}/".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\x00")
        except OSError:
            continue
        if any(v.startswith(prefix) for v in environ):
            found.append(int(entry))
    return found


def ours(pid: int) -> bool:
    """A live (non-zombie) process started by one of these tests."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z" and f"{_MARK}=1".encode() in environ.split(b"\x00")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def read_pid(path: Path) -> int:
    def ready() -> bool:
        return path.exists() and path.read_text().strip().isdigit()

    await eventually(ready, f"pid file {path}")
    return int(path.read_text().strip())


@contextlib.asynccontextmanager
async def scenario(tmp_path: Path, *extra: str) -> AsyncIterator[tuple[FakeMaster, AgentProcess]]:
    master = FakeMaster.bind()
    try:
        with agent_process(tmp_path, master.endpoint, *extra) as agent:
            try:
                yield master, agent
            except BaseException:
                sys.stderr.write(f"---- agent log ----\n{agent.log()[-20000:]}\n")
                raise
    finally:
        master.close()


def run(coro: Any) -> None:
    asyncio.run(coro)
