"""The Mesos v1 executor API's calls read and events built (agora.sdk.mesos.executor_api)."""

from __future__ import annotations

import base64
import json

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.mesos import task_info_from_mesos
from agora.sdk.mesos.executor_api import (
    acknowledged_event,
    executor_call_from_mesos,
    launch_event,
    message_event,
    recordio,
    subscribed_event,
    task_info_to_mesos,
)
from agora.sdk.messages import (
    AgentInfo,
    CommandInfo,
    ExecutorInfo,
    FrameworkInfo,
    StatusSource,
    TaskInfo,
    TaskState,
)
from agora.sdk.resources import Resources

IDS = {"framework_id": {"value": "F1"}, "executor_id": {"value": "E1"}}
UUID = bytes(range(16))


def test_an_update_keeps_its_uuid_and_is_always_from_the_executor() -> None:
    call = executor_call_from_mesos(
        {
            "type": "UPDATE",
            **IDS,
            "update": {
                "status": {
                    "task_id": {"value": "t1"},
                    "state": "TASK_RUNNING",
                    "source": "SOURCE_MASTER",
                    "uuid": base64.b64encode(UUID).decode(),
                    "timestamp": 1700000000,
                }
            },
        }
    )
    assert call.kind == "UPDATE" and call.framework_id == "F1" and call.executor_id == "E1"
    status = call.status
    assert status is not None and status.uuid == UUID and status.state is TaskState.RUNNING
    assert status.source is StatusSource.EXECUTOR and status.executor_id == "E1"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"type": "LAUNCH", **IDS}, "call.type"),
        ({"type": "SUBSCRIBE", "executor_id": {"value": "E1"}}, "call"),
        ({"type": "UPDATE", **IDS, "update": {"status": {}}}, "call.update.status"),
        (
            {
                "type": "UPDATE",
                **IDS,
                "update": {
                    "status": {
                        "task_id": {"value": "t"},
                        "state": "TASK_RUNNING",
                        "source": "SOURCE_EXECUTOR",
                    }
                },
            },
            "call.update.status.uuid",
        ),
        ({"type": "MESSAGE", **IDS, "message": {"data": "%%%"}}, "call.message.data"),
        ({"type": "SUBSCRIBE", **IDS, "subscribe": {"unacknowledged_tasks": 3}}, "call.subscribe"),
        ({"type": "SUBSCRIBE", **IDS, "extra": 1}, "call"),
        ([], "call"),
    ],
)
def test_bad_calls_are_refused_naming_the_field(call: object, field: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        executor_call_from_mesos(call)
    assert refused.value.field is not None and refused.value.field.startswith(field)


def test_subscribe_and_message_calls() -> None:
    sub = executor_call_from_mesos(
        {"type": "SUBSCRIBE", **IDS, "subscribe": {"unacknowledged_tasks": []}}
    )
    assert sub.kind == "SUBSCRIBE" and sub.status is None
    msg = executor_call_from_mesos(
        {"type": "MESSAGE", **IDS, "message": {"data": base64.b64encode(b"hi").decode()}}
    )
    assert msg.kind == "MESSAGE" and msg.data == b"hi"


def test_a_launched_task_round_trips_through_mesos_json() -> None:
    task = TaskInfo(
        task_id=TaskID("t1"),
        name="t1",
        agent_id=AgentID("A1"),
        resources=Resources.parse("cpus:1;mem:64;ports:[31000-31001]"),
        command=CommandInfo(value="echo hi", environment={"K": "v"}),
        labels={"team": "a"},
        data=b"\x00payload",
        kill_grace_period=2.5,
    )
    assert task_info_from_mesos(task_info_to_mesos(task)) == task
    argv = TaskInfo(
        task_id=TaskID("t2"),
        name="t2",
        agent_id=AgentID("A1"),
        resources=Resources.parse("cpus:1"),
        command=CommandInfo(argv=("/bin/echo", "a b"), shell=False),
    )
    assert task_info_from_mesos(task_info_to_mesos(argv)) == argv
    event = launch_event(task)
    assert event["type"] == "LAUNCH"
    assert event["launch"]["task"]["task_id"] == {"value": "t1"}  # type: ignore[index]


def test_subscribed_names_the_executor_and_framework_as_pymesos_checks() -> None:
    executor = ExecutorInfo(
        executor_id=ExecutorID("E1"),
        framework_id=FrameworkID("F1"),
        command=CommandInfo(value="run"),
    )
    framework = FrameworkInfo(name="fw", user="u")
    agent = AgentInfo(hostname="h", resources=Resources.parse("cpus:2"))
    event = subscribed_event(
        executor, framework, agent, agent_id=AgentID("A1"), container_id="F1.E1"
    )
    body = event["subscribed"]
    assert isinstance(body, dict)
    assert body["executor_info"]["executor_id"] == {"value": "E1"}
    assert body["framework_info"]["id"] == {"value": "F1"}  # from the executor when unset
    assert body["agent_info"]["id"] == {"value": "A1"}
    assert subscribed_event(executor, None, None, agent_id=None, container_id="c")["subscribed"][
        "framework_info"
    ]["id"] == {"value": "F1"}  # type: ignore[index]


def test_events_are_framed_as_recordio_with_compact_json() -> None:
    record = recordio(acknowledged_event(TaskID("t1"), UUID))
    length, _, body = record.partition(b"\n")
    assert int(length) == len(body) and b"\n" not in body and b", " not in body
    decoded = json.loads(body)
    assert decoded["type"] == "ACKNOWLEDGED"
    assert base64.b64decode(decoded["acknowledged"]["uuid"]) == UUID
    assert json.loads(recordio(message_event(b"\xff")).split(b"\n", 1)[1])["message"] == {
        "data": base64.b64encode(b"\xff").decode()
    }
