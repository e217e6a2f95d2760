"""Agent core: kills, executor exits and timeouts, shutdowns with grace, idle command executors."""

from __future__ import annotations

from agora.agent.core import (
    COMMAND_EXECUTOR_ID,
    LAUNCH_FAILED_STATUS,
    ExecutorState,
    LaunchExecutor,
    SignalExecutor,
)
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorToFramework,
    ExitedExecutor,
    ExitedExecutorAck,
    KillTask,
    LaunchTask,
    Reason,
    ReconcileTasks,
    ReregisterExecutor,
    ShutdownExecutor,
    ShutdownFramework,
    StatusSource,
    StatusUpdate,
    TaskState,
)
from support.agent_kit import (
    AGENT_ID,
    FID,
    AgentHarness,
    config,
    executor_info,
    forwarded,
    of_type,
    only,
    to_executor,
    to_master,
)

CMD = str(COMMAND_EXECUTOR_ID)


def registered(**cfg: float) -> AgentHarness:
    h = AgentHarness(cfg=config(**cfg))
    h.register()
    return h


def kill(h: AgentHarness, task_id: str, framework_id: FrameworkID = FID) -> list[object]:
    return list(h.master(KillTask(framework_id=framework_id, task_id=TaskID(task_id))))


def states(updates: list[StatusUpdate]) -> list[tuple[str, TaskState, Reason | None]]:
    return [(u.status.task_id, u.status.state, u.status.reason) for u in updates]


# --- kill ------------------------------------------------------------------------------------


def test_killing_a_queued_task_ends_it_during_launch_and_stops_the_idle_launch() -> None:
    h = registered(executor_shutdown_grace_period=5.0)
    h.run("t1")
    out = h.master(KillTask(framework_id=FID, task_id=TaskID("t1")))
    update = only(forwarded(out))
    assert states([update]) == [("t1", TaskState.KILLED, Reason.TASK_KILLED_DURING_LAUNCH)]
    assert update.status.source is StatusSource.AGENT
    assert update.status.executor_id == CMD
    assert update.status.agent_id == AGENT_ID
    # The executor has nothing left to run: SIGTERM now (it never registered) ...
    assert of_type(out, SignalExecutor) == [SignalExecutor(FID, COMMAND_EXECUTOR_ID, kill=False)]
    assert h.st.executors[(FID, COMMAND_EXECUTOR_ID)].state is ExecutorState.TERMINATING
    # ... SIGKILL after the grace period, once.
    assert not of_type(h.tick(4.9), SignalExecutor)
    assert of_type(h.tick(0.1), SignalExecutor) == [
        SignalExecutor(FID, COMMAND_EXECUTOR_ID, kill=True)
    ]
    assert not of_type(h.tick(10.0), SignalExecutor)
    # A late registration is refused.
    assert of_type(to_executor(h.start_executor("late"), "late"), ShutdownExecutor)
    # The kill's update is reliable; after its ack the task is gone.
    h.ack("t1", update.status.uuid or b"")
    assert (FID, TaskID("t1")) not in h.st.tasks
    out = h.exited(FID, CMD, -9)
    assert forwarded(out) == []
    assert only(of_type(to_master(out), ExitedExecutor)).status == -9
    assert h.st.frameworks == {}


def test_killing_a_queued_task_of_a_group_kills_the_whole_group() -> None:
    h = registered()
    info = executor_info("gexec")
    h.run_group(["g1", "g2"], info)
    h.run("solo", executor=info)
    out = kill(h, "g2")
    assert sorted(states(forwarded(out))) == [
        ("g1", TaskState.KILLED, Reason.TASK_KILLED_DURING_LAUNCH),
        ("g2", TaskState.KILLED, Reason.TASK_KILLED_DURING_LAUNCH),
    ]
    assert not of_type(out, SignalExecutor)  # "solo" still waits for the executor
    out = h.start_executor("gp", "gexec")
    assert [m.task.task_id for m in of_type(to_executor(out, "gp"), LaunchTask)] == ["solo"]


def test_killing_a_launched_task_is_the_executors_job() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    out = kill(h, "t1")
    assert to_executor(out, "cmd") == [KillTask(framework_id=FID, task_id=TaskID("t1"))]
    assert forwarded(out) == []


def test_a_task_the_master_reclaims_ends_killed_with_the_masters_reason() -> None:
    """KILL_TASK with a reason (the master's reclaim): the executor reports a plain KILLED, and
    the agent gives it the reason, so the framework learns it was preempted."""
    h = registered()
    h.run("t1")
    h.run("t2")
    h.start_executor("cmd")
    preempt = KillTask(framework_id=FID, task_id=TaskID("t1"), reason=Reason.TASK_PREEMPTED)
    out = h.master(preempt)
    assert to_executor(out, "cmd") == [KillTask(framework_id=FID, task_id=TaskID("t1"))]
    out, _ = h.update("cmd", "t1", TaskState.KILLED)
    assert states(forwarded(out)) == [("t1", TaskState.KILLED, Reason.TASK_PREEMPTED)]
    kill(h, "t2")  # a framework's own kill keeps no reason
    out, _ = h.update("cmd", "t2", TaskState.KILLED)
    assert states(forwarded(out)) == [("t2", TaskState.KILLED, None)]


def test_a_reclaimed_task_still_waiting_for_its_executor_ends_with_that_reason() -> None:
    h = registered()
    h.run("t1")
    revoke = KillTask(framework_id=FID, task_id=TaskID("t1"), reason=Reason.RESOURCES_REVOKED)
    out = h.master(revoke)
    assert states(forwarded(out)) == [("t1", TaskState.KILLED, Reason.RESOURCES_REVOKED)]


def test_the_masters_kill_reason_survives_an_agent_restart() -> None:
    from agora.agent.core import Agent

    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    h.master(KillTask(framework_id=FID, task_id=TaskID("t1"), reason=Reason.TASK_PREEMPTED))
    records = h.agent.durable_records()
    again = AgentHarness(cfg=h.cfg)
    again.agent = Agent(h.cfg)
    cmd = (FID, COMMAND_EXECUTOR_ID)
    again.agent.recover(records, h.now, alive={cmd}, cleanup=False)
    task = again.st.tasks[(FID, TaskID("t1"))]
    assert task.kill_reason is Reason.TASK_PREEMPTED


def test_killing_an_unknown_task_answers_lost_once() -> None:
    h = registered()
    out = kill(h, "ghost")
    update = only(forwarded(out))
    assert states([update]) == [("ghost", TaskState.LOST, Reason.TASK_UNKNOWN)]
    assert update.status.source is StatusSource.AGENT
    assert h.st.tasks == {} and h.st.frameworks == {} and h.st.executors == {}
    # Asked again while that answer is unacknowledged: nothing new.
    assert kill(h, "ghost") == []
    h.ack("ghost", update.status.uuid or b"")
    assert len(h.st.updates) == 0
    # Unknown framework: the same answer.
    out = kill(h, "x", FrameworkID("nobody"))
    assert states(forwarded(out)) == [("x", TaskState.LOST, Reason.TASK_UNKNOWN)]


def test_a_partition_aware_frameworks_unknown_task_is_dropped_not_lost() -> None:
    """A partition-aware framework must never hear LOST: the kill of a task whose RUN_TASK
    never arrived says DROPPED (the master says whether the framework is partition-aware, as
    the agent may never have heard of it). Found by the cluster simulation."""
    h = registered()
    message = KillTask(framework_id=FID, task_id=TaskID("ghost"), partition_aware=True)
    update = only(forwarded(h.master(message)))
    assert states([update]) == [("ghost", TaskState.DROPPED, Reason.TASK_UNKNOWN)]


def test_shutting_down_an_unknown_framework_drops_the_updates_owed_to_it() -> None:
    """The answer to a kill of a task the agent never heard of is owed to a framework it does
    not know; once the master says that framework is gone, nothing is left to resend. Found by
    the cluster simulation: the agent resent that update forever."""
    h = registered()
    update = only(forwarded(kill(h, "ghost")))
    assert update.status.state is TaskState.LOST and len(h.st.updates) == 1
    h.agent.checkpoint()
    h.master(ShutdownFramework(framework_id=FID))
    assert len(h.st.updates) == 0
    assert forwarded(h.tick(advance=600.0)) == []
    # The stream's end is made durable too: a restart does not bring the update back.
    assert [type(r).__name__ for r in h.agent.checkpoint()] == ["Delete"]


def test_reconciling_tasks_answers_for_those_the_agent_never_got() -> None:
    """After a quick restart the master asks about tasks the agent did not report: the one
    whose RUN_TASK was lost ends (DROPPED, or LOST for a framework that is not
    partition-aware); one the agent runs, or still owes an update for, needs no answer."""
    for aware, expected in ((True, TaskState.DROPPED), (False, TaskState.LOST)):
        h = registered()
        h.run("here")
        message = ReconcileTasks(
            framework_id=FID, task_ids=(TaskID("here"), TaskID("lost")), partition_aware=aware
        )
        update = only(forwarded(h.master(message)))
        assert states([update]) == [("lost", expected, Reason.TASK_UNKNOWN)]
        assert update.status.source is StatusSource.AGENT
        assert forwarded(h.master(message)) == []  # its answer is still on its way


def test_killing_a_finished_task_does_nothing() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    h.update("cmd", "t1", TaskState.FINISHED)
    assert kill(h, "t1") == []


# --- executor exit -----------------------------------------------------------------------


def test_executor_exit_fails_its_tasks_and_tells_the_master() -> None:
    h = registered()
    info = executor_info("exec-1")
    h.run("t1", executor=info)
    h.run("t2", executor=info)
    h.start_executor("ex", "exec-1")
    _, u1 = h.update("ex", "t1", TaskState.RUNNING)
    h.update("ex", "t2", TaskState.FINISHED)
    h.run("t3", executor=info)
    out = h.exited(FID, "exec-1", 137)
    exited = only(of_type(to_master(out), ExitedExecutor))
    assert (exited.framework_id, exited.executor_id, exited.status) == (FID, "exec-1", 137)
    # t1 and t3 were live; t2 was over already. t1's FAILED waits behind its RUNNING.
    t3 = only(forwarded(out))
    assert states([t3]) == [("t3", TaskState.FAILED, Reason.EXECUTOR_TERMINATED)]
    assert t3.status.message == "Executor exited with status 137"
    assert t3.status.source is StatusSource.AGENT
    pending = h.st.updates.pending(FID, TaskID("t1"))
    assert [(s.state, s.reason) for s in pending] == [
        (TaskState.RUNNING, None),
        (TaskState.FAILED, Reason.EXECUTOR_TERMINATED),
    ]
    out = h.ack("t1", u1)
    assert states(forwarded(out)) == [("t1", TaskState.FAILED, Reason.EXECUTOR_TERMINATED)]
    assert (FID, ExecutorID("exec-1")) not in h.st.executors
    assert h.st.executors_by_peer == {}
    # Gone: an exit reported twice changes nothing.
    assert h.exited(FID, "exec-1", 0) == []


def test_an_executor_exit_is_sent_again_until_the_master_acknowledges_it() -> None:
    """EXITED_EXECUTOR lost on the way would leave the executor's resources allocated at the
    master until the agent re-registered: the agent sends it again, on the status-update retry
    schedule, until EXITED_EXECUTOR_ACK names it. Found by the cluster simulation."""
    h = registered(status_update_retry=2.0, status_update_retry_max=5.0)
    info = executor_info("exec-1")
    h.run("t1", executor=info)
    h.start_executor("ex", "exec-1")
    first = only(of_type(to_master(h.exited(FID, "exec-1", 1)), ExitedExecutor))

    def resent(advance: float) -> list[ExitedExecutor]:
        return of_type(to_master(h.tick(advance=advance)), ExitedExecutor)

    assert resent(1.0) == []
    assert resent(1.0) == [first]  # 2 s after
    assert resent(3.9) == []
    assert resent(0.1) == [first]  # 4 s after that (doubled)
    assert resent(5.0) == [first]  # then capped at 5 s
    h.master(ExitedExecutorAck(framework_id=FID, executor_id=ExecutorID("other")))
    assert resent(5.0) == [first]  # an ack of another executor changes nothing
    h.master(ExitedExecutorAck(framework_id=FID, executor_id=ExecutorID("exec-1")))
    assert resent(60.0) == []


def test_an_exit_is_not_sent_again_once_a_successor_with_its_id_runs() -> None:
    """A task queued behind a terminating executor starts a fresh one with the same id: a late
    copy of the old exit must not make the master drop the successor."""
    h = registered(status_update_retry=2.0)
    info = executor_info("exec-1")
    h.run("t1", executor=info)
    h.start_executor("ex", "exec-1")
    h.master(ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1")))
    h.run("t2", executor=info)  # waits for the old one to exit
    out = h.exited(FID, "exec-1", 0)
    assert of_type(to_master(out), ExitedExecutor)
    assert (FID, ExecutorID("exec-1")) in h.st.executors  # the successor
    assert of_type(to_master(h.tick(advance=30.0)), ExitedExecutor) == []


def test_builtin_executor_exit_is_reported_too() -> None:
    h = registered()
    h.run("t1")
    h.start_executor("cmd")
    out = h.exited(FID, CMD, -11)
    assert only(of_type(to_master(out), ExitedExecutor)).executor_id == CMD
    assert states(forwarded(out)) == [("t1", TaskState.FAILED, Reason.EXECUTOR_TERMINATED)]
    assert only(forwarded(out)).status.message == "Executor exited with status -11"


def test_executor_registration_timeout_kills_it_and_fails_its_tasks() -> None:
    h = registered(executor_registration_timeout=60.0)
    h.run("t1")
    h.run("t2")
    assert not of_type(h.tick(59.0), SignalExecutor)
    out = h.tick(1.0)
    assert of_type(out, SignalExecutor) == [SignalExecutor(FID, COMMAND_EXECUTOR_ID, kill=True)]
    assert states(forwarded(out)) == [
        ("t1", TaskState.FAILED, Reason.EXECUTOR_REGISTRATION_TIMEOUT),
        ("t2", TaskState.FAILED, Reason.EXECUTOR_REGISTRATION_TIMEOUT),
    ]
    assert not of_type(h.tick(100.0), SignalExecutor)
    assert of_type(to_executor(h.start_executor("late"), "late"), ShutdownExecutor)
    out = h.exited(FID, CMD, -9)
    assert forwarded(out) == []
    assert of_type(to_master(out), ExitedExecutor)


def test_executor_launch_failure_fails_its_tasks() -> None:
    h = registered()
    h.run("t1", executor=executor_info("exec-1"))
    out = h.launch_failed(FID, "exec-1", "No such file: ./my-executor")
    update = only(forwarded(out))
    assert states([update]) == [("t1", TaskState.FAILED, Reason.CONTAINER_LAUNCH_FAILED)]
    assert "No such file" in update.status.message
    assert only(of_type(to_master(out), ExitedExecutor)).status == LAUNCH_FAILED_STATUS
    assert h.st.executors == {}
    assert h.launch_failed(FID, "exec-1", "again") == []


# --- shutdown ------------------------------------------------------------------------------


def test_shutdown_executor_asks_then_kills_after_the_grace_period() -> None:
    h = registered(executor_shutdown_grace_period=5.0)
    info = executor_info("exec-1")
    h.run("t1", executor=info)
    h.start_executor("ex", "exec-1")
    h.update("ex", "t1", TaskState.RUNNING)
    out = h.master(ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1")))
    assert to_executor(out, "ex") == [
        ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1"))
    ]
    assert not of_type(out, SignalExecutor)
    assert kill(h, "t1") == []  # it is the executor's to stop now
    # Asked twice: nothing more.
    assert h.master(ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1"))) == []
    assert not of_type(h.tick(4.0), SignalExecutor)
    assert of_type(h.tick(1.0), SignalExecutor) == [
        SignalExecutor(FID, ExecutorID("exec-1"), kill=True)
    ]
    out = h.exited(FID, "exec-1", -9)
    pending = h.st.updates.pending(FID, TaskID("t1"))
    assert [(s.state, s.reason) for s in pending][-1] == (
        TaskState.KILLED,
        Reason.EXECUTOR_TERMINATED,
    )
    assert of_type(to_master(out), ExitedExecutor)


def test_shutdown_of_a_launching_executor_kills_its_queued_tasks() -> None:
    h = registered()
    h.run("t1", executor=executor_info("exec-1"))
    out = h.master(ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1")))
    assert states(forwarded(out)) == [("t1", TaskState.KILLED, Reason.TASK_KILLED_DURING_LAUNCH)]
    assert of_type(out, SignalExecutor) == [SignalExecutor(FID, ExecutorID("exec-1"), kill=False)]


def test_shutdown_framework_stops_everything_and_forgets_the_framework() -> None:
    h = registered(executor_shutdown_grace_period=5.0)
    h.run("t1")
    h.run("t2", executor=executor_info("exec-1"))
    h.run("t0")
    h.start_executor("cmd")
    _, u1 = h.update("cmd", "t1", TaskState.RUNNING)
    h.update("cmd", "t0", TaskState.FINISHED)  # over, its update unacknowledged
    other = FrameworkID("fw-2")
    h.run("o1", framework_id=other)
    out = h.master(ShutdownFramework(framework_id=FID))
    assert to_executor(out, "cmd") == [
        ShutdownExecutor(framework_id=FID, executor_id=COMMAND_EXECUTOR_ID)
    ]
    assert of_type(out, SignalExecutor) == [SignalExecutor(FID, ExecutorID("exec-1"), kill=False)]
    assert forwarded(out) == []  # nobody would acknowledge them
    assert h.st.updates.pending(FID, TaskID("t1")) == ()
    assert (FID, TaskID("t2")) not in h.st.tasks  # never ran
    assert (FID, TaskID("t0")) not in h.st.tasks  # over; nobody will acknowledge it
    assert kill(h, "t1") == []  # the executor is already stopping it
    # Work for it is refused meanwhile; its updates are acked to the executor, not forwarded.
    assert h.run("t9") == []
    out, _ = h.update("cmd", "t1", TaskState.KILLED)
    assert forwarded(out) == []
    assert (FID, TaskID("t1")) not in h.st.tasks
    kills = of_type(h.tick(5.0), SignalExecutor)
    assert sorted(s.executor_id for s in kills) == ["agora-command", "exec-1"]
    assert all(s.kill for s in kills)
    h.exited(FID, CMD, 0)
    out = h.exited(FID, "exec-1", -9)
    assert forwarded(out) == []
    assert FID not in h.st.frameworks
    assert other in h.st.frameworks  # untouched
    # Once gone, the framework may come back (a new RUN_TASK starts afresh).
    assert of_type(h.run("t10"), LaunchExecutor)
    assert u1


def test_idle_command_executor_is_shut_down_after_the_idle_timeout() -> None:
    h = registered(command_executor_idle_timeout=10.0, executor_shutdown_grace_period=5.0)
    h.run("t1")
    h.start_executor("cmd")
    assert not of_type(to_executor(h.tick(30.0), "cmd"), ShutdownExecutor)  # busy
    _, u1 = h.update("cmd", "t1", TaskState.FINISHED)
    assert not of_type(to_executor(h.tick(9.0), "cmd"), ShutdownExecutor)
    out = h.tick(1.0)
    assert to_executor(out, "cmd") == [
        ShutdownExecutor(framework_id=FID, executor_id=COMMAND_EXECUTOR_ID)
    ]
    # A task arriving while it terminates waits for a fresh executor.
    out = h.run("t2")
    assert not of_type(out, LaunchExecutor)
    assert not to_executor(out, "cmd")
    out = h.exited(FID, CMD, 0)
    assert forwarded(out) == []  # t1 was over; t2 belongs to the next executor
    assert only(of_type(out, LaunchExecutor)).builtin
    out = h.start_executor("cmd2")
    assert [m.task.task_id for m in of_type(to_executor(out, "cmd2"), LaunchTask)] == ["t2"]
    assert h.st.tasks[(FID, TaskID("t2"))].state is TaskState.STAGING
    h.ack("t1", u1)
    assert (FID, TaskID("t1")) not in h.st.tasks


def test_a_new_task_keeps_the_command_executor_from_idling() -> None:
    h = registered(command_executor_idle_timeout=10.0)
    h.run("t1")
    h.start_executor("cmd")
    h.update("cmd", "t1", TaskState.FINISHED)
    h.tick(9.0)
    h.run("t2")
    assert not of_type(to_executor(h.tick(5.0), "cmd"), ShutdownExecutor)
    h.update("cmd", "t2", TaskState.FAILED)
    assert not of_type(to_executor(h.tick(9.9), "cmd"), ShutdownExecutor)
    assert of_type(to_executor(h.tick(0.1), "cmd"), ShutdownExecutor)


def test_custom_executors_do_not_idle_out() -> None:
    h = registered(command_executor_idle_timeout=1.0)
    h.run("t1", executor=executor_info("exec-1"))
    h.start_executor("ex", "exec-1")
    h.update("ex", "t1", TaskState.FINISHED)
    assert not of_type(to_executor(h.tick(100.0), "ex"), ShutdownExecutor)
    assert h.st.executors[(FID, ExecutorID("exec-1"))].state is ExecutorState.RUNNING


def test_a_terminating_executor_that_reconnects_is_told_again() -> None:
    h = registered()
    h.run("t1", executor=executor_info("exec-1"))
    h.start_executor("ex", "exec-1")
    h.master(ShutdownFramework(framework_id=FID))
    again = ReregisterExecutor(
        framework_id=FID, executor_id=ExecutorID("exec-1"), secret=h.secret("exec-1")
    )
    out = h.executor("ex2", again)
    assert to_executor(out, "ex2") == [
        ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-1"))
    ]
    assert h.st.executors_by_peer == {"ex2": (FID, ExecutorID("exec-1"))}
    # Its messages for the framework go nowhere now.
    msg = ExecutorToFramework(framework_id=FID, executor_id=ExecutorID("exec-1"), data=b"x")
    assert h.executor("ex2", msg) == []
