"""`agora logs` of a task whose sandbox the agent's garbage collection deleted: one clear line,
exit 1. A real `agora local` cluster whose agent collects after 1 s (AGORA_GC_DELAY)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.polling import wait_for
from test_cli import Local, _kill_everything, start_local

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    env = {"AGORA_GC_DELAY": "1", "AGORA_DISK_WATERMARK_INTERVAL": "0.2"}
    cluster = start_local(tmp_path_factory.mktemp("agora-logs-gc"), agents=1, extra_env=env)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def test_logs_of_a_collected_task_says_so(local: Local) -> None:
    done = local.agora("run", "--task-id", "gc-1", "--", "echo", "collected soon")
    assert done.returncode == 0, done.stderr

    def collected() -> bool:
        records = list(local.work.glob("*/sandbox-gc/collected"))
        return bool(records) and "\tgc-1\n" in records[0].read_text()

    wait_for(collected, timeout=30, what="the task's sandbox to be collected")
    assert not list(local.work.glob("*/frameworks/*/executors/*/tasks/gc-1"))
    out = local.agora("logs", "gc-1")
    assert out.returncode == 1, out
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "gc-1" in lines[0] and "garbage-collected" in lines[0], lines[0]
