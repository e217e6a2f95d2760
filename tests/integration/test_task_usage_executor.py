"""The built-in executor (a real process, driven by a fake agent) reports a task's CPU time and
peak memory on its terminal update: from the rusage of the task's process with posix isolation,
from the task container's cgroup with cgroups isolation (root)."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from agora.agent.containers.cgroups import Cgroups
from agora.agent.containers.isolation import CONTAINER_CONFIG_ENV, ContainerConfig
from agora.sdk.ids import TaskID
from agora.sdk.messages import KillTask, Reason, TaskState, TaskStatus
from agora.sdk.resources import Resources
from support.executor_kit import (
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    run_bounded,
    task,
    with_executor,
)

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20
#: Burns 0.3 s of CPU time.
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
#: Touches every page of 64 MiB.
TOUCH = "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
ROOMY = Resources.parse("cpus:0.5;mem:512")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def _terminal(agent: FakeAgent, task_id: str, command: str | list[str]) -> TaskStatus:
    await agent.send_launch(task(task_id, command, resources=ROOMY))
    return await agent.wait_terminal(task_id, timeout=30)


def _run(
    tmp_path: Path,
    body: Callable[[FakeAgent, ExecutorProcess], Awaitable[None]],
    env: dict[str, str] | None = None,
) -> None:
    run_bounded(with_executor(tmp_path, body, env=env), timeout=50)


# --------------------------------------------------------------------------- posix: rusage


def test_posix_task_reports_its_cpu_time_and_peak_rss(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        burn = await _terminal(agent, "burn", _python(BURN))
        touch = await _terminal(agent, "touch", _python(TOUCH))
        for status in (burn, touch):
            assert status.state is TaskState.FINISHED, status.message
        assert burn.cpu_seconds is not None and burn.cpu_seconds >= 0.15
        assert touch.max_rss_bytes is not None and touch.max_rss_bytes >= 50 * MIB
        assert burn.max_rss_bytes is not None and burn.max_rss_bytes < 50 * MIB

    _run(tmp_path, body)


def test_posix_usage_counts_the_shells_children_and_rides_on_failed_and_killed(
    tmp_path: Path,
) -> None:
    burn_then_fail = f"{sys.executable} -c '{BURN}'; exit 3"

    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        failed = await _terminal(agent, "fails", burn_then_fail)
        assert failed.state is TaskState.FAILED and failed.exit_code == 3
        assert failed.cpu_seconds is not None and failed.cpu_seconds >= 0.15
        await agent.send_launch(task("sleeper", "exec sleep 60", resources=ROOMY))
        await agent.wait_state("sleeper", TaskState.RUNNING)
        await agent.send(KillTask(framework_id=FRAMEWORK_ID, task_id=TaskID("sleeper")))
        killed = await agent.wait_terminal("sleeper", timeout=30)
        assert killed.state is TaskState.KILLED
        assert killed.cpu_seconds is not None and killed.cpu_seconds < 0.15
        assert killed.max_rss_bytes is not None and killed.max_rss_bytes > 0
        running = [s for s in agent.statuses("sleeper") if s.state is TaskState.RUNNING]
        assert running and all(s.cpu_seconds is None for s in running)

    _run(tmp_path, body)


# --------------------------------------------------------------------------- cgroups (root)


@pytest.fixture
def cgroups_env() -> Iterator[dict[str, str]]:
    """Cgroup isolation only (no pid namespace: a task's orphans are not reaped by its init)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: cgroups")
    root = f"agora-test/{uuid.uuid4().hex[:12]}"
    cgroups = Cgroups.detect(root)
    if cgroups is None or not {"cpu", "memory"} <= cgroups.controllers:
        pytest.skip("needs the cpu and memory cgroup controllers")
    isolators = frozenset({"posix", "cgroups/cpu", "cgroups/mem"})
    config = ContainerConfig(isolators=isolators, cgroups_root=root)
    try:
        yield {CONTAINER_CONFIG_ENV: config.to_json()}
    finally:
        left = cgroups.names()
        for name in left:  # what a killed executor did not destroy, as the agent would
            cgroup = cgroups.open(name)
            if cgroup is not None:
                cgroup.destroy()
        cgroups.cleanup_root()
        for base in cgroups.roots:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(base))
    assert left == [], "a container's cgroup was left behind"


def test_cgroup_task_reports_the_cgroups_totals(
    tmp_path: Path, cgroups_env: dict[str, str]
) -> None:
    # The work is done by an orphan the task's process never waits for: its rusage misses it,
    # the task's cgroup does not.
    work = f"import os\n{BURN}{TOUCH}open('done', 'w').close()\n"
    (tmp_path / "work.py").write_text(work)
    orphan = (
        f"({sys.executable} {tmp_path / 'work.py'} &); while [ ! -e done ]; do sleep 0.02; done"
    )

    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        status = await _terminal(agent, "orphan", orphan)
        assert status.state is TaskState.FINISHED, status.message
        assert status.cpu_seconds is not None and status.cpu_seconds >= 0.15
        assert status.max_rss_bytes is not None and status.max_rss_bytes >= 50 * MIB

    _run(tmp_path, body, cgroups_env)


def test_a_memory_limit_kill_reports_the_peak(tmp_path: Path, cgroups_env: dict[str, str]) -> None:
    hog = _python("b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n")

    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        limited = Resources.parse("cpus:0.5;mem:96")
        await agent.send_launch(task("hog", hog, resources=limited))
        status = await agent.wait_terminal("hog", timeout=30)
        assert status.state is TaskState.FAILED
        assert status.reason is Reason.CONTAINER_LIMITATION_MEMORY
        assert status.max_rss_bytes is not None and status.max_rss_bytes >= 64 * MIB
        assert status.max_rss_bytes <= 100 * MIB
        assert status.cpu_seconds is not None and status.cpu_seconds > 0

    _run(tmp_path, body, cgroups_env)
