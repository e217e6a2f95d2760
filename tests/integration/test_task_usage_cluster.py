"""A task's final CPU time and peak memory reach its framework: the executor puts them on the
terminal update and the agent and the master pass it on unchanged (a real local cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, FrameworkInfo, TaskSpec, TaskState
from support.cluster import LocalCluster
from support.recorder import Recorder

pytestmark = pytest.mark.timeout(90)

MIB = 1 << 20
WORK = (
    "import time\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.3: pass\n"
    "b = bytearray(64 << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
)


def test_the_framework_gets_the_tasks_usage_on_its_terminal_update(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", agents=1, agent_args=("--isolation", "posix"))
    rec = Recorder(todo=[TaskSpec("work", [sys.executable, "-c", WORK], "cpus:0.5;mem:256")])
    with cluster:
        driver = BlockingSchedulerDriver(rec, FrameworkInfo(name="usage"), cluster.endpoint)
        driver.start(timeout=20)
        with driver:
            finished = rec.wait_state("work", TaskState.FINISHED, timeout=30)
    assert finished.cpu_seconds is not None and finished.cpu_seconds >= 0.15
    assert finished.max_rss_bytes is not None and finished.max_rss_bytes >= 50 * MIB
    running = [s for s in rec.statuses if s.state is TaskState.RUNNING]
    assert running and all(s.cpu_seconds is None and s.max_rss_bytes is None for s in running)
