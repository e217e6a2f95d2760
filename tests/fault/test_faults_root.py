"""Agora under faults, as root on a network rig (deploy/rig.py): 3 masters running the election,
4 agents on 2 hosts and 2 workload frameworks, while a seeded nemesis kills, pauses, isolates and
partitions the leader or drops packets on its links. After healing, the workloads must finish,
a leader must exist, and the histories of every process must satisfy I1-I8
(tests/support/history_checker.py). See tests/fault/README.md to run one scenario by hand."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from agora.sdk.history import History
from fault.fault_cluster import AGENT_HOSTS, FRAMEWORK_HOST, MASTER_HOSTS, FaultCluster
from fault.nemesis import Nemesis, Step, plan
from support.history_checker import check, load
from support.polling import wait_for

LIVENESS_S = 8.0
#: The workloads keep launching this long after the nemesis' last step has settled.
WORKLOAD_TAIL_S = 4.0
WORKLOADS = ("fw1", "fw2")


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

    def plan(self) -> list[Step]:
        return plan(self.seed, self.kinds, steps=self.steps, duration=(3.0, 4.0), heal=(5.0, 5.0))


SCENARIOS = {
    "kill-restart-twice": Scenario(("kill",), seed=1, steps=2),
    "pause-leader": Scenario(("pause",), seed=1, steps=1),
    "isolate-leader": Scenario(("isolate",), seed=1, steps=1),
    "split-minority-majority": Scenario(("split",), seed=2, steps=2),
    "bridge": Scenario(("bridge",), seed=2, steps=2),
    "loss-master-links": Scenario(("loss",), seed=1, steps=1),
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FaultCluster]:
    rig = rigmod.Rig.create(
        len(MASTER_HOSTS) + len(AGENT_HOSTS) + 1, name=f"f{uuid.uuid4().hex[:8]}"
    )
    try:
        fc = FaultCluster(rig, tmp_path)
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
        fc.start_workload(fw, seconds=faults_s + WORKLOAD_TAIL_S + 5, seed=scenario.seed + k)
    wait_for(lambda: _started(fc, "offer", list(WORKLOADS)), 15, "both workloads to get offers")

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
    try:
        applied = nemesis.run(steps)
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
    assert codes == dict.fromkeys(WORKLOADS, 0), f"workload exit codes {codes}: {summaries}"
    assert leader is not None, "no master says it leads after healing"
    assert leader[0] in fc.endpoints
    launched = sum(1 for e in events if e["kind"] == "launch")
    assert launched > 0, "no task was launched"
