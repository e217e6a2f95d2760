"""A kill's id travels with it: scheduler -> master -> agent -> executor (``kill_id`` in logs)."""

from __future__ import annotations

import msgpack
from agora.sdk import codec
from agora.sdk.ids import FrameworkID, TaskID, new_kill_id
from agora.sdk.messages import Kill, KillTask, RunTask, TaskState
from support.agent_kit import FID, AgentHarness, config, to_executor
from support.master_kit import Harness, of_type, offers_in, only, sent_to, updates_in


def _running_task() -> tuple[Harness, str]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:4;mem:4096", agent)], refuse_seconds=0)
    assert len(of_type(sent_to(out, "a1"), RunTask)) == 1
    h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    return h, fw


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
