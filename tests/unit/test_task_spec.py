"""TaskSpec -> TaskInfo: commands, executors, and matching resources to an offer's role."""

from __future__ import annotations

import pytest
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import CommandInfo, ExecutorInfo, Offer, TaskInfo
from agora.sdk.resources import Resources
from agora.sdk.scheduler import TaskSpec, fit_resources
from agora.sdk.scheduler.spec import task_infos_for


def offer(resources: str, role: str = "*", oid: str = "O1", agent: str = "A1") -> Offer:
    return Offer(
        offer_id=OfferID(oid),
        framework_id=FrameworkID("F1"),
        agent_id=AgentID(agent),
        hostname="h",
        role=role,
        resources=Resources.parse(resources),
    )


def test_shell_and_argv_commands() -> None:
    shell = TaskSpec("web", "python -m http.server", "cpus:1;mem:64", environment={"X": "1"})
    info = shell.to_task_info(offer("cpus:2;mem:128"))
    assert info.task_id == TaskID("web") and info.name == "web" and info.agent_id == "A1"
    assert info.command == CommandInfo(value="python -m http.server", environment={"X": "1"})
    argv = TaskSpec("a", ["/bin/echo", "hi"], Resources.parse("cpus:1"), task_id="a-1")
    info = argv.to_task_info(offer("cpus:2"))
    assert info.task_id == "a-1" and info.name == "a"
    assert info.command == CommandInfo(argv=("/bin/echo", "hi"), shell=False)
    assert info.executor is None and info.resources == Resources.parse("cpus:1")


def test_custom_executor_gets_the_framework_id_of_the_offer() -> None:
    executor = ExecutorInfo(
        executor_id=ExecutorID("e"), framework_id=FrameworkID(""), command=CommandInfo(value="x")
    )
    spec = TaskSpec("t", "", "cpus:1", executor=executor, data=b"payload")
    info = spec.to_task_info(offer("cpus:1"))
    assert info.command is None and info.executor is not None
    assert info.executor.framework_id == "F1" and info.data == b"payload"


def test_invalid_specs() -> None:
    with pytest.raises(ValueError):
        TaskSpec("t", "", "cpus:1")
    with pytest.raises(ValueError):
        TaskSpec("t", (), "cpus:1")
    executor = ExecutorInfo(
        executor_id=ExecutorID("e"), framework_id=FrameworkID("F"), command=CommandInfo(value="x")
    )
    with pytest.raises(ValueError):
        TaskSpec("t", "echo", "cpus:1", executor=executor)
    with pytest.raises(ValueError):
        TaskSpec("t", "x", "cpus:lots")
    with pytest.raises(ValueError, match="does not fit"):
        TaskSpec("t", "x", "cpus:4").to_task_info(offer("cpus:2"))


def test_fit_takes_the_roles_reservation_first() -> None:
    available = Resources.parse("cpus(batch):1;cpus:4;mem(batch):512;ports(batch):[31000-31010]")
    need = Resources.parse("cpus:3;mem:256;ports:[31000-31001]")
    fitted = fit_resources(need, available, "batch")
    assert fitted == Resources.parse(
        "cpus(batch):1;cpus:2;mem(batch):256;ports(batch):[31000-31001]"
    )
    assert fit_resources(need, available, "*") is None  # unreserved alone is not enough (mem)
    assert fit_resources(Resources.parse("cpus:6"), available, "batch") is None
    # Already-annotated needs are taken as written.
    exact = Resources.parse("cpus(batch):1")
    assert fit_resources(exact, available, "batch") == exact


def test_task_infos_for_places_tasks_on_what_is_left() -> None:
    offers = [offer("cpus:2;mem:256", oid="O1"), offer("cpus:1;mem:64", oid="O2")]
    raw = TaskInfo(
        task_id=TaskID("raw"),
        name="raw",
        agent_id=AgentID("A1"),
        resources=Resources.parse("cpus:1"),
        command=CommandInfo(value="x"),
    )
    specs: list[TaskSpec | TaskInfo] = [
        raw,
        TaskSpec("a", "x", "cpus:1;mem:128"),
        TaskSpec("b", "x", "cpus:1;mem:64"),
    ]
    ids, infos = task_infos_for(offers, specs)
    assert ids == ("O1", "O2") and [i.task_id for i in infos] == ["raw", "a", "b"]
    assert infos[0] is raw
    with pytest.raises(ValueError, match="does not fit"):
        task_infos_for(offers, [*specs, TaskSpec("c", "x", "cpus:1")])
    with pytest.raises(ValueError, match="different agents"):
        task_infos_for([offers[0], offer("cpus:1", oid="O3", agent="A2")], specs)
    with pytest.raises(ValueError):
        task_infos_for([], specs)
