"""Mesos TaskInfo/CommandInfo/ExecutorInfo -> Agora, and task statuses both ways."""

from __future__ import annotations

import copy

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.mesos import (
    command_from_mesos,
    executor_info_from_mesos,
    task_info_from_mesos,
    task_status_from_mesos,
    task_status_to_mesos,
)
from agora.sdk.messages.common import CommandInfo, TaskStatus
from agora.sdk.messages.container import URI
from agora.sdk.messages.enums import Reason, StatusSource, TaskState
from agora.sdk.resources import Resources

FID = FrameworkID("fw-1")

TASK: dict[str, object] = {
    "name": "web",
    "task_id": {"value": "t-1"},
    "agent_id": {"value": "a-1"},
    "resources": [
        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
        {"name": "mem", "type": "SCALAR", "scalar": {"value": 128}},
    ],
    "command": {
        "value": "echo hi",
        "environment": {"variables": [{"name": "A", "value": "1"}]},
        "uris": [{"value": "http://x/y.tgz", "cache": True}],
        "user": "nobody",
    },
    "labels": {"labels": [{"key": "k", "value": "v"}]},
    "data": "aGk=",
    "kill_policy": {"grace_period": {"nanoseconds": 3_000_000_000}},
}


def test_task_info_from_mesos() -> None:
    t = task_info_from_mesos(TASK)
    assert t.task_id == TaskID("t-1")
    assert t.agent_id == AgentID("a-1")
    assert t.name == "web"
    assert t.resources == Resources.parse("cpus:0.5;mem:128")
    assert t.command == CommandInfo(
        value="echo hi",
        environment={"A": "1"},
        uris=(URI(value="http://x/y.tgz", cache=True),),
        user="nobody",
    )
    assert t.labels == {"k": "v"}
    assert t.data == b"hi"
    assert t.kill_grace_period == 3.0
    assert t.executor is None


def test_task_with_executor_takes_the_framework_id() -> None:
    task = {k: v for k, v in TASK.items() if k != "command"}
    task["executor"] = {
        "executor_id": {"value": "e-1"},
        "command": {"shell": False, "value": "/bin/x", "arguments": ["/bin/x", "-v"]},
        "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}],
        "type": "CUSTOM",
    }
    t = task_info_from_mesos(task, framework_id=FID)
    assert t.executor is not None
    assert t.executor.executor_id == ExecutorID("e-1")
    assert t.executor.framework_id == FID
    assert t.executor.command.argv == ("/bin/x", "-v")
    assert t.executor.command.shell is False
    assert t.executor.command.value is None


def test_argv_command_without_arguments_runs_value() -> None:
    assert command_from_mesos({"shell": False, "value": "/bin/true"}).argv == ("/bin/true",)


def _without(d: dict[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in d.items() if k != key}


def _with(path: tuple[str, ...], value: object) -> dict[str, object]:
    d = copy.deepcopy(TASK)
    cur: dict[str, object] = d
    for p in path[:-1]:
        nxt = cur[p]
        assert isinstance(nxt, dict)
        cur = nxt
    cur[path[-1]] = value
    return d


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ([], "task_info"),
        (_without(TASK, "name"), "task_info.name"),
        (_without(TASK, "task_id"), "task_info.task_id"),
        (_without(TASK, "agent_id"), "task_info.agent_id"),
        (_without(TASK, "resources"), "task_info.resources"),
        (_without(TASK, "command"), "task_info"),
        (_with(("container",), {"type": "DOCKER"}), "task_info.container"),
        (_with(("health_check",), {}), "task_info.health_check"),
        (_with(("name",), 5), "task_info.name"),
        (_with(("data",), "not base64!"), "task_info.data"),
        (_with(("task_id",), {"value": "a b"}), "task_info.task_id.value"),
        (_with(("command", "shell"), "yes"), "task_info.command.shell"),
        (_with(("command", "arguments"), ["x"]), "task_info.command.arguments"),
        (_with(("command", "value"), None), "task_info.command.value"),
        (
            _with(("command", "environment"), {"variables": [{"name": "S", "type": "SECRET"}]}),
            "task_info.command.environment.variables[0].type",
        ),
        (
            _with(("command", "environment"), {"variables": [{"name": "A=B", "value": ""}]}),
            "task_info.command.environment.variables[0].name",
        ),
        (_with(("command", "uris"), [{"value": ""}]), "task_info.command.uris[0].value"),
        (
            _with(("kill_policy",), {"grace_period": {"nanoseconds": -1}}),
            "task_info.kill_policy.grace_period.nanoseconds",
        ),
        (
            _with(("labels",), {"labels": [{"key": "k"}, {"key": "k"}]}),
            "task_info.labels.labels[1].key",
        ),
        (
            _with(("resources",), [{"name": "cpus", "type": "SCALAR", "scalar": {"value": -2}}]),
            "task_info.resources[0].scalar.value",
        ),
    ],
)
def test_task_info_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        task_info_from_mesos(value)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"shell": False, "value": "/bin/a", "arguments": ["/bin/b"]}, "command.value"),
        ({"shell": False}, "command.value"),
        ({"shell": False, "arguments": [1]}, "command.arguments[0]"),
    ],
)
def test_command_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        command_from_mesos(value)
    assert info.value.field == field


def test_executor_refuses_missing_or_foreign_framework_id() -> None:
    e = {"executor_id": {"value": "e"}, "command": {"value": "x"}}
    with pytest.raises(ProtocolError) as info:
        executor_info_from_mesos(e)
    assert info.value.field == "executor.framework_id"
    with pytest.raises(ProtocolError) as info:
        executor_info_from_mesos({**e, "framework_id": {"value": "other"}}, framework_id=FID)
    assert info.value.field == "executor.framework_id"
    with pytest.raises(ProtocolError) as info:
        executor_info_from_mesos({**e, "type": "WEIRD"}, framework_id=FID)
    assert info.value.field == "executor.type"


STATUSES = [
    TaskStatus(task_id=TaskID("t"), state=TaskState.RUNNING, source=StatusSource.EXECUTOR),
    TaskStatus(
        task_id=TaskID("t-2"),
        state=TaskState.FAILED,
        source=StatusSource.AGENT,
        reason=Reason.COMMAND_EXECUTOR_FAILED,
        message="boom",
        agent_id=AgentID("a"),
        executor_id=ExecutorID("e"),
        uuid=bytes(range(16)),
        healthy=False,
        timestamp=1_700_000_000.25,
        data=b"\x00\xff",
        exit_code=137,
        cpu_seconds=1.5,
        max_rss_bytes=1 << 30,
    ),
    TaskStatus(
        task_id=TaskID("t-3"),
        state=TaskState.UNREACHABLE,
        source=StatusSource.MASTER,
        reason=Reason.AGENT_DISCONNECTED,
        unreachable_time=1_700_000_001.5,
    ),
]


@pytest.mark.parametrize("status", STATUSES)
def test_status_round_trip(status: TaskStatus) -> None:
    assert task_status_from_mesos(task_status_to_mesos(status)) == status


def test_status_to_mesos_names() -> None:
    m = task_status_to_mesos(STATUSES[1])
    assert m["state"] == "TASK_FAILED"
    assert m["source"] == "SOURCE_AGENT"
    assert m["reason"] == "REASON_COMMAND_EXECUTOR_FAILED"
    assert m["uuid"] == "AAECAwQFBgcICQoLDA0ODw=="
    assert m["task_id"] == {"value": "t-2"}
    assert task_status_to_mesos(STATUSES[2])["unreachable_time"] == {
        "nanoseconds": 1_700_000_001_500_000_000
    }


_GOOD: dict[str, object] = {
    "task_id": {"value": "t"},
    "state": "TASK_RUNNING",
    "source": "SOURCE_EXECUTOR",
}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("TASK_RUNNING", "status"),
        (_without(_GOOD, "state"), "status.state"),
        (_without(_GOOD, "source"), "status.source"),
        (_without(_GOOD, "task_id"), "status.task_id"),
        ({**_GOOD, "state": "RUNNING"}, "status.state"),
        ({**_GOOD, "state": "TASK_BORED"}, "status.state"),
        ({**_GOOD, "state": 1}, "status.state"),
        ({**_GOOD, "source": "SOURCE_OPERATOR"}, "status.source"),
        ({**_GOOD, "reason": "REASON_NOPE"}, "status.reason"),
        ({**_GOOD, "uuid": "%%%"}, "status.uuid"),
        ({**_GOOD, "uuid": "A" * 200}, "status.uuid"),
        ({**_GOOD, "timestamp": -1}, "status.timestamp"),
        ({**_GOOD, "timestamp": float("nan")}, "status.timestamp"),
        ({**_GOOD, "healthy": "yes"}, "status.healthy"),
        ({**_GOOD, "check_status": {}}, "status.check_status"),
        ({**_GOOD, "labels": {"labels": [{"key": "x", "value": "y"}]}}, "status.labels"),
        (
            {**_GOOD, "labels": {"labels": [{"key": "agora.exit_code", "value": "999"}]}},
            "status.labels.agora.exit_code",
        ),
    ],
)
def test_status_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        task_status_from_mesos(value)
    assert info.value.field == field
