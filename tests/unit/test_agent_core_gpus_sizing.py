"""The agent core decides GPU assignment and executor container sizes: events in, actions out.

GPUs: each command task gets exactly the GPUs it asks for (lowest free first), in its launch's
environment; a task asking for more than are free gets none and the shell hears GpusUnavailable;
a task's GPUs are free again once it is over; the assignment is in the checkpoint, so a core
recovered from it (or from an older agent's gpus.json) never hands out a GPU twice.
Sizing: a custom executor's container holds its resources and its live tasks', given in
LaunchExecutor and in a ResizeExecutor before each launch and after each task ends.
"""

from __future__ import annotations

from typing import Any

import pytest
from agora.agent.core import (
    Action,
    Agent,
    Delete,
    GpusUnavailable,
    LaunchExecutor,
    Put,
    ResizeExecutor,
    ToExecutor,
)
from agora.agent.core.checkpoint import TASK, TaskRecord, pair_key
from agora.sdk.codec import unpack_record
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    LaunchTask,
    LaunchTaskGroup,
    ReregisterExecutor,
    TaskInfo,
    TaskState,
)
from agora.sdk.resources import Resources
from support.agent_kit import (
    FID,
    AgentHarness,
    config,
    executor_info,
    of_type,
    only,
    to_executor,
)

CMD = ExecutorID("agora-command")


def gpu_harness(gpus: tuple[int, ...] | None = (0, 1, 2)) -> AgentHarness:
    h = AgentHarness(cfg=config(gpus=gpus, resources=Resources.parse("cpus:8;mem:8192;gpus:3")))
    h.register()
    return h


def launched(actions: list[Action], peer: str = "e1") -> dict[str, TaskInfo]:
    """The tasks handed to the executor at ``peer``, by task id."""
    out: dict[str, TaskInfo] = {}
    for message in to_executor(actions, peer):
        if isinstance(message, LaunchTask):
            out[message.task.task_id] = message.task
        elif isinstance(message, LaunchTaskGroup):
            out.update((t.task_id, t) for t in message.task_group.tasks)
    return out


def visible(info: TaskInfo) -> str | None:
    assert info.command is not None
    return info.command.environment.get("CUDA_VISIBLE_DEVICES")


# --- GPU assignment ---------------------------------------------------------------------------


def test_each_task_gets_exactly_its_gpus_lowest_free_first() -> None:
    h = gpu_harness()
    h.run("two", resources="cpus:1;mem:64;gpus:2")
    out = h.start_executor("e1")
    out += h.run("one", resources="cpus:1;mem:64;gpus:1")
    out += h.run("none", resources="cpus:1;mem:64")
    tasks = launched(out)
    assert visible(tasks["two"]) == "0,1"
    assert visible(tasks["one"]) == "2"
    assert visible(tasks["none"]) == ""  # a task asking for none sees none
    env = tasks["two"].command.environment  # type: ignore[union-attr]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert h.agent.task(FID, TaskID("two")).gpus == (0, 1)  # type: ignore[union-attr]
    assert h.agent.task(FID, TaskID("none")).gpus == ()  # type: ignore[union-attr]
    assert not of_type(out, GpusUnavailable)


def test_a_fractional_request_rounds_up_to_whole_gpus() -> None:
    h = gpu_harness()
    h.run("half", resources="cpus:1;mem:64;gpus:0.5")
    assert visible(launched(h.start_executor("e1"))["half"]) == "0"


def test_without_gpu_isolation_launches_are_left_alone() -> None:
    h = gpu_harness(gpus=None)
    h.run("a", resources="cpus:1;mem:64;gpus:1")
    info = launched(h.start_executor("e1"))["a"]
    assert visible(info) is None
    assert h.agent.task(FID, TaskID("a")).gpus == ()  # type: ignore[union-attr]


def test_a_task_asking_for_more_than_are_free_gets_none_and_the_shell_hears() -> None:
    h = gpu_harness(gpus=(0,))
    h.run("first", resources="cpus:1;mem:64;gpus:1")
    h.start_executor("e1")
    out = h.run("second", resources="cpus:1;mem:64;gpus:1")
    assert visible(launched(out)["second"]) == ""
    refusal = only(of_type(out, GpusUnavailable))
    assert refusal.framework_id == FID and refusal.task_id == "second"
    assert refusal.error == f"{FID}/second wants 1 GPUs, 0 of 1 are free"
    assert h.agent.task(FID, TaskID("second")).gpus == ()  # type: ignore[union-attr]


def test_gpus_are_free_again_when_the_task_is_over() -> None:
    h = gpu_harness(gpus=(0, 1))
    h.run("a", resources="cpus:1;mem:64;gpus:2")
    h.start_executor("e1")
    h.update("e1", "a", TaskState.RUNNING)
    out, _uuid = h.update("e1", "a", TaskState.FINISHED)
    assert h.agent.task(FID, TaskID("a")).gpus == ()  # type: ignore[union-attr]
    # Released at once (not when the master acknowledges): the next task gets them.
    out = h.run("b", resources="cpus:1;mem:64;gpus:2")
    assert visible(launched(out)["b"]) == "0,1"
    assert not of_type(out, GpusUnavailable)


def test_task_group_members_are_told_their_gpus_too() -> None:
    h = gpu_harness()
    h.run_group(["g1", "g2"], executor_info("grp"))
    h.start_executor("e9", executor_id="grp")
    tasks = launched(h.actions, "e9")  # they ask for none: they are shown none
    assert visible(tasks["g1"]) == "" and visible(tasks["g2"]) == ""


# --- the checkpoint -------------------------------------------------------------------------


def journal(records: dict[tuple[str, str], bytes], changes: list[Put | Delete]) -> None:
    for change in changes:
        if isinstance(change, Put):
            records[(change.kind, change.key)] = change.value
        else:
            records.pop((change.kind, change.key), None)


def test_the_assignment_is_checkpointed_and_survives_recovery() -> None:
    h = gpu_harness()
    records: dict[tuple[str, str], bytes] = {}
    journal(records, h.agent.checkpoint())
    h.run("held", resources="cpus:1;mem:64;gpus:2")
    journal(records, h.agent.checkpoint())
    h.start_executor("e1")
    journal(records, h.agent.checkpoint())
    saved = unpack_record(TaskRecord, records[(TASK, pair_key(FID, "held"))])
    assert saved.gpus == (0, 1)

    fresh = Agent(h.cfg)
    fresh.recover(records, h.now, alive={(FID, CMD)}, cleanup=False)
    assert fresh.task(FID, TaskID("held")).gpus == (0, 1)  # type: ignore[union-attr]
    h2 = _adopt(h, fresh)
    held = fresh.task(FID, TaskID("held"))
    assert held is not None
    secret = h.secret("agora-command")
    rereg = ReregisterExecutor(framework_id=FID, executor_id=CMD, tasks=(held.info,), secret=secret)
    out = h2.executor("e2", rereg)
    assert held.gpus == (0, 1)  # the executor runs it still
    out += h2.run("next", resources="cpus:1;mem:64;gpus:1")
    assert visible(launched(out, "e2")["next"]) == "2"  # never one a recovered task holds
    out = h2.run("late", resources="cpus:1;mem:64;gpus:1")
    assert only(of_type(out, GpusUnavailable)).task_id == "late"


def test_recovery_takes_an_older_agents_gpus_json_for_tasks_without_gpus() -> None:
    old = gpu_harness(gpus=None)  # an agent that kept its assignments in gpus.json
    old.run("a", resources="cpus:1;mem:64;gpus:1")
    old.start_executor("e1")
    records = old.agent.durable_records()
    fresh = Agent(config(gpus=(0, 1), resources=old.cfg.resources))
    legacy = {f"{FID}/a": [1], f"{FID}/gone": [0], "junk": [7]}
    fresh.recover(records, old.now, alive={(FID, CMD)}, cleanup=False, legacy_gpus=legacy)
    assert fresh.task(FID, TaskID("a")).gpus == (1,)  # type: ignore[union-attr]
    changed = [c for c in fresh.checkpoint() if isinstance(c, Put) and c.kind == TASK]
    assert unpack_record(TaskRecord, only(changed).value).gpus == (1,)  # durable now


def _adopt(h: AgentHarness, agent: Agent) -> AgentHarness:
    """A harness around a recovered core (same clock and config), registered again."""
    h2 = AgentHarness(cfg=h.cfg, now=h.now)
    h2.agent = agent
    h2.register()
    return h2


# --- executor container sizes ----------------------------------------------------------------


def sizes(actions: list[Action]) -> list[Resources]:
    return [a.resources for a in of_type(actions, ResizeExecutor)]


def test_a_custom_executor_is_sized_for_itself_and_its_live_tasks() -> None:
    h = gpu_harness()
    ex = executor_info()  # cpus:0.1;mem:32
    out = h.run("t1", executor=ex, resources="cpus:1;mem:128")
    launch = only(of_type(out, LaunchExecutor))
    assert launch.resources == Resources.parse("cpus:1.1;mem:160")
    assert h.agent.executor_size(FID, ExecutorID("exec-1")) == launch.resources

    out = h.start_executor("e5", executor_id="exec-1")
    assert sizes(out) == [Resources.parse("cpus:1.1;mem:160")]
    out = h.run("t2", executor=ex, resources="cpus:2;mem:256")
    assert sizes(out) == [Resources.parse("cpus:3.1;mem:416")]
    # The resize comes before the launch that needs it.
    kinds = [type(a) for a in out if isinstance(a, ResizeExecutor | ToExecutor)]
    assert kinds == [ResizeExecutor, ToExecutor]

    out, _ = h.update("e5", "t1", TaskState.FINISHED)
    assert sizes(out) == [Resources.parse("cpus:2.1;mem:288")]  # shrinks when a task ends
    out, _ = h.update("e5", "t2", TaskState.FAILED)
    assert sizes(out) == [Resources.parse("cpus:0.1;mem:32")]


def test_the_command_executor_is_never_sized() -> None:
    h = gpu_harness()
    out = h.run("c1")
    assert only(of_type(out, LaunchExecutor)).resources == Resources()
    out = h.start_executor("e1")
    out += h.update("e1", "c1", TaskState.FINISHED)[0]
    assert sizes(out) == []


# --- read functions -------------------------------------------------------------------------


def test_read_functions_show_the_state_without_handing_it_out() -> None:
    h = gpu_harness()
    ex = executor_info()
    h.run("t1", executor=ex)
    h.run("c1")
    agent = h.agent
    eid = ExecutorID("exec-1")
    assert agent.registered and agent.master_epoch == h.epoch
    assert agent.config is h.cfg
    assert set(agent.tasks()) == {(FID, TaskID("t1")), (FID, TaskID("c1"))}
    assert agent.task(FID, TaskID("t1")) is agent.tasks()[(FID, TaskID("t1"))]
    assert agent.task(FID, TaskID("nope")) is None
    assert agent.executor(FID, eid) is agent.executors()[(FID, eid)]
    assert agent.executor(FrameworkID("other"), eid) is None
    assert [t.info.task_id for t in agent.tasks_of(FID, eid)] == ["t1"]
    assert agent.tasks_of(FID, ExecutorID("nope")) == []
    assert agent.framework(FID) is agent.frameworks()[FID]
    assert agent.executor_size(FID, ExecutorID("nope")) == Resources()
    assert agent.unacknowledged_updates() == 0
    views: list[Any] = [agent.tasks(), agent.executors(), agent.frameworks()]
    for view in views:
        with pytest.raises(TypeError):
            view[next(iter(view))] = None
