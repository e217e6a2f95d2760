"""A kill's id travels with it: scheduler -> master -> agent -> executor (``kill_id`` in logs);
and a kill that may have gone to a connection the agent left is sent again when it re-registers.
"""

from __future__ import annotations

import msgpack
from agora.sdk import codec
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID, new_kill_id
from agora.sdk.messages import (
    AgentInfo,
    AgentReregistered,
    AgentTask,
    ExecutorReregistered,
    Kill,
    KillTask,
    ReregisterAgent,
    ReregisterExecutor,
    RunTask,
    StatusSource,
    StatusUpdate,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from support.agent_kit import FID, AgentHarness, config, to_executor
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info, updates_in


def _running_task() -> tuple[Harness, str]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:4;mem:4096", agent)], refuse_seconds=0)
    assert len(of_type(sent_to(out, "a1"), RunTask)) == 1
    h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    return h, fw


def _reregister_from(h: Harness, peer: str, fw: str, state: TaskState) -> list[object]:
    agent = only(list(h.master.state.agents))
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    task = AgentTask(
        task=task_info("t1", "cpus:4;mem:4096", agent), framework_id=FrameworkID(fw), state=state
    )
    return list(
        h.handle(peer, ReregisterAgent(agent_id=AgentID(agent), agent_info=info, tasks=(task,)))
    )


def test_new_kill_ids_are_short_and_distinct() -> None:
    ids = {new_kill_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 12 for i in ids)


def test_the_master_carries_the_kill_id_to_the_agent() -> None:
    h, fw = _running_task()
    out = h.handle("s1", Kill(framework_id=FrameworkID(fw), task_id=TaskID("t1"), kill_id="k-1"))
    assert only(of_type(sent_to(out, "a1"), KillTask)).kill_id == "k-1"


def test_the_master_notes_a_kill_it_answers_itself() -> None:
    h, fw = _running_task()
    h.master.notices()
    out = h.handle("s1", Kill(framework_id=FrameworkID(fw), task_id=TaskID("ghost"), kill_id="k-2"))
    assert only(updates_in(out, "s1")).state is TaskState.LOST
    notice = only([n for n in h.master.notices() if n.event == "kill_answered_by_master"])
    assert ("kill_id", "k-2") in notice.fields and ("why", "unknown task") in notice.fields


def test_the_agent_carries_the_kill_id_to_the_executor() -> None:
    h = AgentHarness(cfg=config())
    h.register()
    h.run("t1")
    h.start_executor("cmd")
    out = h.master(KillTask(framework_id=FID, task_id=TaskID("t1"), kill_id="k-3"))
    assert to_executor(out, "cmd") == [
        KillTask(framework_id=FID, task_id=TaskID("t1"), kill_id="k-3")
    ]


def test_a_kill_from_an_older_peer_without_an_id_still_decodes() -> None:
    for message in (
        Kill(framework_id=FrameworkID("f"), task_id=TaskID("t"), kill_id="x"),
        KillTask(framework_id=FrameworkID("f"), task_id=TaskID("t"), kill_id="x"),
    ):
        name, version, epoch, body = msgpack.unpackb(codec.encode(message), raw=False)
        del body["kill_id"]
        old = msgpack.packb([name, version, epoch, body], use_bin_type=True)
        decoded = codec.decode(old).message
        assert decoded is not None and decoded.kill_id == ""  # type: ignore[attr-defined]


def test_a_kill_sent_to_the_agents_old_connection_is_sent_again_when_it_reregisters() -> None:
    # The KILL_TASK goes to the agent's connection as the master knows it; the agent has just
    # reconnected (a new peer), so ZeroMQ drops it. The agent re-registers from its new
    # connection still running the task: the master kills it again, with the same id.
    h, fw = _running_task()
    out = h.handle("s1", Kill(framework_id=FrameworkID(fw), task_id=TaskID("t1"), kill_id="k-4"))
    assert only(of_type(sent_to(out, "a1"), KillTask)).kill_id == "k-4"  # lost on the way
    out = _reregister_from(h, "a1-new", fw, TaskState.RUNNING)
    sent = sent_to(out, "a1-new")
    assert isinstance(sent[0], AgentReregistered)
    assert of_type(sent, KillTask) == [
        KillTask(framework_id=FrameworkID(fw), task_id=TaskID("t1"), kill_id="k-4")
    ]
    notice = only([n for n in h.master.notices() if n.event == "kill_resent"])
    assert ("kill_id", "k-4") in notice.fields


def test_no_kill_is_sent_again_for_a_task_not_killed_or_already_over() -> None:
    h, fw = _running_task()
    assert (
        of_type(sent_to(_reregister_from(h, "a1-new", fw, TaskState.RUNNING), "a1-new"), KillTask)
        == []
    )
    h.handle("s1", Kill(framework_id=FrameworkID(fw), task_id=TaskID("t1"), kill_id="k-5"))
    out = _reregister_from(h, "a1-newer", fw, TaskState.KILLED)
    assert of_type(sent_to(out, "a1-newer"), KillTask) == []


def _killed_on_the_executor(kill_id: str) -> AgentHarness:
    h = AgentHarness(cfg=config())
    h.register()
    h.run("t1")
    h.start_executor("cmd")
    h.update("cmd", "t1", TaskState.RUNNING)
    out = h.master(KillTask(framework_id=FID, task_id=TaskID("t1"), kill_id=kill_id))
    assert [m.kill_id for m in to_executor(out, "cmd")] == [kill_id]  # lost on the way
    return h


def _reregister_executor(h: AgentHarness, peer: str, *updates: StatusUpdate) -> list[object]:
    executor = ExecutorID("agora-command")
    message = ReregisterExecutor(
        framework_id=FID, executor_id=executor, updates=updates, secret=h.secret(executor)
    )
    return list(h.executor(peer, message))


def test_a_kill_sent_to_the_executors_old_connection_is_sent_again_when_it_reregisters() -> None:
    # The executor's connection dropped and came back (a new peer) after the KILL_TASK went
    # to the old one: on its re-registration the agent kills the task again, same id.
    h = _killed_on_the_executor("k-6")
    sent = to_executor(_reregister_executor(h, "cmd-new"), "cmd-new")
    assert isinstance(sent[0], ExecutorReregistered)
    assert sent[1:] == [KillTask(framework_id=FID, task_id=TaskID("t1"), kill_id="k-6")]


def test_no_kill_is_sent_again_to_an_executor_whose_resent_update_ended_the_task() -> None:
    h = _killed_on_the_executor("k-7")
    status = TaskStatus(
        task_id=TaskID("t1"), state=TaskState.KILLED, source=StatusSource.EXECUTOR, uuid=b"k" * 16
    )
    sent = to_executor(
        _reregister_executor(h, "cmd-new", StatusUpdate(framework_id=FID, status=status)), "cmd-new"
    )
    assert of_type(sent, KillTask) == []
