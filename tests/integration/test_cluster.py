"""A real cluster (master and agents as processes on 127.0.0.1) driven by SDK frameworks.

These are the issue's end-to-end rules: tasks run and finish across agents, kills and grace
periods, a crashing executor, a SIGKILLed agent, and a framework failing over to a new process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.sdk import (
    BlockingSchedulerDriver,
    FrameworkInfo,
    TaskSpec,
    TaskState,
)
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import CommandInfo, ExecutorInfo, FrameworkCapability, Reason
from agora.sdk.resources import Resources
from support.cluster import LocalCluster
from support.polling import wait_for
from support.recorder import Recorder

ROOT = Path(__file__).resolve().parents[2]
SMALL = "cpus:0.1;mem:16"

#: Fast failure detection: the master pings agents every 0.3 s and gives up after 2 misses.
FAST_PINGS = ("--agent-ping-interval", "0.3", "--max-agent-ping-timeouts", "2")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", agents=2, master_args=FAST_PINGS) as c:
        yield c


def _driver(cluster: LocalCluster, scheduler: Recorder, **info: object) -> BlockingSchedulerDriver:
    framework = FrameworkInfo(name="it", **info)  # type: ignore[arg-type]
    driver = BlockingSchedulerDriver(scheduler, framework, cluster.endpoint)
    driver.start(timeout=20)
    return driver


def _executor_pids(cluster: LocalCluster) -> list[int]:
    return [
        int(p.read_text())
        for p in cluster.work_dir.glob("agent-*/frameworks/*/executors/*/executor.pid")
    ]


def test_two_hundred_tasks_over_two_agents_all_finish(cluster: LocalCluster) -> None:
    rec = Recorder(todo=[TaskSpec(f"t{i}", "true", SMALL) for i in range(200)])
    with _driver(cluster, rec):
        for i in range(200):
            rec.wait_state(f"t{i}", TaskState.FINISHED, timeout=60)
    with rec.lock:
        agents = {s.agent_id for s in rec.statuses if s.state is TaskState.RUNNING}
        finished = [s for s in rec.statuses if s.state is TaskState.FINISHED]
    assert len(agents) == 2, "both agents ran tasks"
    assert len(finished) == 200, "each task finished exactly once"
    assert all(s.exit_code == 0 for s in finished)
    assert {o.hostname for o in rec.offers_seen} == {"agent-0", "agent-1"}


def test_kill_ends_a_running_task_killed(cluster: LocalCluster) -> None:
    rec = Recorder(todo=[TaskSpec("sleeper", "sleep 60", SMALL)])
    with _driver(cluster, rec) as driver:
        rec.wait_state("sleeper", TaskState.RUNNING)
        driver.kill("sleeper")
        status = rec.wait_state("sleeper", TaskState.KILLED)
    assert status.source.name == "EXECUTOR"


def test_a_task_that_ignores_sigterm_is_killed_after_its_grace_period(
    cluster: LocalCluster,
) -> None:
    stubborn = "trap '' TERM; sleep 60"
    rec = Recorder(todo=[TaskSpec("stubborn", stubborn, SMALL, kill_grace_period=1.0)])
    with _driver(cluster, rec) as driver:
        rec.wait_state("stubborn", TaskState.RUNNING)
        time.sleep(0.2)  # let sh install its trap before the kill arrives
        asked = time.monotonic()
        driver.kill("stubborn")
        status = rec.wait_state("stubborn", TaskState.KILLED)
        took = time.monotonic() - asked
    assert status.exit_code == 128 + signal.SIGKILL
    assert "SIGKILLed: still running when its 1 s kill grace period ran out" in status.message
    assert 0.9 <= took < 8.0, f"SIGKILL came {took:.2f} s after the kill"


def test_executor_crash_fails_its_tasks_with_a_reason(cluster: LocalCluster) -> None:
    rec = Recorder(todo=[TaskSpec("victim", "sleep 60", SMALL)])
    with _driver(cluster, rec):
        rec.wait_state("victim", TaskState.RUNNING)
        (pid,) = _executor_pids(cluster)
        os.kill(pid, signal.SIGKILL)
        status = rec.wait_state("victim", TaskState.FAILED)
    assert status.reason is Reason.EXECUTOR_TERMINATED
    assert "Executor" in status.message


def test_killed_agent_loses_its_tasks_per_capability_and_its_offers(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", agents=1, master_args=FAST_PINGS) as cluster:
        plain = Recorder(todo=[TaskSpec("plain", "sleep 60", SMALL)], refuse_seconds=60)
        aware = Recorder(todo=[TaskSpec("aware", "sleep 60", SMALL)], hold_offers=True)
        with (
            _driver(cluster, plain),
            _driver(cluster, aware, capabilities=(FrameworkCapability.PARTITION_AWARE,)),
        ):
            plain.wait_state("plain", TaskState.RUNNING)
            aware.wait_state("aware", TaskState.RUNNING)
            wait_for(lambda: aware.held, what="the aware framework to hold an offer")
            cluster.agent_procs[0].send_signal(signal.SIGKILL)
            lost = plain.wait_state("plain", TaskState.LOST)
            unreachable = aware.wait_state("aware", TaskState.UNREACHABLE)
            held = {str(o.offer_id) for o in aware.held}
            wait_for(lambda: held <= set(aware.rescinded), what="held offers to be rescinded")
            assert aware.lost_agents and plain.lost_agents
    assert lost.reason is Reason.AGENT_REMOVED and unreachable.reason is Reason.AGENT_REMOVED
    assert lost.source.name == unreachable.source.name == "MASTER"
    assert unreachable.unreachable_time is not None


def test_framework_failover_keeps_tasks_and_gets_the_updates_sent_meanwhile(
    tmp_path: Path,
) -> None:
    agent_args = ("--status-update-retry", "0.2")
    cluster = LocalCluster(tmp_path / "c", agents=1, agent_args=agent_args)
    with cluster:
        first = Recorder(todo=[TaskSpec("nap", "sleep 1", SMALL)])
        driver = _driver(cluster, first, failover_timeout=60.0)
        framework_id = driver.framework_id
        first.wait_state("nap", TaskState.RUNNING)
        driver.stop(failover=True)  # the scheduler goes away; its framework must stay
        driver.join(timeout=10)
        # The task ends while no scheduler is connected.
        wait_for(
            lambda: (cluster.work_dir / "agent-0").exists() and _finished_on_master(cluster),
            what="the master to learn the task finished",
        )
        second = Recorder()
        with _driver(cluster, second, failover_timeout=60.0, framework_id=framework_id) as d2:
            assert d2.framework_id == framework_id
            status = second.wait_state("nap", TaskState.FINISHED, timeout=30)
        assert status.exit_code == 0
        assert first.states("nap") == [TaskState.RUNNING]


def _finished_on_master(cluster: LocalCluster) -> bool:
    return any(t.task_id == "nap" and t.state is TaskState.FINISHED for t in cluster.state().tasks)


def test_readme_framework_runs_as_written(cluster: LocalCluster, tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "framework-guide.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    example = (ROOT / "examples" / "quickstart.py").read_text()
    assert example in blocks, "the framework guide's quickstart must be examples/quickstart.py"
    assert len(example.splitlines()) <= 40
    script = tmp_path / "framework.py"
    script.write_text(example)
    # Every task fails its first attempt and succeeds on the second: retries are exercised.
    flaky = "case $AGORA_TASK_ID in *-1) exit 1;; esac"
    env = dict(os.environ, AGORA_MASTER=cluster.endpoint)
    done = subprocess.run(
        [sys.executable, str(script), "20", flaky],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if "FINISHED" in ln]
    assert len(lines) == 20
    # Every first attempt failed, so each task finished on a retry (the 2nd, or the 3rd when the
    # cluster lost an attempt under load).
    assert all(re.match(r"task-\d+-[23]: FINISHED", ln) for ln in lines), lines
    assert lines[-1].endswith("(20/20 done)")


CUSTOM_EXECUTOR = """
from agora.sdk.executor import Executor, run_executor
from agora.sdk.messages import StatusSource, TaskState, TaskStatus


class Echo(Executor):
    def launch_task(self, driver, task):
        self.task_id = task.task_id
        driver.send_status_update(
            TaskStatus(task_id=task.task_id, state=TaskState.RUNNING, source=StatusSource.EXECUTOR)
        )

    def framework_message(self, driver, data):
        driver.send_framework_message(b"echo:" + data)
        driver.send_status_update(
            TaskStatus(
                task_id=self.task_id,
                state=TaskState.FINISHED,
                source=StatusSource.EXECUTOR,
                data=data,
            )
        )


run_executor(Echo())
"""


def test_a_custom_sdk_executor_runs_a_task_and_talks_to_its_framework(
    cluster: LocalCluster,
) -> None:
    # The program comes inline: a contained executor has a private /tmp, so a script under the
    # test's tmp dir would not be there.
    executor = ExecutorInfo(
        executor_id=ExecutorID("echo"),
        framework_id=FrameworkID(""),
        command=CommandInfo(value=f"exec {sys.executable} - <<'EOF'\n{CUSTOM_EXECUTOR}\nEOF\n"),
        name="echo executor",
        # Its container's memory limit covers these and its task's: enough for a Python process.
        resources=Resources.parse("cpus:0.1;mem:128"),
    )
    rec = Recorder(todo=[TaskSpec("echoed", "", SMALL, executor=executor)])
    with _driver(cluster, rec) as driver:
        running = rec.wait_state("echoed", TaskState.RUNNING)
        assert running.agent_id is not None
        driver.message(running.agent_id, "echo", b"ping")
        done = rec.wait_state("echoed", TaskState.FINISHED)
        wait_for(lambda: b"echo:ping" in rec.messages, what="the executor's message")
    assert done.data == b"ping" and done.source.name == "EXECUTOR"
    sandbox = next(cluster.work_dir.glob("agent-*/frameworks/*/executors/echo"))
    assert (sandbox / "executor.pid").exists()
