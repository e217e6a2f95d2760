"""Frameworks with the default failover timeout (0) keep their tasks when the leader dies.

`agora run` and the quickstart framework both subscribe with ``failover_timeout`` 0. A leader
SIGKILL under `agora local --masters 3` must not remove them: the new leader gives every framework
a re-subscription window, so each re-subscribes and its running tasks finish as if nothing happened,
even when the schedulers come back only after the new leader has been active for a while.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.test_cli import Local, _kill_everything, start_local
from integration.test_cli_ha import _master_pid, _state
from support.polling import wait_for

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-failover"), masters=3)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def _running(local: Local) -> set[str]:
    return {t["task_id"] for t in local.tasks() if t["state"] == "RUNNING"}


def _sandbox(local: Local, task_prefix: str) -> Path | None:
    found = sorted(local.work.glob(f"agent-*/frameworks/*/executors/*/tasks/{task_prefix}*"))
    return found[0] if found else None


def test_agora_run_and_quickstart_survive_a_leader_sigkill(ha: Local) -> None:
    # The task prints "during" once the leader is dead (the test then drops `go` in its
    # sandbox): that chunk of output is lost on the way, as no master relays it, and agora run
    # reads it back from the sandbox at the end.
    script = "until [ -e go ]; do sleep 0.05; done; echo during; sleep 8; echo survived"
    run = ha.spawn("run", "--name", "survivor", "--", "sh", "-c", script)
    quick = subprocess.Popen(
        [sys.executable, str(QUICKSTART), "3", "sleep 10; echo ok"],
        env=ha.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: len(_running(ha)) >= 4,
            timeout=30,
            what="agora run's task and the quickstart's 3 tasks RUNNING",
        )
        before = _state(ha)["master_info"]
        # Both schedulers are held still across the failover, as a loaded machine might: the new
        # leader is active and ticking for a while before either can re-subscribe.
        for proc in (run, quick):
            os.killpg(proc.pid, signal.SIGSTOP)
        sandbox = _sandbox(ha, "survivor-")
        assert sandbox is not None, "agora run's task has no sandbox"
        os.kill(_master_pid(ha, before["master_id"]), signal.SIGKILL)
        (sandbox / "go").touch()
        wait_for(
            lambda: (
                (s := _state(ha))["master_info"]["epoch"] > before["epoch"]
                and [a["status"] for a in s["agents"]] == ["ACTIVE", "ACTIVE"]
            ),
            timeout=30,
            what="a new leader with both agents back",
        )
        for proc in (run, quick):
            os.killpg(proc.pid, signal.SIGCONT)

        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, f"agora run exited {run.returncode}: {err}"
        assert out.splitlines() == ["during", "survived"], out
        out, err = quick.communicate(timeout=60)
        assert quick.returncode == 0, f"quickstart exited {quick.returncode}: {out}{err}"
        # Each task ran once, to the end: none was killed by the failover and retried.
        finished = sorted(line.split(":")[0] for line in out.splitlines() if "FINISHED" in line)
        assert finished == ["task-0-1", "task-1-1", "task-2-1"], out
        after = _state(ha)["master_info"]
        assert after["epoch"] > before["epoch"]
    finally:
        for proc in (run, quick):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=10)
