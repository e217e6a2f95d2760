"""A fake agent for executor tests: a real ZmqServer speaking the agent <-> executor protocol.

``FakeAgent`` records every message it receives, answers REGISTER_EXECUTOR /
REREGISTER_EXECUTOR (unless told not to) and acknowledges status updates (unless told not to).
``ExecutorProcess`` starts a real executor process with the environment an agent gives it, in a
sandbox under a test's tmp dir; ``cleanup`` SIGKILLs it and every process whose working directory
lies in that tmp dir (its tasks), so no test leaves a process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    URI,
    AgentInfo,
    CommandInfo,
    ExecutorInfo,
    ExecutorRegistered,
    ExecutorReregistered,
    ExecutorToFramework,
    FrameworkCapability,
    FrameworkInfo,
    LaunchTask,
    Message,
    RegisterExecutor,
    ReregisterExecutor,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    TaskStatus,
    is_terminal,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import Received, TransportClosed, ZmqServer

FRAMEWORK_ID = FrameworkID("fw-1")
EXECUTOR_ID = ExecutorID("agora-command")
AGENT_ID = AgentID("agent-1")
AGENT_INFO = AgentInfo(
    hostname="localhost", resources=Resources.parse("cpus:2;mem:1024"), agent_id=AGENT_ID
)
EXECUTOR_INFO = ExecutorInfo(
    executor_id=EXECUTOR_ID,
    framework_id=FRAMEWORK_ID,
    command=CommandInfo(value="agora-command-executor"),
    name="Command Executor",
)
TASK_RESOURCES = Resources.parse("cpus:0.1;mem:16")
M = TypeVar("M", bound=Message)


def task(
    task_id: str,
    command: str | Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    kill_grace_period: float | None = None,
    environment: Mapping[str, str] | None = None,
    user: str | None = None,
    uris: Sequence[URI] = (),
    **extra: Any,
) -> TaskInfo:
    """A command task (a str runs through the shell, a sequence is an argv); ``extra`` are more
    TaskInfo fields (health_check, container, resources)."""
    env = dict(environment or {})
    if isinstance(command, str):
        info = CommandInfo(value=command, environment=env, user=user, uris=tuple(uris))
    else:
        info = CommandInfo(
            argv=tuple(command), shell=False, environment=env, user=user, uris=tuple(uris)
        )
    extra.setdefault("resources", TASK_RESOURCES)
    return TaskInfo(
        task_id=TaskID(task_id),
        name=task_id,
        agent_id=AGENT_ID,
        command=info,
        labels=dict(labels or {}),
        kill_grace_period=kill_grace_period,
        **extra,
    )


@dataclass
class FakeAgent:
    """The agent's executor socket, scripted by a test. Create with :meth:`start` in a loop."""

    server: ZmqServer
    capabilities: tuple[FrameworkCapability, ...] = ()
    answer_registration: bool = True
    acknowledge: bool = True
    received: list[tuple[float, str, Message]] = field(default_factory=list)
    bad_frames: int = 0
    peer: str | None = None
    _by_task: dict[str, list[TaskStatus]] = field(default_factory=dict)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, endpoint: str = "tcp://127.0.0.1:0", **options: Any) -> FakeAgent:
        agent = cls(ZmqServer.bind(endpoint), **options)
        agent._reader = asyncio.get_running_loop().create_task(agent._read())
        return agent

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def framework_info(self) -> FrameworkInfo:
        return FrameworkInfo(name="test", framework_id=FRAMEWORK_ID, capabilities=self.capabilities)

    async def _read(self) -> None:
        while True:
            try:
                received = await self.server.recv()
            except TransportClosed:
                return
            await self._handle(received)
            self._arrived.set()

    async def _handle(self, received: Received) -> None:
        message = received.message
        if message is None:
            self.bad_frames += 1
            return
        self.received.append((time.monotonic(), received.peer, message))
        if isinstance(message, StatusUpdateMessage):
            status = message.update.status
            self._by_task.setdefault(status.task_id, []).append(status)
        if isinstance(message, RegisterExecutor) and self.answer_registration:
            self.peer = received.peer
            await self.server.send(
                received.peer,
                ExecutorRegistered(
                    executor_info=EXECUTOR_INFO,
                    framework_id=FRAMEWORK_ID,
                    framework_info=self.framework_info,
                    agent_id=AGENT_ID,
                    agent_info=AGENT_INFO,
                ),
            )
        elif isinstance(message, ReregisterExecutor) and self.answer_registration:
            self.peer = received.peer
            await self.server.send(
                received.peer, ExecutorReregistered(agent_id=AGENT_ID, agent_info=AGENT_INFO)
            )
            if self.acknowledge:
                for update in message.updates:
                    await self.ack(received.peer, update.status)
        elif isinstance(message, StatusUpdateMessage) and self.acknowledge:
            await self.ack(received.peer, message.update.status)

    async def ack(self, peer: str, status: TaskStatus) -> None:
        assert status.uuid is not None
        await self.server.send(
            peer,
            StatusUpdateAck(framework_id=FRAMEWORK_ID, task_id=status.task_id, uuid=status.uuid),
        )

    async def send(self, message: Message) -> bool:
        assert self.peer is not None, "no executor registered yet"
        return await self.server.send(self.peer, message)

    async def send_launch(self, task: TaskInfo) -> None:
        assert await self.send(LaunchTask(framework_id=FRAMEWORK_ID, task=task))

    async def wait_for(self, condition: Callable[[], Any], timeout: float = 15.0) -> Any:
        """Wait until ``condition()`` is truthy (re-checked on every arrival); returns it."""
        async with asyncio.timeout(timeout):
            while True:
                self._arrived.clear()
                value = condition()
                if value:
                    return value
                await self._arrived.wait()

    def messages(self, kind: type[M]) -> list[M]:
        return [m for _, _, m in self.received if isinstance(m, kind)]

    def statuses(self, task_id: str | None = None) -> list[TaskStatus]:
        if task_id is not None:
            return list(self._by_task.get(task_id, ()))
        return [m.update.status for m in self.messages(StatusUpdateMessage)]

    def finished_count(self) -> int:
        """How many tasks have reported a terminal state."""
        return sum(1 for statuses in self._by_task.values() if is_terminal(statuses[-1].state))

    def states(self, task_id: str) -> list[TaskState]:
        return [s.state for s in self.statuses(task_id)]

    def terminal(self, task_id: str) -> TaskStatus | None:
        for status in self._by_task.get(task_id, ()):
            if is_terminal(status.state):
                return status
        return None

    async def wait_terminal(self, task_id: str, timeout: float = 15.0) -> TaskStatus:
        result: TaskStatus = await self.wait_for(lambda: self.terminal(task_id), timeout)
        return result

    async def wait_state(self, task_id: str, state: TaskState, timeout: float = 15.0) -> None:
        await self.wait_for(lambda: state in self.states(task_id), timeout)

    def output_messages(self) -> list[ExecutorToFramework]:
        return self.messages(ExecutorToFramework)

    async def close(self) -> None:
        self.server.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, TransportClosed):
                await self._reader


@dataclass
class ExecutorProcess:
    """A real executor process started the way an agent starts one."""

    popen: subprocess.Popen[bytes]
    sandbox: Path

    @classmethod
    def start(
        cls,
        work_dir: Path,
        endpoint: str,
        *,
        module: str = "agora.agent.executors.command",
        recovery_timeout: float | None = None,
        shutdown_grace_period: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecutorProcess:
        sandbox = work_dir / "frameworks" / FRAMEWORK_ID / "executors" / EXECUTOR_ID
        sandbox.mkdir(parents=True, exist_ok=True)
        environ = dict(os.environ)
        environ.update(
            AGORA_AGENT_ENDPOINT=endpoint,
            AGORA_FRAMEWORK_ID=FRAMEWORK_ID,
            AGORA_EXECUTOR_ID=EXECUTOR_ID,
            AGORA_AGENT_ID=AGENT_ID,
            AGORA_SANDBOX=str(sandbox),
            AGORA_LOG_LEVEL="debug",
        )
        if recovery_timeout is not None:
            environ["AGORA_RECOVERY_TIMEOUT"] = str(recovery_timeout)
        if shutdown_grace_period is not None:
            environ["AGORA_SHUTDOWN_GRACE_PERIOD"] = str(shutdown_grace_period)
        environ.update(env or {})
        with (
            open(sandbox / "executor.stdout", "wb") as out,
            open(sandbox / "executor.stderr", "wb") as err,
        ):
            popen = subprocess.Popen(
                [sys.executable, "-m", module],
                cwd=sandbox,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
        return cls(popen, sandbox)

    def task_dir(self, task_id: str) -> Path:
        return self.sandbox / "tasks" / task_id

    def log(self) -> str:
        return (self.sandbox / "executor.stderr").read_text(errors="replace")

    async def wait(self, timeout: float = 15.0) -> int:
        """The exit status, waited for through a pidfd (no polling)."""
        if self.popen.poll() is not None:
            return self.popen.returncode
        loop = asyncio.get_running_loop()
        fd = os.pidfd_open(self.popen.pid)
        exited = asyncio.Event()
        loop.add_reader(fd, exited.set)
        try:
            async with asyncio.timeout(timeout):
                await exited.wait()
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return self.popen.wait(timeout=5)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)


def processes_under(root: Path) -> list[int]:
    """Pids of the processes whose working directory lies in ``root``."""
    root_text = str(root.resolve())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root_text or cwd.startswith(root_text + "/"):
            pids.append(int(entry))
    return pids


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cleanup(root: Path, *executors: ExecutorProcess) -> None:
    """SIGKILL the executors' process groups and every process working under ``root``."""
    for executor in executors:
        executor.signal(signal.SIGKILL)
    for pid in processes_under(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for executor in executors:
        with contextlib.suppress(subprocess.TimeoutExpired):
            executor.popen.wait(timeout=10)


def run_bounded(coro: Awaitable[None], timeout: float = 60.0) -> None:
    """Run ``coro`` on a fresh event loop, failing it after ``timeout`` seconds."""

    async def bounded() -> None:
        await asyncio.wait_for(coro, timeout)

    asyncio.run(bounded())


async def with_executor(
    root: Path,
    body: Callable[[FakeAgent, ExecutorProcess], Awaitable[None]],
    env: Mapping[str, str] | None = None,
) -> None:
    """A fake agent and a real built-in executor under ``root`` (with ``env``) for ``body``;
    afterwards every process of the executor is gone."""
    agent = FakeAgent.start()
    executor = ExecutorProcess.start(root, agent.endpoint, env=env)
    try:
        await agent.wait_for(lambda: agent.peer, timeout=30)
        await body(agent, executor)
    except BaseException:
        print(executor.log())
        raise
    finally:
        cleanup(root, executor)
        await agent.close()
