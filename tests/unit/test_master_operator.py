"""Operator calls on the master core: the state snapshot, operator kills, and id validation."""

from __future__ import annotations

import msgpack
import msgspec
from agora.master.core import MasterConfig
from agora.sdk import codec
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    Error,
    ErrorCode,
    GetState,
    KillTask,
    OperatorDone,
    OperatorKill,
    Reason,
    RunTask,
    StateReply,
    TaskState,
    Teardown,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, updates_in


def _cluster_with_running_task() -> tuple[Harness, str, FrameworkID]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent)], refuse_seconds=0)
    assert only(of_type(sent_to(out, "a1"), RunTask)).role == "*"
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    h.ack("s1", fw, agent, "t1", uuid)
    return h, agent, fw


def _state(h: Harness) -> StateReply:
    return only(of_type(sent_to(h.handle("ops", GetState()), "ops"), StateReply))


def test_state_lists_agents_frameworks_and_tasks() -> None:
    h, agent, fw = _cluster_with_running_task()
    state = _state(h)
    assert [a.agent_id for a in state.agents] == [agent]
    assert state.agents[0].status == "ACTIVE"
    assert state.agents[0].resources == Resources.parse("cpus:4;mem:4096")
    # The running task holds 1 cpu; the rest went back to the allocator or is offered again.
    assert state.agents[0].allocated.scalar("cpus") >= 1.0
    assert [(f.framework_id, f.active, f.connected) for f in state.frameworks] == [(fw, True, True)]
    assert [(t.task_id, t.state, t.agent_id) for t in state.tasks] == [
        (TaskID("t1"), TaskState.RUNNING, agent)
    ]


def test_finished_tasks_of_a_torn_down_framework_stay_visible() -> None:
    h, agent, fw = _cluster_with_running_task()
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    h.ack("s1", fw, agent, "t1", uuid)
    h.handle("s1", Teardown(framework_id=fw))
    state = _state(h)
    assert [(f.framework_id, f.active) for f in state.frameworks] == [(fw, False)]
    assert [(t.task_id, t.state) for t in state.tasks] == [(TaskID("t1"), TaskState.FINISHED)]


def test_teardown_records_live_tasks_as_killed() -> None:
    h, _agent, fw = _cluster_with_running_task()
    out = h.handle("s1", Teardown(framework_id=fw))
    assert of_type(sent_to(out, "a1"), KillTask)
    task = only(_state(h).tasks)
    assert (task.state, task.reason) == (TaskState.KILLED, Reason.FRAMEWORK_REMOVED)


def test_completed_frameworks_are_bounded() -> None:
    h = Harness()
    for i in range(60):
        fw = h.subscribe(f"s{i}")
        h.handle(f"s{i}", Teardown(framework_id=fw))
    assert len(_state(h).frameworks) == h.config.max_completed_frameworks


def test_operator_kill_reaches_the_agent() -> None:
    h, _agent, fw = _cluster_with_running_task()
    out = h.handle("ops", OperatorKill(task_id=TaskID("t1")))
    kill = only(of_type(sent_to(out, "a1"), KillTask))
    assert (kill.framework_id, kill.task_id) == (fw, TaskID("t1"))
    done = only(of_type(sent_to(out, "ops"), OperatorDone))
    assert done.call == "OPERATOR_KILL"


def test_operator_kill_of_unknown_task_is_an_error_and_changes_nothing() -> None:
    h, _agent, _fw = _cluster_with_running_task()
    before = _state(h)
    out = h.handle("ops", OperatorKill(task_id=TaskID("nope")))
    error = only(of_type(sent_to(out, "ops"), Error))
    assert error.code is ErrorCode.UNKNOWN_TASK and "nope" in error.message
    assert not sent_to(out, "a1")
    assert _state(h) == before


def test_task_ids_that_cannot_name_a_directory_are_refused() -> None:
    for bad in ("a/b", "..", "x y", "tab\there"):
        h = Harness()
        agent = h.register_agent("a1")
        fw = h.subscribe("s1")
        offer = only(offers_in(h.tick(), "s1"))
        out = h.launch("s1", fw, [offer], [(bad, "cpus:1", agent)])
        assert not of_type(sent_to(out, "a1"), RunTask), bad
        status = only(updates_in(out, "s1"))
        assert status.state in (TaskState.ERROR, TaskState.LOST, TaskState.DROPPED)
        assert "task id" in status.message


def test_a_scheduler_taking_over_from_a_new_connection_counts_as_a_failover() -> None:
    h = Harness()
    fw = h.subscribe("s1", failover_timeout=60.0)
    h.subscribe("s1", failover_timeout=60.0, framework_id=fw)  # the same connection again
    assert [f.failovers for f in _state(h).frameworks] == [0]
    h.subscribe("s1-restarted", failover_timeout=60.0, framework_id=fw)
    assert [f.failovers for f in _state(h).frameworks] == [1]


def test_the_state_says_whether_the_master_runs_without_curve() -> None:
    assert not _state(Harness()).insecure
    insecure = _state(Harness(MasterConfig(insecure=True)))
    assert insecure.insecure  # (the harness sends it through the codec both ways)
    # A STATE from a master older than the field decodes, as a secure one.
    name, version, epoch, body = msgpack.unpackb(codec.encode(insecure), use_list=False)
    del body["insecure"]
    older = msgpack.packb((name, version, epoch, body), use_bin_type=True)
    assert codec.decode(older).message == msgspec.structs.replace(insecure, insecure=False)
