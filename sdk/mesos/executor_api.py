"""The Mesos v1 executor HTTP API (``POST /api/v1/executor``) as JSON: its calls read into
:class:`ExecutorCall`, its events built from Agora's records, and RecordIO framing.

Calls: ``SUBSCRIBE`` (the lists of unacknowledged tasks and updates are read and not used: the
agent keeps its own), ``UPDATE`` (a task status from the executor; ``uuid`` is required, as in
Mesos) and ``MESSAGE`` (bytes for the scheduler). Events: ``SUBSCRIBED``, ``LAUNCH``,
``LAUNCH_GROUP``, ``KILL``, ``ACKNOWLEDGED``, ``MESSAGE``, ``SHUTDOWN``, ``ERROR`` and
``HEARTBEAT``. Pure: no I/O; bad input raises :class:`~agora.sdk.errors.ProtocolError` naming
the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.mesos._json import (
    array,
    b64decode,
    b64encode,
    duration_to_mesos,
    fail,
    labels_to_mesos,
    obj,
    required,
    string,
)
from agora.sdk.mesos.frameworks import framework_info_to_mesos
from agora.sdk.mesos.ids import id_from_mesos, id_to_mesos
from agora.sdk.mesos.resources import resources_to_mesos
from agora.sdk.mesos.tasks import task_status_from_mesos
from agora.sdk.messages.common import (
    AgentInfo,
    CommandInfo,
    ExecutorInfo,
    FrameworkInfo,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.messages.enums import StatusSource
from msgspec.structs import replace

__all__ = [
    "MAX_CALL_BYTES",
    "ExecutorCall",
    "acknowledged_event",
    "command_to_mesos",
    "error_event",
    "executor_call_from_mesos",
    "executor_info_to_mesos",
    "heartbeat_event",
    "kill_event",
    "launch_event",
    "launch_group_event",
    "message_event",
    "recordio",
    "shutdown_event",
    "subscribed_event",
    "task_info_to_mesos",
]

#: The largest call body read (a status update carries at most 1 MiB of data, base64).
MAX_CALL_BYTES: Final = 2 << 20
_CALL_KEYS: Final = ("type", "framework_id", "executor_id", "subscribe", "update", "message")
_SUBSCRIBE_KEYS: Final = ("unacknowledged_tasks", "unacknowledged_updates")
_MAX_DATA: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class ExecutorCall:
    """One call of an executor: ``kind`` SUBSCRIBE, UPDATE (``status``) or MESSAGE (``data``)."""

    kind: str
    framework_id: FrameworkID
    executor_id: ExecutorID
    status: TaskStatus | None = None
    data: bytes = b""


def executor_call_from_mesos(value: object) -> ExecutorCall:
    """A decoded ``Call`` body as an :class:`ExecutorCall`."""
    o = obj(value, "call", _CALL_KEYS)
    kind = string(required(o, "type", "call"), "call.type", max_len=32)
    framework_id = id_from_mesos(
        required(o, "framework_id", "call"), FrameworkID, "call.framework_id"
    )
    executor_id = id_from_mesos(required(o, "executor_id", "call"), ExecutorID, "call.executor_id")
    if kind == "SUBSCRIBE":
        sub = obj(o.get("subscribe", {}), "call.subscribe", _SUBSCRIBE_KEYS)
        for key in _SUBSCRIBE_KEYS:
            array(sub.get(key, []), f"call.subscribe.{key}")
        return ExecutorCall(kind, framework_id, executor_id)
    if kind == "UPDATE":
        update = obj(required(o, "update", "call"), "call.update", ("status",))
        status = task_status_from_mesos(
            required(update, "status", "call.update"), "call.update.status"
        )
        if status.uuid is None:
            fail("call.update.status.uuid", "is required")
        # Whatever the executor says, an update it sends comes from the executor.
        status = replace(status, source=StatusSource.EXECUTOR, executor_id=executor_id)
        return ExecutorCall(kind, framework_id, executor_id, status=status)
    if kind == "MESSAGE":
        message = obj(required(o, "message", "call"), "call.message", ("data",))
        data = b64decode(
            required(message, "data", "call.message"), "call.message.data", max_len=_MAX_DATA
        )
        return ExecutorCall(kind, framework_id, executor_id, data=data)
    fail("call.type", f"{kind!r} is not an executor call (SUBSCRIBE, UPDATE or MESSAGE)")


# --------------------------------------------------------------------------- launch records


def command_to_mesos(command: CommandInfo) -> dict[str, object]:
    """Agora's CommandInfo as a Mesos CommandInfo."""
    out: dict[str, object] = {"shell": command.shell}
    if command.shell:
        out["value"] = command.value or ""
    else:
        out["value"] = command.argv[0] if command.argv else ""
        out["arguments"] = list(command.argv)
    if command.environment:
        out["environment"] = {
            "variables": [
                {"name": k, "type": "VALUE", "value": v} for k, v in command.environment.items()
            ]
        }
    if command.user is not None:
        out["user"] = command.user
    if command.uris:
        out["uris"] = [
            {
                "value": u.value,
                "executable": u.executable,
                "extract": u.extract,
                "cache": u.cache,
                **({"output_file": u.output_file} if u.output_file is not None else {}),
            }
            for u in command.uris
        ]
    return out


def executor_info_to_mesos(executor: ExecutorInfo) -> dict[str, object]:
    """Agora's ExecutorInfo as a Mesos ExecutorInfo (type CUSTOM)."""
    out: dict[str, object] = {
        "type": "CUSTOM",
        "executor_id": id_to_mesos(executor.executor_id),
        "framework_id": id_to_mesos(executor.framework_id),
        "command": command_to_mesos(executor.command),
        "resources": resources_to_mesos(executor.resources),
    }
    if executor.name:
        out["name"] = executor.name
    return out


def task_info_to_mesos(task: TaskInfo) -> dict[str, object]:
    """Agora's TaskInfo as a Mesos TaskInfo (as in a LAUNCH event)."""
    out: dict[str, object] = {
        "name": task.name,
        "task_id": id_to_mesos(task.task_id),
        "agent_id": id_to_mesos(task.agent_id),
        "resources": resources_to_mesos(task.resources),
    }
    if task.command is not None:
        out["command"] = command_to_mesos(task.command)
    if task.executor is not None:
        out["executor"] = executor_info_to_mesos(task.executor)
    if task.labels:
        out["labels"] = labels_to_mesos(task.labels)
    if task.data:
        out["data"] = b64encode(task.data)
    if task.kill_grace_period is not None:
        out["kill_policy"] = {"grace_period": duration_to_mesos(task.kill_grace_period)}
    return out


def _agent_info_to_mesos(agent: AgentInfo | None, agent_id: AgentID | None) -> dict[str, object]:
    out: dict[str, object] = {"hostname": agent.hostname if agent is not None else ""}
    if agent is not None:
        out["resources"] = resources_to_mesos(agent.resources)
        if agent.port:
            out["port"] = agent.port
    chosen = agent_id if agent_id is not None else (agent.agent_id if agent is not None else None)
    if chosen is not None:
        out["id"] = id_to_mesos(chosen)
    return out


# --------------------------------------------------------------------------- events


def subscribed_event(
    executor: ExecutorInfo,
    framework: FrameworkInfo | None,
    agent: AgentInfo | None,
    *,
    agent_id: AgentID | None,
    container_id: str,
) -> dict[str, object]:
    """SUBSCRIBED: what the executor runs for, and where (``framework`` None: only its id is
    known)."""
    if framework is not None:
        framework_json = framework_info_to_mesos(
            replace(framework, framework_id=framework.framework_id or executor.framework_id)
        )
    else:
        framework_json = {"id": id_to_mesos(executor.framework_id), "user": "", "name": ""}
    return {
        "type": "SUBSCRIBED",
        "subscribed": {
            "executor_info": executor_info_to_mesos(executor),
            "framework_info": framework_json,
            "agent_info": _agent_info_to_mesos(agent, agent_id),
            "container_id": {"value": container_id},
        },
    }


def launch_event(task: TaskInfo) -> dict[str, object]:
    return {"type": "LAUNCH", "launch": {"task": task_info_to_mesos(task)}}


def launch_group_event(tasks: tuple[TaskInfo, ...]) -> dict[str, object]:
    return {
        "type": "LAUNCH_GROUP",
        "launch_group": {"task_group": {"tasks": [task_info_to_mesos(t) for t in tasks]}},
    }


def kill_event(task_id: TaskID) -> dict[str, object]:
    return {"type": "KILL", "kill": {"task_id": id_to_mesos(task_id)}}


def acknowledged_event(task_id: TaskID, uuid: bytes) -> dict[str, object]:
    return {
        "type": "ACKNOWLEDGED",
        "acknowledged": {"task_id": id_to_mesos(task_id), "uuid": b64encode(uuid)},
    }


def message_event(data: bytes) -> dict[str, object]:
    return {"type": "MESSAGE", "message": {"data": b64encode(data)}}


def shutdown_event() -> dict[str, object]:
    return {"type": "SHUTDOWN"}


def error_event(message: str) -> dict[str, object]:
    return {"type": "ERROR", "error": {"message": message}}


def heartbeat_event() -> dict[str, object]:
    return {"type": "HEARTBEAT"}


def recordio(event: dict[str, object]) -> bytes:
    """One RecordIO record: the length of the JSON in bytes, a newline, the JSON (one line)."""
    data = json.dumps(event, separators=(",", ":")).encode()
    return b"%d\n%s" % (len(data), data)
