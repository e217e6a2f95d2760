"""Task rules of the master core: status updates, acknowledgements, reconciliation, kills."""

from __future__ import annotations

from agora.sdk.ids import AgentID, TaskID
from agora.sdk.messages import (
    Kill,
    KillTask,
    Reason,
    Reconcile,
    ReconcileTask,
    RunTask,
    StatusSource,
    StatusUpdateAck,
    TaskState,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, updates_in


def _running_task(partition_aware: bool = False) -> tuple[Harness, AgentID, str]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", partition_aware=partition_aware)
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:4;mem:4096", agent)], refuse_seconds=0)
    assert len(of_type(sent_to(out, "a1"), RunTask)) == 1
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    h.ack("s1", fw, agent, "t1", uuid)
    return h, agent, fw


def test_status_update_forwarded_with_uuid_and_ack_reaches_agent() -> None:
    h, agent, fw = _running_task()
    out, uuid = h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    status = only(updates_in(out, "s1"))
    assert status.state is TaskState.FINISHED and status.uuid == uuid and status.agent_id == agent
    acks = of_type(sent_to(h.ack("s1", fw, agent, "t1", uuid), "a1"), StatusUpdateAck)
    assert [(a.task_id, a.uuid) for a in acks] == [(TaskID("t1"), uuid)]


def test_terminal_state_releases_resources_before_its_update_is_acknowledged() -> None:
    h, _agent, fw = _running_task()
    h.subscribe("s2")
    out, _uuid = h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    # Freed at once: the other framework is offered the whole agent before any ACK.
    offers = offers_in(out, "s2") + offers_in(out, "s1")
    assert [o.resources for o in offers] == [Resources.parse("cpus:4;mem:4096")]
    # And reconciliation reports the unacknowledged terminal state.
    rec = h.handle("s1", Reconcile(framework_id=fw, tasks=(ReconcileTask(task_id=TaskID("t1")),)))
    status = only(updates_in(rec, "s1"))
    assert (status.state, status.reason, status.uuid) == (
        TaskState.FINISHED,
        Reason.RECONCILIATION,
        None,
    )


def test_latest_state_frees_resources_while_an_earlier_update_is_unacknowledged() -> None:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:4;mem:4096", agent)], refuse_seconds=0)
    h.agent_update("a1", fw, "t1", TaskState.RUNNING, latest=TaskState.FAILED)
    assert h.unclaimed(agent) == Resources.parse("cpus:4;mem:4096")


def test_reconcile_unknown_task_is_lost() -> None:
    h, agent, fw = _running_task()
    out = h.handle(
        "s1",
        Reconcile(framework_id=fw, tasks=(ReconcileTask(task_id=TaskID("nope"), agent_id=agent),)),
    )
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason, status.source) == (
        TaskState.LOST,
        Reason.RECONCILIATION,
        StatusSource.MASTER,
    )


def test_reconcile_unknown_task_is_gone_when_partition_aware() -> None:
    h, agent, fw = _running_task(partition_aware=True)
    out = h.handle(
        "s1",
        Reconcile(framework_id=fw, tasks=(ReconcileTask(task_id=TaskID("nope"), agent_id=agent),)),
    )
    assert only(updates_in(out, "s1")).state is TaskState.GONE


def test_reconcile_task_on_unknown_agent_is_unknown_when_partition_aware() -> None:
    h, _agent, fw = _running_task(partition_aware=True)
    item = ReconcileTask(task_id=TaskID("t9"), agent_id=AgentID("no-such-agent"))
    out = h.handle("s1", Reconcile(framework_id=fw, tasks=(item,)))
    assert only(updates_in(out, "s1")).state is TaskState.UNKNOWN


def test_reconcile_task_on_an_agent_expected_back_after_a_failover_gets_no_answer() -> None:
    """As Mesos does: until an agent the registry admitted re-registers with the new master (or
    is given up), a question about its tasks is not answered: UNKNOWN then, and FINISHED once
    the agent reports, would be two stories. Found by the simulation's soak."""
    from agora.master.core import Master, MasterConfig
    from agora.master.registry import AdmitAgent, AgentEntry, Registry

    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("back"), hostname="h")))
    h = Harness()
    h.master = Master(MasterConfig(epoch=2), registry=registry)
    fw = h.subscribe("s1", partition_aware=True)
    item = ReconcileTask(task_id=TaskID("t9"), agent_id=AgentID("back"))
    assert updates_in(h.handle("s1", Reconcile(framework_id=fw, tasks=(item,))), "s1") == []
    other = ReconcileTask(task_id=TaskID("t9"), agent_id=AgentID("no-such-agent"))
    out = h.handle("s1", Reconcile(framework_id=fw, tasks=(other,)))
    assert only(updates_in(out, "s1")).state is TaskState.UNKNOWN


def test_reconcile_task_on_unknown_agent_is_lost_when_not_partition_aware() -> None:
    h, _agent, fw = _running_task()
    item = ReconcileTask(task_id=TaskID("t9"), agent_id=AgentID("no-such-agent"))
    out = h.handle("s1", Reconcile(framework_id=fw, tasks=(item,)))
    assert only(updates_in(out, "s1")).state is TaskState.LOST


def test_reconcile_empty_list_returns_latest_state_of_every_task() -> None:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent), ("t2", "cpus:1;mem:128", agent)])
    h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    out = h.handle("s1", Reconcile(framework_id=fw))
    states = {s.task_id: s.state for s in updates_in(out, "s1")}
    assert states == {TaskID("t1"): TaskState.RUNNING, TaskID("t2"): TaskState.STAGING}
    assert all(s.uuid is None and s.reason is Reason.RECONCILIATION for s in updates_in(out, "s1"))


def test_acknowledged_terminal_task_leaves_implicit_reconciliation() -> None:
    h, agent, fw = _running_task()
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    h.ack("s1", fw, agent, "t1", uuid)
    assert updates_in(h.handle("s1", Reconcile(framework_id=fw)), "s1") == []


def test_kill_is_forwarded_to_the_agent() -> None:
    h, agent, fw = _running_task()
    out = h.handle("s1", Kill(framework_id=fw, task_id=TaskID("t1"), agent_id=agent))
    kill = only(of_type(sent_to(out, "a1"), KillTask))
    assert kill.task_id == "t1"
    assert kill.partition_aware is False


def test_kill_tells_the_agent_the_framework_is_partition_aware() -> None:
    """So that an agent that never got the task answers DROPPED, not LOST."""
    h, agent, fw = _running_task(partition_aware=True)
    out = h.handle("s1", Kill(framework_id=fw, task_id=TaskID("t1"), agent_id=agent))
    assert only(of_type(sent_to(out, "a1"), KillTask)).partition_aware is True


def test_kill_of_unknown_task_answers_like_reconciliation() -> None:
    h, agent, fw = _running_task()
    out = h.handle("s1", Kill(framework_id=fw, task_id=TaskID("ghost"), agent_id=agent))
    assert of_type(sent_to(out, "a1"), KillTask) == []
    assert only(updates_in(out, "s1")).state is TaskState.LOST


def test_invalid_task_gets_task_error_and_resources_return() -> None:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("big", "cpus:8;mem:128", agent)], refuse_seconds=0)
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (TaskState.ERROR, Reason.TASK_INVALID)
    assert "exceed" in status.message
    assert of_type(sent_to(out, "a1"), RunTask) == []
    assert h.unclaimed(agent) == Resources.parse("cpus:4;mem:4096")


def test_duplicate_task_id_is_refused() -> None:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch(
        "s1", fw, [offer], [("t1", "cpus:1;mem:128", agent), ("t1", "cpus:1;mem:128", agent)]
    )
    assert len(of_type(sent_to(out, "a1"), RunTask)) == 1
    assert only(updates_in(out, "s1")).state is TaskState.ERROR
