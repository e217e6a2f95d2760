"""A kill of the rank-0 MPI member is answered even when a launcher outlives mpirun.

The vanishing kill of issue #15: Open MPI starts each launcher (its ssh) in a process group of
its own, with mpirun's stdout and stderr. A launcher standing in for a member that was lost waits
for an ``exit`` that never comes, so it outlives the kill of mpirun's process group and keeps
those pipes open. The member executor used to read mpirun's output through asyncio pipes, whose
``Process.wait()`` (Python 3.11) waits for the pipes to close too: the kill hung there and never
answered KILLED. Here a fake mpirun starts the real launcher the way Open MPI does and sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
from agora.frameworks.mpi.executor import KILL_GRACE, MemberExecutor
from agora.frameworks.mpi.protocol import decode
from agora.sdk.ids import AgentID, TaskID
from agora.sdk.messages import TaskInfo, TaskState, TaskStatus
from agora.sdk.resources import Resources
from support.polling import until, wait_for
from support.procs import alive

#: mpirun as far as the kill is concerned: one launcher in its own process group (as Open MPI's
#: rsh launcher does), holding our stdout/stderr, for a host that never answers; and slow to die
#: on SIGTERM, as mpirun is while it tries to reach that host's daemon (ignored here).
FAKE_MPIRUN = """
import signal, subprocess, sys, time
launcher = subprocess.Popen(
    [sys.executable, "-m", "agora.frameworks.mpi.launcher", "lost-member", "orted", "--x"],
    process_group=0,
)
with open(sys.argv[1], "w") as f:
    f.write(str(launcher.pid))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("mpirun up", flush=True)
time.sleep(120)
"""


class FakeDriver:
    """What MemberExecutor uses of an ExecutorDriver."""

    def __init__(self, sandbox: Path) -> None:
        self.sandbox = str(sandbox)
        self.statuses: list[TaskStatus] = []
        self.messages: list[dict[str, Any]] = []
        self.stopped = False

    def send_status_update(self, status: TaskStatus) -> None:
        self.statuses.append(status)

    def send_framework_message(self, data: bytes) -> None:
        self.messages.append(decode(data))

    def stop(self) -> None:
        self.stopped = True

    def states(self) -> list[TaskState]:
        return [s.state for s in self.statuses]


def _rank0_task(tmp_path: Path) -> TaskInfo:
    data = {
        "member": "member-0",
        "rank0": True,
        "hostfile": "member-0 slots=1\nlost-member slots=1\n",
        "argv": [sys.executable, "-c", FAKE_MPIRUN, str(tmp_path / "launcher.pid")],
        "env": {},
    }
    return TaskInfo(
        task_id=TaskID("mpi-1-member-0"),
        name="mpirun on member-0",
        agent_id=AgentID("agent-0"),
        resources=Resources.parse("cpus:1;mem:64"),
        data=msgpack.packb(data, use_bin_type=True),
    )


def _launcher_pid(tmp_path: Path) -> int | None:
    try:
        return int((tmp_path / "launcher.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


async def _kill_with_a_lingering_launcher(tmp_path: Path) -> tuple[FakeDriver, float, int]:
    driver = FakeDriver(tmp_path)
    executor = MemberExecutor()
    task = _rank0_task(tmp_path)
    launch = asyncio.create_task(executor.launch_task(driver, task))  # type: ignore[arg-type]
    try:
        # Up, and its launcher asked for the lost member (the scheduler never answers).
        await until(lambda: any(m["t"] == "log" for m in driver.messages), 15, "mpirun up")
        await until(lambda: any(m["t"] == "launch" for m in driver.messages), 15, "the launch")
        assert TaskState.RUNNING in driver.states()
        pid = _launcher_pid(tmp_path)
        assert pid is not None and os.getpgid(pid) == pid  # a process group of its own
        started = time.monotonic()
        kill = asyncio.create_task(executor.kill_task(driver, task.task_id))  # type: ignore[arg-type]
        await until(lambda: TaskState.KILLED in driver.states(), 4 * KILL_GRACE, "KILLED")
        answered = time.monotonic() - started
        await asyncio.wait_for(kill, 5)
        return driver, answered, pid
    finally:
        launch.cancel()
        with contextlib.suppress(BaseException):
            await launch
        await executor._stop_bounded()


def test_a_kill_is_answered_while_a_launcher_holds_mpiruns_pipes(tmp_path: Path) -> None:
    try:
        driver, answered, launcher = asyncio.run(_kill_with_a_lingering_launcher(tmp_path))
    finally:
        pid = _launcher_pid(tmp_path)
        if pid is not None and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    status = driver.statuses[-1]
    assert status.state is TaskState.KILLED and status.message == "killed"
    assert driver.stopped
    # Answered once mpirun itself is gone, not when the launcher lets go of the pipes.
    assert answered < 2 * KILL_GRACE, answered
    # Closing the launch server ended the launcher, as a dropped ssh connection would.
    wait_for(lambda: not alive(launcher), 10, "the launcher to exit")
    assert any(m["t"] == "cancel" for m in driver.messages)
