"""Master core: the ACL's run_as rule on ACCEPT (Mesos's run_tasks ACL)."""

from __future__ import annotations

from agora.master.core import MasterConfig, Send
from agora.master.core.run_as import RunAsPolicy
from agora.sdk.ids import FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    CommandInfo,
    Filters,
    FrameworkInfo,
    Launch,
    Reason,
    RunTask,
    Subscribe,
    Subscribed,
    TaskState,
)
from msgspec.structs import replace
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info, updates_in

POLICY = RunAsPolicy(users={"mallory": ("nobody",), "ops": ("*",)})


def _subscribe(h: Harness, peer: str, principal: str, user: str = "") -> FrameworkID:
    info = FrameworkInfo(name=peer, user=user, principal=principal)
    out = h.handle(peer, Subscribe(framework_info=info))
    return only(of_type(sent_to(out, peer), Subscribed)).framework_id


def _accept(h: Harness, fw: FrameworkID, offer: OfferID, users: dict[str, str]) -> list[Send]:
    agent = next(iter(h.master.state.agents))
    tasks = tuple(
        replace(task_info(tid, "cpus:1;mem:128", agent), command=CommandInfo(value="id", user=u))
        for tid, u in users.items()
    )
    accept = Accept(
        framework_id=fw,
        offer_ids=(offer,),
        operations=(Launch(task_infos=tasks),),
        filters=Filters(refuse_seconds=0),
    )
    return h.handle("s1", accept)


def test_unauthorized_users_end_task_error_and_the_others_launch() -> None:
    h = Harness(MasterConfig(run_as=POLICY))
    h.register_agent("a1", "cpus:4;mem:4096")
    fw = _subscribe(h, "s1", "mallory")
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer.offer_id, {"as-root": "root", "as-alice": "alice", "ok": "nobody"})
    refused = {s.task_id: s for s in updates_in(out, "s1")}
    assert set(refused) == {TaskID("as-root"), TaskID("as-alice")}
    for status in refused.values():
        assert (status.state, status.reason) == (TaskState.ERROR, Reason.TASK_UNAUTHORIZED)
    assert "may not run tasks as user 'root'" in (refused[TaskID("as-root")].message or "")
    runs = of_type(sent_to(out, "a1"), RunTask)
    assert [r.task.task_id for r in runs] == [TaskID("ok")]
    notices = [n for n in h.master.notices() if n.event == "task_unauthorized"]
    assert len(notices) == 2 and all(n.level == "warning" for n in notices)
    assert ("principal", "mallory") in notices[0].fields


def test_a_task_and_framework_without_user_get_the_principals_default() -> None:
    h = Harness(MasterConfig(run_as=POLICY))
    h.register_agent("a1", "cpus:4;mem:4096")
    fw = _subscribe(h, "s1", "mallory")
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer.offer_id, {"t1": ""})
    run = only(of_type(sent_to(out, "a1"), RunTask))
    assert run.framework_info.user == "nobody"  # the agent runs it as the ACL's default


def test_no_default_user_is_refused_rather_than_the_agents_identity() -> None:
    h = Harness(MasterConfig(run_as=POLICY))
    h.register_agent("a1", "cpus:4;mem:4096")
    fw = _subscribe(h, "s1", "ops")  # may run as anyone, but names no default
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer.offer_id, {"t1": "", "t2": "root"})
    status = only(updates_in(out, "s1"))
    assert (status.task_id, status.state) == (TaskID("t1"), TaskState.ERROR)
    assert status.reason is Reason.TASK_UNAUTHORIZED
    assert [r.task.task_id for r in of_type(sent_to(out, "a1"), RunTask)] == [TaskID("t2")]


def test_without_a_policy_any_user_launches_as_before() -> None:
    h = Harness()
    h.register_agent("a1", "cpus:4;mem:4096")
    fw = _subscribe(h, "s1", "mallory")
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer.offer_id, {"t1": "root"})
    run = only(of_type(sent_to(out, "a1"), RunTask))
    assert run.framework_info.user == ""
