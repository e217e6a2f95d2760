"""Framework rules of the master core: subscription, failover timeout, teardown, bad callers."""

from __future__ import annotations

from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    Error,
    ErrorCode,
    Heartbeat,
    KillTask,
    Reconcile,
    Revive,
    ShutdownFramework,
    TaskState,
    Teardown,
)
from support.master_kit import Harness, of_type, offers_in, only, sent_to, updates_in


def _with_task(failover_timeout: float) -> tuple[Harness, str]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", failover_timeout=failover_timeout)
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent)])
    h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    return h, fw


def test_failover_timeout_zero_tears_framework_down_on_disconnect() -> None:
    h, fw = _with_task(0.0)
    out = h.disconnect("s1")
    assert [k.task_id for k in of_type(sent_to(out, "a1"), KillTask)] == [TaskID("t1")]
    assert of_type(sent_to(out, "a1"), ShutdownFramework)
    assert fw not in h.master.state.frameworks
    again = h.handle("s2", _resubscribe(fw))
    assert only(of_type(sent_to(again, "s2"), Error)).code is ErrorCode.FRAMEWORK_REMOVED


def test_longer_failover_timeout_keeps_tasks_until_it_passes() -> None:
    h, fw = _with_task(100.0)
    out = h.disconnect("s1") + h.tick(50.0)
    assert of_type(sent_to(out, "a1"), KillTask) == []
    assert h.subscribe("s1b", framework_id=fw, failover_timeout=100.0) == fw
    states = {
        s.task_id: s.state for s in updates_in(h.handle("s1b", Reconcile(framework_id=fw)), "s1b")
    }
    assert states == {TaskID("t1"): TaskState.RUNNING}
    # Disconnect again and stay away: after the timeout the tasks are killed.
    h.disconnect("s1b")
    assert of_type(sent_to(h.tick(99.0), "a1"), KillTask) == []
    assert [k.task_id for k in of_type(sent_to(h.tick(2.0), "a1"), KillTask)] == [TaskID("t1")]


def _resubscribe(fw: str) -> object:
    from agora.sdk.messages import FrameworkInfo, Subscribe

    return Subscribe(framework_info=FrameworkInfo(name="x", framework_id=FrameworkID(fw)))


def test_teardown_kills_tasks_and_retires_the_id() -> None:
    h, fw = _with_task(3600.0)
    out = h.handle("s1", Teardown(framework_id=fw))
    assert [k.task_id for k in of_type(sent_to(out, "a1"), KillTask)] == [TaskID("t1")]
    assert fw not in h.master.state.frameworks


def test_call_before_subscribe_is_refused() -> None:
    h = Harness()
    out = h.handle("s1", Revive(framework_id=FrameworkID("nobody")))
    assert only(of_type(sent_to(out, "s1"), Error)).code is ErrorCode.NOT_SUBSCRIBED


def test_call_from_another_connection_is_refused() -> None:
    h, fw = _with_task(3600.0)
    out = h.handle("intruder", Teardown(framework_id=fw))
    assert only(of_type(sent_to(out, "intruder"), Error)).code is ErrorCode.FORBIDDEN
    assert fw in h.master.state.frameworks


def test_resubscription_from_a_new_connection_replaces_the_old_one() -> None:
    h, fw = _with_task(3600.0)
    out = h.handle("s1b", _resubscribe(fw))
    assert of_type(sent_to(out, "s1"), Error)  # the old scheduler is told it was replaced
    refused = h.handle("s1", Teardown(framework_id=fw))
    assert only(of_type(sent_to(refused, "s1"), Error)).code is ErrorCode.FORBIDDEN


def test_bad_role_is_refused() -> None:
    h = Harness()
    from agora.sdk.messages import FrameworkInfo, Subscribe

    out = h.handle("s1", Subscribe(framework_info=FrameworkInfo(name="x", roles=("bad role",))))
    assert only(of_type(sent_to(out, "s1"), Error)).code is ErrorCode.BAD_REQUEST
    assert h.master.state.frameworks == {}


def test_message_a_master_does_not_accept_is_answered_with_error() -> None:
    from agora.sdk.messages import MasterInfo

    h = Harness()
    bogus = AgentRegistered(
        agent_id="x", master_info=MasterInfo(master_id="m", address="", epoch=1)
    )  # type: ignore[arg-type]
    out = h.handle("someone", bogus)
    assert only(of_type(sent_to(out, "someone"), Error)).code is ErrorCode.BAD_REQUEST


def test_heartbeats_reach_connected_frameworks() -> None:
    h = Harness()
    h.subscribe("s1")
    beats = 0
    for _ in range(4):
        beats += len(of_type(sent_to(h.tick(15.0), "s1"), Heartbeat))
    assert beats == 4


def test_resubscription_changing_roles_is_refused_and_changes_nothing() -> None:
    from agora.sdk.messages import FrameworkInfo, Subscribe

    h = Harness()
    h.register_agent("a1")
    fw = h.subscribe("s1", failover_timeout=60.0)
    offer = only(offers_in(h.tick(), "s1"))
    info = FrameworkInfo(name="x", roles=("other",), framework_id=fw, failover_timeout=60.0)
    out = h.handle("s1", Subscribe(framework_info=info))
    assert only(of_type(sent_to(out, "s1"), Error)).code is ErrorCode.BAD_REQUEST
    assert offer.offer_id in h.master.state.offers
    assert h.master.state.frameworks[fw].info.roles == ("*",)
