"""Agent core: the disk/du isolator's decisions (sizes in, kills out) and sandbox GC planning."""

from __future__ import annotations

from agora.agent.core import COMMAND_EXECUTOR_ID, Agent, ExecutorState, ToExecutor, ToMaster
from agora.agent.core.limits import MIB, DiskTarget
from agora.agent.core.sandbox_gc import SandboxGc, live_sandboxes, max_allowed_age, task_of
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import KillTask, Reason, ShutdownExecutor, StatusSource, TaskState
from support.agent_kit import (
    FID,
    AgentHarness,
    executor_info,
    forwarded,
    only,
    to_executor,
    wire,
)

CMD = ExecutorID(str(COMMAND_EXECUTOR_ID))
SANDBOX = f"frameworks/{FID}/executors/{CMD}"


def running(h: AgentHarness, *tasks: tuple[str, str]) -> None:
    """Command tasks (id, resources) launched and RUNNING on executor peer "cmd"."""
    for task_id, resources in tasks:
        h.run(task_id, resources=resources)
    h.start_executor("cmd")
    for task_id, _ in tasks:
        _out, uuid = h.update("cmd", task_id, TaskState.RUNNING)
        h.ack(task_id, uuid)


def registered() -> AgentHarness:
    h = AgentHarness()
    h.register()
    return h


def usage(h: AgentHarness, sizes: dict[tuple[str, str, str | None], int]) -> list[object]:
    used = {
        (FrameworkID(f), ExecutorID(e), TaskID(t) if t else None): n
        for (f, e, t), n in sizes.items()
    }
    out = h.agent.disk_usage(used, h.now)
    for action in out:  # what the core says must travel
        if isinstance(action, ToMaster | ToExecutor):
            wire(action.message)
    return list(out)


# --- the disk/du isolator ----------------------------------------------------------------------


def test_targets_are_launched_live_command_tasks_and_custom_executors() -> None:
    h = registered()
    running(h, ("t1", "cpus:1;mem:32;disk:1"), ("t2", "cpus:1;mem:32"))
    h.run("waiting", resources="cpus:1;mem:32;disk:5", executor=executor_info("ex"))
    targets = {t.key: t for t in h.agent.disk_targets()}
    assert targets[(FID, CMD, TaskID("t1"))] == DiskTarget(
        FID, CMD, TaskID("t1"), f"{SANDBOX}/tasks/t1", MIB
    )
    assert targets[(FID, CMD, TaskID("t2"))].limit_bytes == 0  # measured, not limited
    # A custom executor that has not registered yet has nothing running to measure.
    assert (FID, ExecutorID("ex"), None) not in targets
    h.start_executor("ex-peer", "ex")
    custom = {t.key: t for t in h.agent.disk_targets()}[(FID, ExecutorID("ex"), None)]
    assert custom.sandbox == f"frameworks/{FID}/executors/ex"
    assert custom.limit_bytes == 5 * MIB  # the executor's own (no disk) plus its task's


def test_a_task_over_its_disk_is_killed_and_fails_with_the_reason_and_message() -> None:
    h = registered()
    running(h, ("big", "cpus:1;mem:32;disk:1"), ("small", "cpus:1;mem:32;disk:1"))
    out = usage(h, {(FID, CMD, "big"): 3 * MIB, (FID, CMD, "small"): MIB})  # at the limit: fine
    assert to_executor(out, "cmd") == [KillTask(framework_id=FID, task_id=TaskID("big"))]
    # Measured again while it dies: not killed twice, not a target any more.
    assert usage(h, {(FID, CMD, "big"): 4 * MIB}) == []
    assert (FID, CMD, TaskID("big")) not in {t.key for t in h.agent.disk_targets()}
    # The executor reports the kill; the master hears of a disk limitation.
    out, _ = h.update("cmd", "big", TaskState.KILLED)
    status = only(forwarded(out)).status
    assert status.state is TaskState.FAILED
    assert status.reason is Reason.CONTAINER_LIMITATION_DISK
    assert status.message == "Disk usage (3.0 MB) exceeds quota (1.0 MB)"
    assert status.source is StatusSource.AGENT
    assert h.st.tasks[(FID, TaskID("small"))].state is TaskState.RUNNING


def test_a_task_limited_then_lost_with_its_executor_fails_with_the_reason() -> None:
    h = registered()
    running(h, ("big", "cpus:1;mem:32;disk:1"))
    usage(h, {(FID, CMD, "big"): 2 * MIB})
    out = h.exited(FID, CMD, -9)
    status = only(forwarded(out)).status
    assert (status.state, status.reason) == (TaskState.FAILED, Reason.CONTAINER_LIMITATION_DISK)
    assert "exceeds quota (1.0 MB)" in status.message


def test_the_limitation_survives_an_agent_restart() -> None:
    h = registered()
    running(h, ("big", "cpus:1;mem:32;disk:1"))
    usage(h, {(FID, CMD, "big"): 2 * MIB})
    records = h.agent.durable_records()
    fresh = Agent(h.cfg)
    fresh.recover(records, h.now, alive={(FID, CMD)}, cleanup=False)
    task = fresh.state.tasks[(FID, TaskID("big"))]
    assert task.limitation == (
        Reason.CONTAINER_LIMITATION_DISK,
        "Disk usage (2.0 MB) exceeds quota (1.0 MB)",
    )


def test_no_disk_resource_no_limit() -> None:
    h = registered()
    running(h, ("free", "cpus:1;mem:32"))
    assert usage(h, {(FID, CMD, "free"): 10_000 * MIB}) == []


def test_a_custom_executor_over_its_disk_is_shut_down_and_its_tasks_fail() -> None:
    h = registered()
    info = executor_info("ex")
    h.run("t1", resources="cpus:1;mem:32;disk:2", executor=info)
    h.start_executor("ex-peer", "ex")
    out = usage(h, {(FID, "ex", None): 3 * MIB})
    assert to_executor(out, "ex-peer") == [
        ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("ex"))
    ]
    assert h.st.executors[(FID, ExecutorID("ex"))].state is ExecutorState.TERMINATING
    # Its executor reports the task killed on the shutdown: still a disk limitation.
    out, _ = h.update("ex-peer", "t1", TaskState.KILLED)
    status = only(forwarded(out)).status
    assert (status.state, status.reason) == (TaskState.FAILED, Reason.CONTAINER_LIMITATION_DISK)
    assert status.message == "Disk usage (3.0 MB) exceeds quota (2.0 MB)"


def test_sizes_of_containers_that_ended_meanwhile_are_ignored() -> None:
    h = registered()
    running(h, ("t1", "cpus:1;mem:32;disk:1"))
    out, _uuid = h.update("cmd", "t1", TaskState.FINISHED)
    assert usage(h, {(FID, CMD, "t1"): 5 * MIB}) == []
    assert only(forwarded(out)).status.state is TaskState.FINISHED


# --- sandbox garbage collection ------------------------------------------------------------------

DAY = 86400.0


def test_max_allowed_age_shrinks_as_the_disk_fills() -> None:
    week = 7 * DAY
    assert max_allowed_age(week, 0.0, 0.1) == week * 0.9
    assert max_allowed_age(week, 0.5, 0.1) == week * 0.4
    assert max_allowed_age(week, 0.9, 0.1) == 0.0
    assert max_allowed_age(week, 0.99, 0.1) == 0.0


def test_collects_after_the_delay_never_a_live_sandbox() -> None:
    gc = SandboxGc(gc_delay=10 * DAY, disk_headroom=0.1)
    old = "frameworks/f/executors/old"
    live = "frameworks/f/executors/live"
    done_task = f"{live}/tasks/done"
    live_task = f"{live}/tasks/running"
    found = {old: 0.0, live: 0.0, done_task: 0.0, live_task: 0.0}
    alive = {live, live_task}
    t0 = 1_000_000.0
    # First plan: sandboxes from before the start count from their mtime (0.0: long ago).
    plan = gc.plan(found, alive, 0.0, t0)
    assert plan.delete == (done_task, old)
    assert plan.max_age == 9 * DAY
    found = {live: 0.0, live_task: 0.0}
    # A task that ends later is scheduled then, and goes 0.9 * gc_delay after (disk empty).
    alive = {live}
    assert gc.plan(found, alive, 0.0, t0 + 1).delete == ()
    assert gc.scheduled == {live_task: t0 + 1}
    assert gc.plan(found, alive, 0.0, t0 + 1 + 9 * DAY - 1).delete == ()
    assert gc.plan(found, alive, 0.0, t0 + 1 + 9 * DAY).delete == (live_task,)
    # The live executor's sandbox is never collected, however old.
    assert gc.plan({live: 0.0}, alive, 0.95, t0 + 100 * DAY).delete == ()


def test_a_fuller_disk_collects_sooner() -> None:
    gc = SandboxGc(gc_delay=10 * DAY, disk_headroom=0.1)
    sandbox = "frameworks/f/executors/e"
    t0 = 5_000.0
    gc.plan({sandbox: t0}, set(), 0.0, t0)
    # Half full: 10 d * (1 - 0.1 - 0.5) = 4 days.
    assert gc.plan({sandbox: t0}, set(), 0.5, t0 + 4 * DAY - 1).delete == ()
    assert gc.plan({sandbox: t0}, set(), 0.5, t0 + 4 * DAY).delete == (sandbox,)
    # At 90 % or more, everything scheduled goes at once.
    other = "frameworks/f/executors/e2"
    gc.plan({other: t0}, set(), 0.0, t0)
    assert gc.plan({other: t0}, set(), 0.92, t0 + 1).delete == (other,)


def test_a_sandbox_live_again_is_unscheduled_and_its_clock_restarts() -> None:
    gc = SandboxGc(gc_delay=100.0, disk_headroom=0.0)
    sandbox = "frameworks/f/executors/agora-command"
    gc.plan({sandbox: 0.0}, {sandbox}, 0.0, 1000.0)
    gc.plan({sandbox: 0.0}, set(), 0.0, 1010.0)  # the executor exited
    assert gc.scheduled == {sandbox: 1010.0}
    gc.plan({sandbox: 0.0}, {sandbox}, 0.0, 1050.0)  # relaunched with the same id
    assert gc.scheduled == {}
    gc.plan({sandbox: 0.0}, set(), 0.0, 1060.0)
    assert gc.plan({sandbox: 0.0}, set(), 0.0, 1159.0).delete == ()
    assert gc.plan({sandbox: 0.0}, set(), 0.0, 1160.0).delete == (sandbox,)


def test_an_executor_sandbox_goes_whole_and_its_tasks_are_not_listed_twice() -> None:
    gc = SandboxGc(gc_delay=100.0, disk_headroom=0.0)
    ex = "frameworks/f/executors/e"
    found = {ex: 0.0, f"{ex}/tasks/a": 0.0, f"{ex}/tasks/b": 0.0, "frameworks/f/executors/e-2": 0.0}
    plan = gc.plan(found, set(), 0.0, 1000.0)
    assert plan.delete == (ex, "frameworks/f/executors/e-2")
    assert gc.scheduled == {}


def test_a_vanished_sandbox_is_forgotten() -> None:
    gc = SandboxGc(gc_delay=100.0, disk_headroom=0.0)
    gc.plan({"frameworks/f/executors/e": 950.0}, set(), 0.0, 1000.0)
    assert gc.scheduled
    gc.plan({}, set(), 0.0, 1001.0)
    assert gc.scheduled == {}


def test_live_sandboxes_of_the_core() -> None:
    h = registered()
    running(h, ("t1", "cpus:1;mem:32"), ("t2", "cpus:1;mem:32"))
    _out, _ = h.update("cmd", "t2", TaskState.FINISHED)
    assert live_sandboxes(h.st) == {SANDBOX, f"{SANDBOX}/tasks/t1"}
    assert h.agent.live_sandboxes() == live_sandboxes(h.st)  # what the collector reads
    assert task_of(f"{SANDBOX}/tasks/t1") == (FID, str(CMD), "t1")
    assert task_of(SANDBOX) is None
