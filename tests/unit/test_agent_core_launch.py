"""Agent core: launching tasks through executors, updates from executors, acks from the master."""

from __future__ import annotations

import itertools

from agora.agent.core import COMMAND_EXECUTOR_ID, ExecutorState, LaunchExecutor, ToMaster
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    CommandInfo,
    ExecutorRegistered,
    ExecutorReregistered,
    ExecutorToFramework,
    FrameworkInfo,
    FrameworkToExecutor,
    LaunchTask,
    LaunchTaskGroup,
    Reason,
    ReregisterExecutor,
    RunTask,
    RunTaskGroup,
    ShutdownExecutor,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskState,
    TaskStatus,
)
from support.agent_kit import (
    AGENT_ID,
    FID,
    AgentHarness,
    executor_info,
    forwarded,
    of_type,
    only,
    snapshot,
    task_info,
    to_executor,
    to_master,
)


def registered() -> AgentHarness:
    h = AgentHarness()
    h.register()
    return h


def test_command_task_launches_the_builtin_executor_and_waits_for_it() -> None:
    h = registered()
    out = h.run("t1")
    launch = only(of_type(out, LaunchExecutor))
    assert launch.builtin
    assert launch.framework_id == FID
    assert launch.executor_id == COMMAND_EXECUTOR_ID == "agora-command"
    assert launch.info.name == "Command Executor"
    assert launch.info.command == CommandInfo(value="agora-command-executor")
    assert launch.sandbox == "frameworks/fw-1/executors/agora-command"
    assert launch.user == "alice"  # the framework's user
    assert launch.environment == {
        "AGORA_FRAMEWORK_ID": "fw-1",
        "AGORA_EXECUTOR_ID": "agora-command",
        "AGORA_AGENT_ID": AGENT_ID,
        "AGORA_SHUTDOWN_GRACE_PERIOD": "5.0",
        "AGORA_EXECUTOR_SECRET": h.secret("agora-command"),
    }
    assert len(h.secret("agora-command")) >= 43  # 32 random bytes
    assert not of_type(out, ToMaster)
    task = h.st.tasks[(FID, TaskID("t1"))]
    assert (task.state, task.launched) == (TaskState.STAGING, False)
    # A second command task of the same framework shares the executor, queued as well.
    out = h.run("t2")
    assert not of_type(out, LaunchExecutor)
    ex = h.st.executors[(FID, COMMAND_EXECUTOR_ID)]
    assert ex.state is ExecutorState.LAUNCHING
    assert [q.task_ids for q in ex.queued] == [(TaskID("t1"),), (TaskID("t2"),)]


def test_registration_hands_over_the_queued_tasks_in_order() -> None:
    h = registered()
    h.run("t1")
    h.run("t2")
    out = h.start_executor("cmd")
    msgs = to_executor(out, "cmd")
    reg = msgs[0]
    assert isinstance(reg, ExecutorRegistered)
    assert reg.executor_info.executor_id == COMMAND_EXECUTOR_ID
    assert reg.framework_id == FID
    assert reg.framework_info.framework_id == FID
    assert reg.agent_id == AGENT_ID
    assert reg.agent_info.hostname == "host-1"
    assert [m.task.task_id for m in msgs[1:] if isinstance(m, LaunchTask)] == ["t1", "t2"]
    assert len(msgs) == 3
    assert all(h.st.tasks[(FID, TaskID(t))].launched for t in ("t1", "t2"))
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.STAGING
    # Once registered, a new task goes straight to it.
    out = h.run("t3")
    assert only(of_type(to_executor(out, "cmd"), LaunchTask)).task.task_id == "t3"
    assert not of_type(out, LaunchExecutor)


def test_a_retried_registration_is_answered_again_without_relaunching_tasks() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    out = h.start_executor("cmd")
    assert [type(m) for m in to_executor(out, "cmd")] == [ExecutorRegistered]


def test_custom_executor_is_launched_once_with_its_environment() -> None:
    h = registered()
    info = executor_info("exec-1", FOO="bar", AGORA_AGENT_ID="spoofed")
    out = h.run("t1", executor=info)
    launch = only(of_type(out, LaunchExecutor))
    assert not launch.builtin
    assert launch.info == info
    assert launch.sandbox == "frameworks/fw-1/executors/exec-1"
    assert launch.environment["FOO"] == "bar"
    assert launch.environment["AGORA_AGENT_ID"] == AGENT_ID  # the agent's own vars win
    assert launch.environment["AGORA_EXECUTOR_ID"] == "exec-1"
    assert not of_type(h.run("t2", executor=info), LaunchExecutor)
    out = h.start_executor("ex", "exec-1")
    assert [m.task.task_id for m in of_type(to_executor(out, "ex"), LaunchTask)] == ["t1", "t2"]


def test_task_group_goes_to_its_executor_as_one_launch_group() -> None:
    h = registered()
    info = executor_info("group-exec")
    out = h.run_group(["g1", "g2"], info)
    assert only(of_type(out, LaunchExecutor)).info == info
    out = h.start_executor("gp", "group-exec")
    group = only(of_type(to_executor(out, "gp"), LaunchTaskGroup))
    assert group.executor == info
    assert [t.task_id for t in group.task_group.tasks] == ["g1", "g2"]
    assert h.st.tasks[(FID, TaskID("g1"))].executor_id == "group-exec"
    out = h.run_group(["g3"], info)
    assert (
        only(of_type(to_executor(out, "gp"), LaunchTaskGroup)).task_group.tasks[0].task_id == "g3"
    )


def test_executor_updates_are_forwarded_acked_and_tracked() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    out, u1 = h.update("cmd", "t1", TaskState.RUNNING)
    update = only(forwarded(out))
    assert update.framework_id == FID
    assert update.status.uuid == u1
    assert update.status.agent_id == AGENT_ID
    assert update.status.executor_id == COMMAND_EXECUTOR_ID
    assert update.status.source is StatusSource.EXECUTOR
    assert update.latest_state is TaskState.RUNNING
    ack = only(of_type(to_executor(out, "cmd"), StatusUpdateAck))
    assert (ack.framework_id, ack.task_id, ack.uuid, ack.agent_id) == (FID, "t1", u1, AGENT_ID)
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.RUNNING
    # The next update waits for the master's ack of the first, yet the executor is acked now.
    out, u2 = h.update("cmd", "t1", TaskState.FINISHED, exit_code=0)
    assert forwarded(out) == []
    assert only(of_type(to_executor(out, "cmd"), StatusUpdateAck)).uuid == u2
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.FINISHED
    out = h.ack("t1", u1)
    nxt = only(forwarded(out))
    assert (nxt.status.uuid, nxt.status.state, nxt.status.exit_code) == (
        u2,
        TaskState.FINISHED,
        0,
    )
    # The terminal task stays until its update is acknowledged, then leaves.
    assert (FID, TaskID("t1")) in h.st.tasks
    h.ack("t1", u2)
    assert (FID, TaskID("t1")) not in h.st.tasks
    assert h.st.updates.unacknowledged() == 0


def test_unacknowledged_head_is_resent_with_backoff() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    _, u1 = h.update("cmd", "t1", TaskState.RUNNING)
    times = []
    for _ in range(80):
        out = h.tick(0.25)
        if forwarded(out):
            assert only(forwarded(out)).status.uuid == u1
            times.append(h.now)
    assert [round(b - a, 2) for a, b in itertools.pairwise(times)][:3] == [2.0, 4.0, 8.0]


def test_an_ack_for_another_agent_or_not_the_head_is_ignored() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    _, u1 = h.update("cmd", "t1", TaskState.RUNNING)
    _, u2 = h.update("cmd", "t1", TaskState.FINISHED)
    h.master(
        StatusUpdateAck(framework_id=FID, task_id=TaskID("t1"), uuid=u1, agent_id=AgentID("other"))
    )
    assert len(h.st.updates.pending(FID, TaskID("t1"))) == 2
    h.ack("t1", u2)
    assert len(h.st.updates.pending(FID, TaskID("t1"))) == 2
    h.ack("t1", u1)
    assert len(h.st.updates.pending(FID, TaskID("t1"))) == 1


def test_duplicate_executor_updates_are_acked_but_not_queued_twice() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    _, u1 = h.update("cmd", "t1", TaskState.RUNNING)
    out, _ = h.update("cmd", "t1", TaskState.RUNNING, uuid=u1)
    assert forwarded(out) == []
    assert only(of_type(to_executor(out, "cmd"), StatusUpdateAck)).uuid == u1
    assert len(h.st.updates.pending(FID, TaskID("t1"))) == 1


def test_bad_executor_updates_change_nothing() -> None:
    h = registered()
    h.run("t1")
    h.run("t2", executor=executor_info("exec-1"))
    h.start_executor("cmd")
    before = snapshot(h.agent)
    # STAGING from an executor, an update for another executor's task, for another framework,
    # without a uuid, for an unknown task.
    h.update("cmd", "t1", TaskState.STAGING)
    h.update("cmd", "t2", TaskState.RUNNING)
    h.update("cmd", "t1", TaskState.RUNNING, framework_id=FrameworkID("other"))
    h.update("cmd", "nope", TaskState.RUNNING)
    status = TaskStatus(task_id=TaskID("t1"), state=TaskState.RUNNING, source=StatusSource.EXECUTOR)
    out = h.executor(
        "cmd", StatusUpdateMessage(update=StatusUpdate(framework_id=FID, status=status))
    )
    assert out == []
    # From a peer that is not a registered executor: ignored entirely (not even acked).
    out, _ = h.update("stranger", "t1", TaskState.RUNNING)
    assert out == []
    assert snapshot(h.agent) == before


def test_executor_messages_reach_the_master_and_framework_messages_the_executor() -> None:
    h = registered()
    h.run("t1", executor=executor_info("exec-1"))
    h.start_executor("ex", "exec-1")
    msg = ExecutorToFramework(framework_id=FID, executor_id=ExecutorID("exec-1"), data=b"hi")
    out = h.executor("ex", msg)
    relayed = only(of_type(to_master(out), ExecutorToFramework))
    assert (relayed.data, relayed.agent_id) == (b"hi", AGENT_ID)
    # Claiming to be another executor: dropped.
    spoof = ExecutorToFramework(framework_id=FID, executor_id=ExecutorID("other"), data=b"x")
    assert h.executor("ex", spoof) == []
    down = FrameworkToExecutor(framework_id=FID, executor_id=ExecutorID("exec-1"), data=b"yo")
    out = h.master(down)
    assert to_executor(out, "ex") == [down]
    unknown = FrameworkToExecutor(framework_id=FID, executor_id=ExecutorID("zzz"), data=b"yo")
    assert h.master(unknown) == []


def test_unknown_executor_registering_is_told_to_shut_down() -> None:
    h = registered()
    out = h.start_executor("x", "ghost")
    assert to_executor(out, "x") == [
        ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("ghost"))
    ]
    # A second process claiming an executor that is already running, too.
    h.run("t1")
    h.start_executor("cmd")
    before = snapshot(h.agent)
    out = h.start_executor("impostor")
    assert of_type(to_executor(out, "impostor"), ShutdownExecutor)
    assert snapshot(h.agent) == before


def test_reregistering_executor_is_rebound_and_its_updates_taken() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("old-peer")
    _, u1 = h.update("old-peer", "t1", TaskState.RUNNING)
    u2 = h.next_uuid()
    resent = StatusUpdate(
        framework_id=FID,
        status=TaskStatus(
            task_id=TaskID("t1"), state=TaskState.FINISHED, source=StatusSource.EXECUTOR, uuid=u2
        ),
    )
    dup = StatusUpdate(
        framework_id=FID,
        status=TaskStatus(
            task_id=TaskID("t1"), state=TaskState.RUNNING, source=StatusSource.EXECUTOR, uuid=u1
        ),
    )
    out = h.executor(
        "new-peer",
        ReregisterExecutor(
            framework_id=FID,
            executor_id=COMMAND_EXECUTOR_ID,
            updates=(dup, resent),
            secret=h.secret(COMMAND_EXECUTOR_ID),
        ),
    )
    msgs = to_executor(out, "new-peer")
    assert isinstance(msgs[0], ExecutorReregistered)
    assert [m.uuid for m in of_type(msgs, StatusUpdateAck)] == [u1, u2]
    assert h.st.executors_by_peer == {"new-peer": (FID, COMMAND_EXECUTOR_ID)}
    assert [s.uuid for s in h.st.updates.pending(FID, TaskID("t1"))] == [u1, u2]
    # An unknown executor re-registering is told to shut down.
    out = h.executor("x", ReregisterExecutor(framework_id=FID, executor_id=ExecutorID("nope")))
    assert of_type(to_executor(out, "x"), ShutdownExecutor)


def test_invalid_tasks_are_answered_task_error() -> None:
    h = registered()
    h.run("t-ok", executor=executor_info("exec-1"))
    cases = [
        task_info("both", executor=executor_info("exec-2"), command=True),
        task_info("neither", command=False),
        task_info("../escape"),
        task_info("has space"),
        task_info("reserved", executor=executor_info("agora-command")),
        task_info("other-def", executor=executor_info("exec-1", X="1")),
        task_info("wrong-agent", agent_id=AgentID("e1-A2")),
    ]
    for task in cases:
        out = h.master(
            RunTask(framework_info=FrameworkInfo(name="fw"), framework_id=FID, task=task)
        )
        update = only(forwarded(out))
        assert update.status.state is TaskState.ERROR, task.task_id
        assert update.status.reason is Reason.TASK_INVALID
        assert update.status.source is StatusSource.AGENT
        assert update.status.uuid is not None and len(update.status.uuid) == 16
        assert update.status.message
        assert (FID, task.task_id) not in h.st.tasks
        assert not of_type(out, LaunchExecutor)
    # The refusals are reliable: acknowledged like any update, then forgotten.
    for task in cases:
        head = h.st.updates.head(FID, task.task_id)
        assert head is not None
        h.ack(task.task_id, head.uuid)
    assert h.st.updates.unacknowledged() == 0


def test_duplicate_run_task_is_ignored() -> None:
    h = registered()
    h.run("t1")
    before = snapshot(h.agent)
    assert h.run("t1") == []
    assert snapshot(h.agent) == before


def test_agent_generated_uuids_are_distinct() -> None:
    h = registered()
    uuids = set()
    for i in range(50):
        out = h.run(f"bad {i}")
        uuid = only(forwarded(out)).status.uuid
        assert uuid is not None
        uuids.add(uuid)
    assert len(uuids) == 50


def test_invalid_task_groups_are_answered_task_error() -> None:
    h = registered()
    good = executor_info("gexec")
    cases = [
        (good, (task_info("a1", command=True), task_info("a1", command=True))),
        (good, (task_info("b1", executor=executor_info("zzz")),)),
        (executor_info("bad/id"), (task_info("c1", command=True),)),
        (executor_info("gexec", FrameworkID("other")), (task_info("d1", command=True),)),
        (executor_info("agora-command"), (task_info("e1", command=True),)),
    ]
    for info, tasks in cases:
        out = h.master(
            RunTaskGroup(
                framework_info=FrameworkInfo(name="fw"),
                framework_id=FID,
                executor=info,
                task_group=TaskGroupInfo(tasks=tasks),
            )
        )
        updates = forwarded(out)
        assert updates, info
        assert {u.status.state for u in updates} == {TaskState.ERROR}
        assert not of_type(out, LaunchExecutor)
    assert h.st.tasks == {}
    empty = RunTaskGroup(
        framework_info=FrameworkInfo(name="fw"),
        framework_id=FID,
        executor=good,
        task_group=TaskGroupInfo(tasks=()),
    )
    assert h.master(empty) == []  # nothing to answer for
    assert h.st.executors == {}
    # A group naming a task the agent already holds is a duplicate: ignored.
    h.run_group(["g1"], good)
    before = snapshot(h.agent)
    assert h.run_group(["g1", "g2"], good) == []
    assert snapshot(h.agent) == before
