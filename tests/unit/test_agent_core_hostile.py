"""Agent core: messages about unknown things change nothing; arbitrary input never breaks it.

Decoding rejects malformed frames; this is the next layer: frames that decode fine but make no
sense (unknown frameworks, executors, tasks; wrong senders; calls out of order).
"""

from __future__ import annotations

from typing import Any

import msgspec
from agora.agent.core import Agent, is_final
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorToFramework,
    FrameworkToExecutor,
    KillTask,
    LaunchTask,
    Message,
    Pong,
    ReregisterExecutor,
    RunTask,
    RunTaskGroup,
    ShutdownExecutor,
    ShutdownFramework,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agent_kit import (
    AGENT_ID,
    FID,
    AgentHarness,
    executor_info,
    of_type,
    snapshot,
    to_executor,
)
from support.strategies import ANY_MESSAGE

OTHER = FrameworkID("fw-unknown")


def busy_agent() -> AgentHarness:
    """A registered agent with a running command executor, a launching custom executor,
    tasks in several states and an unacknowledged update."""
    h = AgentHarness()
    h.register()
    h.run("t1")
    h.run("t2")
    h.start_executor("cmd")
    h.update("cmd", "t1", TaskState.RUNNING)
    h.update("cmd", "t2", TaskState.FINISHED)
    h.run("t3", executor=executor_info("exec-1"))
    return h


def test_master_messages_about_unknown_things_change_nothing() -> None:
    h = busy_agent()
    before = snapshot(h.agent)
    uuid = b"\x01" * 16
    messages: list[Message] = [
        ShutdownFramework(framework_id=OTHER),
        ShutdownExecutor(framework_id=OTHER, executor_id=ExecutorID("exec-1")),
        ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("nope")),
        StatusUpdateAck(framework_id=FID, task_id=TaskID("t1"), uuid=uuid),
        StatusUpdateAck(framework_id=OTHER, task_id=TaskID("t1"), uuid=uuid),
        StatusUpdateAck(framework_id=FID, task_id=TaskID("nope"), uuid=uuid),
        FrameworkToExecutor(framework_id=OTHER, executor_id=ExecutorID("agora-command"), data=b""),
        FrameworkToExecutor(framework_id=FID, executor_id=ExecutorID("exec-1"), data=b"x"),
        Pong(),  # not a master -> agent message
    ]
    for message in messages:
        out = h.master(message)
        assert out == [], message
    assert snapshot(h.agent) == before


def test_executor_messages_about_unknown_things_change_nothing() -> None:
    h = busy_agent()
    before = snapshot(h.agent)
    status = TaskStatus(
        task_id=TaskID("t1"), state=TaskState.FAILED, source=StatusSource.EXECUTOR, uuid=b"u" * 16
    )
    foreign = StatusUpdateMessage(update=StatusUpdate(framework_id=OTHER, status=status))
    # From the registered command executor, but about another framework / executor.
    assert h.executor("cmd", foreign) == []
    spoof = ExecutorToFramework(framework_id=FID, executor_id=ExecutorID("exec-1"), data=b"")
    assert h.executor("cmd", spoof) == []
    # From peers that are no registered executor.
    mine = StatusUpdateMessage(update=StatusUpdate(framework_id=FID, status=status))
    for peer in ("stranger", "exec-1-peer"):
        assert h.executor(peer, mine) == []
        assert h.executor(peer, spoof) == []
        assert h.executor(peer, KillTask(framework_id=FID, task_id=TaskID("t1"))) == []
    # Registration attempts for unknown executors/frameworks: told to shut down, nothing else.
    out = h.executor("x", ReregisterExecutor(framework_id=OTHER, executor_id=ExecutorID("e")))
    assert to_executor(out, "x") == [
        ShutdownExecutor(framework_id=OTHER, executor_id=ExecutorID("e"))
    ]
    assert len(out) == 1
    out = h.start_executor("y", "e", OTHER)
    assert of_type(to_executor(out, "y"), ShutdownExecutor)
    # Master-side messages arriving on the executor socket are ignored.
    run = RunTask(
        framework_info=h.st.frameworks[FID].info,
        framework_id=FID,
        task=h.st.tasks[(FID, TaskID("t1"))].info,
    )
    assert h.executor("cmd", run) == []
    assert h.executor("cmd", LaunchTask(framework_id=FID, task=run.task)) == []
    assert snapshot(h.agent) == before


def test_exits_of_unknown_executors_change_nothing() -> None:
    h = busy_agent()
    before = snapshot(h.agent)
    assert h.exited(OTHER, "agora-command", 1) == []
    assert h.exited(FID, "nope", 1) == []
    assert h.launch_failed(FID, "nope", "boom") == []
    assert snapshot(h.agent) == before


# --- fuzz ----------------------------------------------------------------------------------

_PEERS = ("cmd", "ex", "stranger")
_TASK_IDS = ("t1", "t2", "t3", "t4", "g1")
_EXECUTORS = ("agora-command", "exec-1", "gexec")


def _aim(h: AgentHarness, msg: Message, pick: int) -> Message:
    """Point some of a random message's ids at things that exist, so it reaches deep code."""
    if pick % 3 == 0:
        return msg
    names = {f.name for f in msgspec.structs.fields(msg)}
    real: dict[str, Any] = {}
    if "framework_id" in names:
        real["framework_id"] = FID if pick % 5 else OTHER
    if "executor_id" in names:
        real["executor_id"] = ExecutorID(_EXECUTORS[pick % len(_EXECUTORS)])
    if "task_id" in names:
        real["task_id"] = TaskID(_TASK_IDS[pick % len(_TASK_IDS)])
    if "agent_id" in names and pick % 2:
        real["agent_id"] = AGENT_ID
    if isinstance(msg, RunTask):
        task = msgspec.structs.replace(
            msg.task, agent_id=AGENT_ID, task_id=TaskID(_TASK_IDS[pick % len(_TASK_IDS)])
        )
        if pick % 4 == 1:
            task = msgspec.structs.replace(task, executor=None)
        real["task"] = task
    if isinstance(msg, RunTaskGroup):
        tasks = tuple(
            msgspec.structs.replace(t, agent_id=AGENT_ID, executor=None)
            for t in msg.task_group.tasks
        )
        real["task_group"] = msgspec.structs.replace(msg.task_group, tasks=tasks)
        real["executor"] = msgspec.structs.replace(msg.executor, framework_id=FID)
    if isinstance(msg, StatusUpdateMessage):
        status = msgspec.structs.replace(
            msg.update.status, task_id=TaskID(_TASK_IDS[pick % len(_TASK_IDS)])
        )
        real["update"] = msgspec.structs.replace(msg.update, framework_id=FID, status=status)
    return msgspec.structs.replace(msg, **real)


def _check(agent: Agent) -> None:
    st = agent.state
    for (fid, eid), ex in st.executors.items():
        assert (ex.framework_id, ex.executor_id) == (fid, eid)
        assert fid in st.frameworks and eid in st.frameworks[fid].executors
        assert ex.live <= ex.tasks
        for tid in ex.tasks:
            assert (fid, tid) in st.tasks
        for tid in ex.live:
            assert not is_final(st.tasks[(fid, tid)].state)
        for launch in ex.queued:
            for tid in launch.task_ids:
                assert not st.tasks[(fid, tid)].launched
    for peer, key in st.executors_by_peer.items():
        assert st.executors[key].peer == peer
    for (fid, tid), task in st.tasks.items():
        assert fid in st.frameworks and tid in st.frameworks[fid].tasks
        if is_final(task.state):
            # A final task stays only while its final update waits for an acknowledgement.
            assert st.updates.pending(fid, tid), (fid, tid, task.state)
    for fid, fw in st.frameworks.items():
        assert fw.executors or fw.tasks, fid
        for eid in fw.executors:
            assert (fid, eid) in st.executors


_STEP = st.tuples(
    st.sampled_from(("master", "executor", "tick", "exit", "link")),
    ANY_MESSAGE,
    st.integers(0, 60),
    st.floats(0, 30),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEP, min_size=1, max_size=30))
def test_arbitrary_input_never_breaks_the_agent(
    steps: list[tuple[str, Message, int, float]],
) -> None:
    h = busy_agent()
    _check(h.agent)
    epoch = 1
    for kind, msg, pick, dt in steps:
        if kind == "master":
            # Mostly the current master; now and then an older one, rarely a newer one.
            epoch += pick == 60
            h.master(_aim(h, msg, pick), epoch=epoch - (pick % 11 == 0))
        elif kind == "executor":
            h.executor(_PEERS[pick % len(_PEERS)], _aim(h, msg, pick))
        elif kind == "tick":
            h.tick(dt)
        elif kind == "exit":
            eid = _EXECUTORS[pick % len(_EXECUTORS)]
            if pick % 2:
                h.exited(FID, eid, pick - 30)
            else:
                h.launch_failed(FID, eid, "boom")
        elif pick % 2:
            h.connected()
        else:
            h.disconnected()
        _check(h.agent)
