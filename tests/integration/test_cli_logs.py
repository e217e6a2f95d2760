"""`agora logs` against a real `agora local` cluster: a task's output read through its agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest
from support.polling import wait_for
from test_cli import Local, _kill_everything, start_local


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-logs"), agents=1)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def test_agents_report_their_http_api(local: Local) -> None:
    out = local.agora("agents", "--json")
    assert out.returncode == 0, out.stderr
    agents = json.loads(out.stdout)
    assert agents and all(a["http_port"] > 0 and a["address"] == "127.0.0.1" for a in agents)


def test_logs_prints_stdout_and_stderr(local: Local) -> None:
    done = local.agora("run", "--task-id", "logs-1", "--", "sh", "-c", "echo one; echo two >&2")
    assert done.returncode == 0, done.stderr
    out = local.agora("logs", "logs-1")
    assert (out.returncode, out.stdout) == (0, "one\n"), out.stderr
    err = local.agora("logs", "--stderr", "logs-1")
    assert (err.returncode, err.stdout) == (0, "two\n"), err.stderr


def test_logs_of_an_unknown_task_fails_in_one_line(local: Local) -> None:
    out = local.agora("logs", "no-such-task")
    assert out.returncode == 1
    assert "no-such-task" in out.stderr and "Traceback" not in out.stderr


def test_logs_follow_prints_until_the_task_ends(local: Local) -> None:
    script = "for i in 1 2 3; do echo line$i; sleep 0.3; done"
    run = local.spawn("run", "--task-id", "logs-follow", "--", "sh", "-c", script)
    follow: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: local.task("logs-follow") is not None, timeout=30)
        follow = local.spawn("logs", "--follow", "logs-follow")
        out, err = follow.communicate(timeout=60)
        assert follow.returncode == 0, err
        assert out == "line1\nline2\nline3\n", err
        run.communicate(timeout=60)
        assert run.returncode == 0
    finally:
        for proc in (run, follow):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
