"""The issue's agent-durability rule on a real cluster: an agent SIGKILLed with 20 running tasks
and started again keeps all 20 RUNNING under the same agent id, none killed, and the framework
sees no update lost and none duplicated without its uuid; with ``--recover=cleanup`` the restarted
agent kills them, with a reason."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, FrameworkInfo, TaskSpec, TaskState
from agora.sdk.messages import Reason
from support.cluster import LocalCluster
from support.polling import wait_for
from support.recorder import Recorder

pytestmark = pytest.mark.timeout(120)

TASKS = 20
SMALL = "cpus:0.1;mem:16"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c", agents=1) as c:
        yield c


def _start_twenty(cluster: LocalCluster) -> tuple[Recorder, BlockingSchedulerDriver, str]:
    rec = Recorder(todo=[TaskSpec(f"t{i}", "sleep 600", SMALL) for i in range(TASKS)])
    driver = BlockingSchedulerDriver(rec, FrameworkInfo(name="restart"), cluster.endpoint)
    driver.start(timeout=20)
    for i in range(TASKS):
        rec.wait_state(f"t{i}", TaskState.RUNNING, timeout=30)
    (agent_id,) = cluster.active_agents()
    return rec, driver, agent_id


def _restart_agent(cluster: LocalCluster, *extra: str) -> None:
    proc = cluster.agent_procs[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    cluster.agent_args = (*cluster.agent_args, *extra)
    cluster.start_agent(0)


def _updates_are_clean(rec: Recorder) -> None:
    """Per task: never a second update of one state unless it repeats the same uuid."""
    with rec.lock:
        statuses = list(rec.statuses)
    by_key = Counter((s.task_id, s.state) for s in statuses)
    uuids: dict[tuple[str, TaskState], set[bytes | None]] = {}
    for s in statuses:
        uuids.setdefault((s.task_id, s.state), set()).add(s.uuid)
    for key, count in by_key.items():
        assert count == 1 or len(uuids[key]) == 1, f"{key} came {count} times with other uuids"


def test_a_restarted_agent_keeps_its_twenty_tasks_running(cluster: LocalCluster) -> None:
    rec, driver, agent_id = _start_twenty(cluster)
    with driver:
        _restart_agent(cluster)
        wait_for(lambda: "agent_recovered" in cluster.log("agent-0"), 30, "the agent to recover")
        wait_for(lambda: cluster.active_agents() == [agent_id], 30, "re-registration")
        state = cluster.state()
        running = {t.task_id for t in state.tasks if t.state is TaskState.RUNNING}
        assert running == {f"t{i}" for i in range(TASKS)}
        assert all(t.agent_id == agent_id for t in state.tasks)
        for i in range(TASKS):
            assert set(rec.states(f"t{i}")) == {TaskState.RUNNING}, rec.states(f"t{i}")
        # The executor re-attached: killing a task goes through it and reports back.
        driver.kill("t0")
        killed = rec.wait_state("t0", TaskState.KILLED, timeout=30)
        assert killed.agent_id == agent_id
        _updates_are_clean(rec)


def test_recover_cleanup_kills_the_twenty_with_a_reason(cluster: LocalCluster) -> None:
    rec, driver, agent_id = _start_twenty(cluster)
    with driver:
        _restart_agent(cluster, "--recover", "cleanup")
        for i in range(TASKS):
            status = rec.wait_state(f"t{i}", TaskState.FAILED, timeout=30)
            assert status.reason is Reason.AGENT_RESTARTED
        assert cluster.active_agents() == [agent_id]
        _updates_are_clean(rec)


def test_an_executor_forked_by_the_zygote_is_adopted_after_a_restart(
    cluster: LocalCluster,
) -> None:
    # The first built-in executor is started by exec and warms the zygote; the next is forked.
    warm = Recorder(todo=[TaskSpec("w", "true", SMALL)])
    with BlockingSchedulerDriver(warm, FrameworkInfo(name="warm"), cluster.endpoint) as first:
        first.start(timeout=20)
        warm.wait_state("w", TaskState.FINISHED, timeout=30)
    rec = Recorder(todo=[TaskSpec(f"t{i}", "sleep 600", SMALL) for i in range(2)])
    with BlockingSchedulerDriver(rec, FrameworkInfo(name="forked"), cluster.endpoint) as driver:
        driver.start(timeout=20)
        for i in range(2):
            rec.wait_state(f"t{i}", TaskState.RUNNING, timeout=30)
        assert "started_by=zygote" in cluster.log("agent-0")
        _restart_agent(cluster)
        wait_for(lambda: "agent_recovered" in cluster.log("agent-0"), 30, "the agent to recover")
        (agent_id,) = cluster.active_agents()
        driver.kill("t0")  # through the re-attached executor, reported back
        assert rec.wait_state("t0", TaskState.KILLED, timeout=30).agent_id == agent_id
        assert set(rec.states("t1")) == {TaskState.RUNNING}
        _updates_are_clean(rec)
