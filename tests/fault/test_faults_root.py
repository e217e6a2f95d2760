"""Agora under faults, as root on a network rig (deploy/rig.py): 3 masters running the election,
4 agents on 2 hosts and 2 workload frameworks, while a seeded nemesis kills, pauses, isolates and
partitions the leader, kills the whole group, or drops packets on its links. After healing, the
workloads must finish, a leader must exist, and the histories of every process must satisfy I1-I8
and K1 (every kill answered; tests/support/history_checker.py). Some scenarios also run a
framework with the default failover timeout (0) and `agora run` through leader kills, and kill
tasks with a TERM trap during a failover: the trap's clean-up must complete. Every link runs
CURVE with keys made for the run (AGORA_FAULT_INSECURE=1: every process runs --insecure). See
tests/fault/README.md to run one scenario by hand."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from agora.sdk.daemon.history import History
from fault.fault_cluster import AGENT_HOSTS, AGENTS, FRAMEWORK_HOST, MASTER_HOSTS, FaultCluster
from fault.nemesis import Nemesis, Step, plan
from support.history_checker import check, load
from support.polling import wait_for

LIVENESS_S = 8.0
#: The workloads keep launching this long after the nemesis' last step has settled.
WORKLOAD_TAIL_S = 4.0
WORKLOADS = ("fw1", "fw2")
#: Set to 1 to run the suite without CURVE (every process --insecure), to compare.
INSECURE = os.environ.get("AGORA_FAULT_INSECURE", "") == "1"


def _load_rig() -> ModuleType:
    deploy = str(Path(__file__).resolve().parents[2] / "deploy")
    if deploy not in sys.path:
        sys.path.insert(0, deploy)
    return importlib.import_module("rig")


rigmod = _load_rig()
_MISSING = rigmod.missing_tools()
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"needs root and the rig's tools: {', '.join(_MISSING)}"
)


@dataclass(frozen=True)
class Scenario:
    kinds: tuple[str, ...]
    seed: int
    steps: int
    #: fw2's failover timeout (None: the workload's 300 s; 0: the SDK's default).
    fw2_failover: float | None = None
    #: fw1 runs this many tasks with a TERM trap and kills them as the first fault takes hold.
    traps: int = 0
    #: `agora run` (failover timeout 0) runs one long task through the faults.
    agora_run: bool = False

    def plan(self) -> list[Step]:
        return plan(self.seed, self.kinds, steps=self.steps, duration=(3.0, 4.0), heal=(5.0, 5.0))


SCENARIOS = {
    "kill-restart-twice": Scenario(("kill",), seed=1, steps=2),
    "pause-leader": Scenario(("pause",), seed=1, steps=1),
    "isolate-leader": Scenario(("isolate",), seed=1, steps=1),
    "split-minority-majority": Scenario(("split",), seed=2, steps=2),
    "bridge": Scenario(("bridge",), seed=2, steps=2),
    "loss-master-links": Scenario(("loss",), seed=1, steps=1),
    "kill-default-timeout": Scenario(
        ("kill",), seed=3, steps=2, fw2_failover=0.0, traps=2, agora_run=True
    ),
    "restart-whole-group": Scenario(
        ("killall",), seed=1, steps=1, fw2_failover=0.0, agora_run=True
    ),
}
#: What `agora run` runs through the faults; it must print both lines and exit 0.
RUN_COMMAND = ("sh", "-c", "echo started; sleep 10; echo survived")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FaultCluster]:
    rig = rigmod.Rig.create(
        len(MASTER_HOSTS) + len(AGENT_HOSTS) + 1, name=f"f{uuid.uuid4().hex[:8]}"
    )
    try:
        fc = FaultCluster(rig, tmp_path, curve=not INSECURE)
        try:
            yield fc
        finally:
            fc.stop()
    finally:
        rig.down()


def _started(fc: FaultCluster, kind: str, names: list[str]) -> bool:
    for name in names:
        path = fc.history(name)
        if not path.exists() or f'"kind":"{kind}"' not in path.read_text(encoding="utf-8"):
            return False
    return True


def _received(fc: FaultCluster, fw: str) -> list[dict[str, object]]:
    path = fc.history(fw)
    if not path.exists():
        return []
    return [e for e in load([path]) if e["kind"] == "received"]


def _running(fc: FaultCluster, fw: str, tasks: list[str]) -> bool:
    running = {e["task"] for e in _received(fc, fw) if e["state"] == "RUNNING"}
    return set(tasks) <= running


def _last_state(events: list[dict[str, object]], node: str, task: str) -> object:
    states = [
        e["state"]
        for e in events
        if e["kind"] == "received" and e["node"] == node and e["task"] == task
    ]
    return states[-1] if states else None


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_faults_keep_invariants(name: str, cluster: FaultCluster) -> None:
    scenario = SCENARIOS[name]
    steps = scenario.plan()
    fc = cluster
    fc.start()
    wait_for(lambda: fc.leader() is not None, 15, "a first leader")
    agents = [f"agent-{h}-{k}" for h in AGENT_HOSTS for k in range(2)]
    wait_for(lambda: _started(fc, "total", agents), 15, "every agent to register")
    faults_s = sum(s.duration + s.heal for s in steps)
    for k, fw in enumerate(WORKLOADS):
        fc.start_workload(
            fw,
            seconds=faults_s + WORKLOAD_TAIL_S + 5,
            seed=scenario.seed + k,
            failover_timeout=scenario.fw2_failover if fw == "fw2" else None,
            trap_tasks=scenario.traps if fw == "fw1" else 0,
        )
    wait_for(lambda: _started(fc, "offer", list(WORKLOADS)), 15, "both workloads to get offers")
    traps = [f"fw1-trap-{k}" for k in range(scenario.traps)]
    if traps:
        wait_for(lambda: _running(fc, "fw1", traps), 15, "fw1's trap tasks RUNNING")
    if scenario.agora_run:
        fc.start_run("run", *RUN_COMMAND)
        wait_for(lambda: "started" in fc.logs("run"), 30, "agora run's task to start")

    nemesis_history = History(fc.history("nemesis"), "nemesis")
    nemesis = Nemesis(
        fc,
        fc.rig,
        nemesis_history,
        masters=len(MASTER_HOSTS),
        master_hosts=MASTER_HOSTS,
        others=[*AGENT_HOSTS, FRAMEWORK_HOST],
        stop=threading.Event(),
    )
    # The trap tasks are killed as the first fault takes hold (the kills are sent again until
    # answered): their clean-up must complete in the grace period all the same.
    trigger = (lambda _applied: fc.kill_trigger.touch()) if traps else None
    try:
        applied = nemesis.run(steps, after_apply=trigger)
    finally:
        nemesis_history.close()
    assert [a.step for a in applied] == steps

    codes = fc.wait_workloads(timeout=WORKLOAD_TAIL_S + 5 + 20 + 15)
    leader = fc.probe_leader(timeout=5.0)
    fc.stop()

    events = load(fc.history_files())
    violations = check(events, liveness_s=LIVENESS_S)
    report = "\n".join(f"{v.invariant}: {v.message}" for v in violations)
    summaries = {fw: fc.logs(fw, tail=1) for fw in WORKLOADS}
    print(f"scenario {name} seed {scenario.seed}: histories in {fc.root / 'history'}")
    print("faults:", json.dumps([a.what for a in applied]))
    print("workloads:", json.dumps(summaries, indent=1))
    assert not violations, f"{len(violations)} violations in {name}:\n{report}"
    expected = [*WORKLOADS, "run"] if scenario.agora_run else list(WORKLOADS)
    assert codes == dict.fromkeys(expected, 0), f"exit codes {codes}: {summaries}"
    if scenario.agora_run:
        assert "survived" in fc.logs("run"), fc.logs("run")
    for task in traps:
        assert _last_state(events, "fw1", task) == "KILLED", f"{task}: {summaries['fw1']}"
        assert (fc.markers / f"{task}.cleaned").exists(), f"{task}'s TERM trap did not finish"
    assert leader is not None, "no master says it leads after healing"
    assert leader[0] in fc.endpoints
    launched = sum(1 for e in events if e["kind"] == "launch")
    assert launched > 0, "no task was launched"


def test_restarted_agents_readopt_their_executors(cluster: FaultCluster) -> None:
    """Every agent is restarted (SIGTERM, then started again on its work dir) while fw1's trap
    tasks and its short tasks run: each re-registers with its own key, re-adopts the executors
    still running, and a kill sent afterwards reaches the trap tasks through them."""
    fc = cluster
    fc.start()
    wait_for(lambda: fc.leader() is not None, 15, "a first leader")
    agents = [name for _, name in AGENTS]
    wait_for(lambda: _started(fc, "total", agents), 15, "every agent to register")
    fc.start_workload("fw1", seconds=15, seed=5, trap_tasks=4)
    traps = [f"fw1-trap-{k}" for k in range(4)]
    wait_for(lambda: _running(fc, "fw1", traps), 15, "fw1's trap tasks RUNNING")
    hosts = {str(e["agent"]) for e in _received(fc, "fw1") if e["task"] in traps}
    for k in range(len(AGENTS)):
        fc.restart_agent(k)
    wait_for(lambda: len(fc.recoveries()) == len(AGENTS), 20, "every agent to recover")
    adopted = fc.recoveries()
    assert all(adopted[agent] >= 1 for agent in hosts), f"traps on {hosts}, adopted {adopted}"
    fc.kill_trigger.touch()  # the kills reach the trap tasks through the adopted executors
    codes = fc.wait_workloads(timeout=15 + 20 + 15)
    fc.stop()

    events = load(fc.history_files())
    violations = check(events, liveness_s=LIVENESS_S)
    summary = fc.logs("fw1", tail=1)
    assert not violations, "\n".join(f"{v.invariant}: {v.message}" for v in violations)
    assert codes == {"fw1": 0}, summary
    for task in traps:
        assert _last_state(events, "fw1", task) == "KILLED", f"{task}: {summary}"
        assert (fc.markers / f"{task}.cleaned").exists(), f"{task}'s TERM trap did not finish"
