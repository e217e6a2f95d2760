"""The agent daemon takes its transports as parameters: a master daemon, an agent daemon, a
framework's scheduler driver and an executor driver run in one process over the in-process
transport (every message still encoded and decoded; no ZeroMQ socket, no port).

The agent registers with the master; a task launched by the framework reaches the agent as
RUN_TASK, the agent starts the task's executor process (``sleep``, a stand-in: it has no agent
to talk to), and an :class:`ExecutorDriver` in this process, given that process's environment
(its id, its secret, the agent's in-process endpoint), registers in its place. The task then
runs and is killed along the real path: KILL from the framework, KILL_TASK through the master and
the agent to the executor, TASK_KILLED back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from agora.agent.core import AgentConfig
from agora.agent.server.config import DaemonSettings
from agora.agent.server.daemon import AgentDaemon
from agora.master.core import Master, MasterConfig
from agora.master.server.daemon import MasterDaemon
from agora.sdk import FrameworkInfo, Offer, Scheduler, SchedulerCalls, TaskSpec, TaskState
from agora.sdk.executor import Executor, ExecutorDriver
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import CommandInfo, ExecutorInfo, StatusSource, TaskInfo, TaskStatus
from agora.sdk.resources import Resources
from agora.sdk.scheduler import SchedulerDriver
from agora.sdk.transport import InprocClient, InprocHub

DEADLINE = 15.0
EXECUTORS = "agent-executors"


async def until(condition: Callable[[], object], what: str) -> None:
    """Poll ``condition`` (state changed without a notice to the test) with a deadline."""
    try:
        async with asyncio.timeout(DEADLINE):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class OneTask(Scheduler):
    """Launches one task on a custom executor, and records every state it hears of."""

    def __init__(self) -> None:
        self.launched = False
        self.states: list[TaskState] = []

    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> None:
        for offer in offers:
            if self.launched:
                driver.decline(offer)
                continue
            self.launched = True
            executor = ExecutorInfo(
                executor_id=ExecutorID("stand-in"),
                framework_id=FrameworkID(""),
                command=CommandInfo(argv=("sleep", "60"), shell=False),
                resources=Resources.parse("cpus:0.1;mem:32"),
            )
            driver.launch(offer, [TaskSpec("t1", "", "cpus:0.5;mem:64", executor=executor)])

    def status_update(self, driver: SchedulerCalls, status: TaskStatus) -> None:
        self.states.append(status.state)


class InprocExecutor(Executor):
    """Runs tasks in name only: RUNNING at launch, KILLED at a kill."""

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        driver.send_status_update(_status(task.task_id, TaskState.RUNNING))

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        driver.send_status_update(_status(task_id, TaskState.KILLED))


def _status(task_id: TaskID, state: TaskState) -> TaskStatus:
    return TaskStatus(task_id=task_id, state=state, source=StatusSource.EXECUTOR)


def _environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = f.read().split(b"\0")
    return dict(p.decode().partition("=")[::2] for p in pairs if b"=" in p)


def _stand_in(work_dir: str) -> tuple[int, dict[str, str]] | None:
    """The executor process the agent started (its sandbox lies under ``work_dir``), if any."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            env = _environ_of(int(name))
            if env.get("AGORA_SANDBOX", "").startswith(work_dir + "/"):
                return int(name), env
    return None


def _gone(pid: int) -> bool:
    """Dead and reaped (by the agent, whose child it is)."""
    return not os.path.exists(f"/proc/{pid}")


def test_a_whole_cluster_runs_and_kills_a_task_in_one_process(tmp_path: Path) -> None:
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find the executor process the agent started")
    work_dir = str(tmp_path / "agent")

    async def scenario() -> None:
        hub = InprocHub()
        master_server = hub.server("master")
        executor_server = hub.server(EXECUTORS)
        master = MasterDaemon(
            Master(MasterConfig(allocation_interval=0.01)),
            master_server,
            tick_interval=0.01,
            peer_timeout=60.0,
        )
        masters = asyncio.create_task(master.run())
        dialled: list[str] = []

        def dial(endpoint: str, up: Callable[[], None], down: Callable[[], None]) -> InprocClient:
            dialled.append(endpoint)
            return hub.client(endpoint.split("://", 1)[1], on_connected=up, on_disconnected=down)

        settings = DaemonSettings(
            master="inproc-hub://master",
            work_dir=work_dir,
            executor_bind="unused: the executor server is given",
            recovery_timeout=60.0,
            switch_user=False,
            log_format="console",
            log_level="info",
            http_port=None,
            insecure=True,
            isolation=frozenset({"posix"}),
        )
        config = AgentConfig(hostname="inproc-agent", resources=Resources.parse("cpus:2;mem:256"))
        agent = AgentDaemon(
            config,
            settings,
            dial=dial,
            executor_server=executor_server,
            subreaper=False,
        )
        agents = asyncio.create_task(agent.run())
        sched = OneTask()
        framework = SchedulerDriver(
            sched,
            FrameworkInfo(name="inproc"),
            link=lambda up, down: hub.client("master", on_connected=up, on_disconnected=down),
        )
        executor: ExecutorDriver | None = None
        executors: asyncio.Task[int] | None = None
        stand_in: tuple[int, dict[str, str]] | None = None
        try:
            await until(lambda: agent.core.registered, "the agent to register")
            assert dialled == ["inproc-hub://master"]
            assert agent.executor_endpoint == f"inproc-hub://{EXECUTORS}"
            await asyncio.wait_for(framework.start(), DEADLINE)
            await until(lambda: _stand_in(work_dir) is not None, "the executor process")
            stand_in = _stand_in(work_dir)
            assert stand_in is not None
            _, environ = stand_in
            assert environ["AGORA_AGENT_ENDPOINT"] == f"inproc-hub://{EXECUTORS}"
            executor = ExecutorDriver(InprocExecutor(), environ=environ, dial=dial)
            executors = asyncio.create_task(executor.run())
            await until(lambda: TaskState.RUNNING in sched.states, "TASK_RUNNING")
            framework.kill("t1")
            await until(lambda: TaskState.KILLED in sched.states, "TASK_KILLED")
            assert sched.states == [TaskState.RUNNING, TaskState.KILLED]
            assert dialled == ["inproc-hub://master", f"inproc-hub://{EXECUTORS}"]
        finally:
            if executor is not None and executors is not None:
                executor.stop()
                await asyncio.wait_for(executors, DEADLINE)
            if stand_in is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stand_in[0], signal.SIGKILL)
                await until(lambda: _gone(stand_in[0]), "the agent to reap the stand-in")
            framework.stop()
            await asyncio.wait_for(framework.join(), DEADLINE)
            agent.request_stop("test over")
            assert await asyncio.wait_for(agents, DEADLINE) == 0
            master.stop()
            assert await asyncio.wait_for(masters, DEADLINE) == 0
            executor_server.close()
            master_server.close()

    asyncio.run(asyncio.wait_for(scenario(), 60.0))
