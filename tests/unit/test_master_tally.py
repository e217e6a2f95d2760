"""The master's running task counts (``MasterState.tally``) move with every task, so the views
that report them need no walk over the tasks. The simulation checks them against a recount
after every step (``support.sim.invariants``); here, the paths in one place, and a guard that no
code changes a task's state around them."""

from __future__ import annotations

import re
from pathlib import Path

from agora.master.core import MasterConfig
from agora.sdk.messages import Offers, TaskState, Teardown
from support.master_kit import Harness, of_type, sent_to

CORE = Path(__file__).resolve().parents[2] / "master" / "core"


def test_no_code_sets_a_task_state_but_the_one_that_counts_it() -> None:
    assignment = re.compile(r"\btask\.state\s*=[^=]|\btask\.state\s*,[^)\]]*=")
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(CORE.glob("*.py"))
        if path.name != "state.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if assignment.search(line)
    ]
    assert offenders == [], "set task states with MasterState.set_task_state"


def test_counts_follow_a_task_from_launch_through_its_history_to_its_framework_removal() -> None:
    h = Harness(MasterConfig(max_completed_tasks_per_framework=2))
    agent = h.register_agent("a1")
    fid = h.subscribe("fw")
    st = h.master.state
    offers = [o for m in of_type(sent_to(h.tick(), "fw"), Offers) for o in m.offers]
    assert offers
    h.launch("fw", fid, offers, [(f"t{i}", "cpus:0.1;mem:8", agent) for i in range(4)])
    assert st.tally.by_state()["STAGING"] == 4 and st.tally.total() == 4
    h.agent_update("a1", fid, "t0", TaskState.RUNNING)
    for i in range(1, 4):  # three finish and are acknowledged: the history keeps two
        _, uuid = h.agent_update("a1", fid, f"t{i}", TaskState.FINISHED)
        h.ack("fw", fid, agent, f"t{i}", uuid)
    counts = st.tally.by_state()
    assert (counts["RUNNING"], counts["FINISHED"], counts["STAGING"]) == (1, 2, 0)
    assert (
        st.tally.total()
        == 3
        == len(st.tasks) + sum(len(f.completed) for f in st.frameworks.values())
    )
    assert h.master.view().counts().tasks["FINISHED"] == 2
    h.handle("fw", Teardown(framework_id=fid))  # t0 is killed; the framework's history stays
    counts = st.tally.by_state()
    assert (counts["RUNNING"], counts["KILLED"], counts["FINISHED"]) == (0, 1, 1)
    assert st.tally.total() == sum(len(f.completed) for f in st.completed_frameworks) == 2
