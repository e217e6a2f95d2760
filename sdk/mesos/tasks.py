"""Mesos TaskInfo / CommandInfo / ExecutorInfo JSON -> Agora launch records, and task statuses
both ways.

Task: ``name``, ``task_id``, ``agent_id``, ``resources``, ``command``, ``executor``, ``labels``,
``data`` (base64) and ``kill_policy.grace_period`` are translated; ``container``,
``health_check``, ``check``, ``discovery`` and ``max_completion_time`` are refused.
Command: ``value``, ``arguments``, ``shell``, ``user``, ``environment`` (VALUE variables only)
and ``uris``. Executor: ``executor_id``, ``framework_id``, ``command``, ``resources``, ``name``
(type DEFAULT/CUSTOM are both run as Agora command executors).

Status: states are ``TASK_<state>``, reasons ``REASON_<reason>``, sources ``SOURCE_<source>``,
``uuid`` and ``data`` base64, times seconds since the epoch. Agora's ``exit_code``,
``cpu_seconds`` and ``max_rss_bytes`` travel as labels ``agora.exit_code`` etc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.mesos._json import (
    array,
    b64decode,
    b64encode,
    boolean,
    duration_from_mesos,
    duration_to_mesos,
    fail,
    integer,
    labels_from_mesos,
    labels_to_mesos,
    number,
    obj,
    required,
    string,
)
from agora.sdk.mesos.ids import id_from_mesos, id_to_mesos
from agora.sdk.mesos.resources import resources_from_mesos
from agora.sdk.messages._record import DAY
from agora.sdk.messages.common import CommandInfo, ExecutorInfo, TaskInfo, TaskStatus
from agora.sdk.messages.container import URI
from agora.sdk.messages.enums import Reason, StatusSource, TaskState

__all__ = [
    "command_from_mesos",
    "executor_info_from_mesos",
    "task_info_from_mesos",
    "task_status_from_mesos",
    "task_status_to_mesos",
]

_MAX_DATA = 1 << 20
_TASK_KEYS = (
    "name",
    "task_id",
    "agent_id",
    "resources",
    "executor",
    "command",
    "labels",
    "data",
    "kill_policy",
)
_COMMAND_KEYS = ("value", "arguments", "shell", "user", "environment", "uris")
_EXECUTOR_KEYS = ("executor_id", "framework_id", "command", "resources", "name", "type")
_STATUS_KEYS = (
    "task_id",
    "state",
    "source",
    "reason",
    "message",
    "agent_id",
    "executor_id",
    "uuid",
    "healthy",
    "timestamp",
    "unreachable_time",
    "data",
    "labels",
)
_LABEL_EXIT = "agora.exit_code"
_LABEL_CPU = "agora.cpu_seconds"
_LABEL_RSS = "agora.max_rss_bytes"


# --------------------------------------------------------------------------- launch records


def task_info_from_mesos(
    value: object, *, framework_id: FrameworkID | None = None, field: str = "task_info"
) -> TaskInfo:
    """A Mesos TaskInfo as Agora's; ``framework_id`` fills in an executor's missing one."""
    o = obj(value, field, _TASK_KEYS)
    command = executor = None
    if o.get("command") is not None:
        command = command_from_mesos(o["command"], f"{field}.command")
    if o.get("executor") is not None:
        executor = executor_info_from_mesos(
            o["executor"], framework_id=framework_id, field=f"{field}.executor"
        )
    if (command is None) == (executor is None):
        fail(field, "must have exactly one of command and executor")
    grace = None
    if o.get("kill_policy") is not None:
        kp = obj(o["kill_policy"], f"{field}.kill_policy", ("grace_period",))
        if kp.get("grace_period") is not None:
            grace = duration_from_mesos(
                kp["grace_period"], f"{field}.kill_policy.grace_period", hi=365 * DAY
            )
    return TaskInfo(
        task_id=id_from_mesos(required(o, "task_id", field), TaskID, f"{field}.task_id"),
        name=string(required(o, "name", field), f"{field}.name", max_len=1024),
        agent_id=id_from_mesos(required(o, "agent_id", field), AgentID, f"{field}.agent_id"),
        resources=resources_from_mesos(required(o, "resources", field), f"{field}.resources"),
        command=command,
        executor=executor,
        labels=labels_from_mesos(o["labels"], f"{field}.labels") if "labels" in o else {},
        data=b64decode(o["data"], f"{field}.data", max_len=_MAX_DATA) if "data" in o else b"",
        kill_grace_period=grace,
    )


def command_from_mesos(value: object, field: str = "command") -> CommandInfo:
    """A Mesos CommandInfo as Agora's.

    ``shell`` (default true): ``value`` runs through the shell and ``arguments`` must be
    absent. Otherwise ``arguments`` is the argv, and ``value`` (the program) must be absent or
    equal to ``arguments[0]``, since Agora runs ``argv[0]``."""
    o = obj(value, field, _COMMAND_KEYS)
    shell = boolean(o.get("shell", True), f"{field}.shell")
    args = tuple(
        string(a, f"{field}.arguments[{i}]")
        for i, a in enumerate(array(o.get("arguments", []), f"{field}.arguments"))
    )
    cmd = string(o["value"], f"{field}.value", empty=False) if "value" in o else None
    if shell:
        if cmd is None:
            fail(f"{field}.value", "is required for a shell command")
        if args:
            fail(f"{field}.arguments", "cannot be given to a shell command")
        argv: tuple[str, ...] = ()
    else:
        argv = args or ((cmd,) if cmd is not None else ())
        if not argv:
            fail(f"{field}.value", "or arguments is required")
        if cmd is not None and cmd != argv[0]:
            fail(f"{field}.value", "must equal arguments[0] (Agora runs argv[0])")
        cmd = None
    user = None
    if o.get("user") is not None:
        user = string(o["user"], f"{field}.user", max_len=255, empty=False)
    return CommandInfo(
        value=cmd,
        argv=argv,
        shell=shell,
        environment=_environment(o.get("environment", {}), f"{field}.environment"),
        user=user,
        uris=tuple(
            _uri(u, f"{field}.uris[{i}]")
            for i, u in enumerate(array(o.get("uris", []), f"{field}.uris", max_items=256))
        ),
    )


def executor_info_from_mesos(
    value: object, *, framework_id: FrameworkID | None = None, field: str = "executor"
) -> ExecutorInfo:
    """A Mesos ExecutorInfo as Agora's; its ``framework_id`` or the one given is required."""
    o = obj(value, field, _EXECUTOR_KEYS)
    if "type" in o:
        t = string(o["type"], f"{field}.type", max_len=16)
        if t not in ("DEFAULT", "CUSTOM"):
            fail(f"{field}.type", f"must be DEFAULT or CUSTOM, not {t!r}")
    if o.get("framework_id") is not None:
        fid = id_from_mesos(o["framework_id"], FrameworkID, f"{field}.framework_id")
        if framework_id is not None and fid != framework_id:
            fail(f"{field}.framework_id", "is not the subscribed framework's")
    elif framework_id is not None:
        fid = framework_id
    else:
        fail(f"{field}.framework_id", "is required")
    return ExecutorInfo(
        executor_id=id_from_mesos(
            required(o, "executor_id", field), ExecutorID, f"{field}.executor_id"
        ),
        framework_id=fid,
        command=command_from_mesos(required(o, "command", field), f"{field}.command"),
        resources=resources_from_mesos(o.get("resources", []), f"{field}.resources"),
        name=string(o.get("name", ""), f"{field}.name", max_len=1024),
    )


def _environment(value: object, f: str) -> dict[str, str]:
    o = obj(value, f, ("variables",))
    out: dict[str, str] = {}
    for i, v in enumerate(array(o.get("variables", []), f"{f}.variables")):
        vf = f"{f}.variables[{i}]"
        var = obj(v, vf, ("name", "type", "value"))
        if "type" in var and var["type"] != "VALUE":
            fail(f"{vf}.type", "only VALUE variables are supported (no secrets)")
        name = string(required(var, "name", vf), f"{vf}.name", max_len=1024, empty=False)
        if "=" in name or "\0" in name:
            fail(f"{vf}.name", "must not contain '=' or NUL")
        out[name] = string(var.get("value", ""), f"{vf}.value")
    return out


def _uri(value: object, f: str) -> URI:
    o = obj(value, f, ("value", "executable", "extract", "cache", "output_file"))
    output = None
    if o.get("output_file") is not None:
        output = string(o["output_file"], f"{f}.output_file", max_len=255, empty=False)
    return URI(
        value=string(required(o, "value", f), f"{f}.value", max_len=4096, empty=False),
        executable=boolean(o.get("executable", False), f"{f}.executable"),
        extract=boolean(o.get("extract", True), f"{f}.extract"),
        cache=boolean(o.get("cache", False), f"{f}.cache"),
        output_file=output,
    )


# --------------------------------------------------------------------------- statuses


def task_status_to_mesos(status: TaskStatus) -> dict[str, object]:
    """An Agora TaskStatus as a Mesos v1 TaskStatus (as in an UPDATE event)."""
    out: dict[str, object] = {
        "task_id": id_to_mesos(status.task_id),
        "state": "TASK_" + status.state.value,
        "source": "SOURCE_" + status.source.value,
    }
    if status.reason is not None:
        out["reason"] = "REASON_" + status.reason.value
    if status.message:
        out["message"] = status.message
    if status.agent_id is not None:
        out["agent_id"] = id_to_mesos(status.agent_id)
    if status.executor_id is not None:
        out["executor_id"] = id_to_mesos(status.executor_id)
    if status.uuid is not None:
        out["uuid"] = b64encode(status.uuid)
    if status.healthy is not None:
        out["healthy"] = status.healthy
    out["timestamp"] = status.timestamp
    if status.unreachable_time is not None:
        out["unreachable_time"] = duration_to_mesos(status.unreachable_time)
    if status.data:
        out["data"] = b64encode(status.data)
    labels: dict[str, str] = {}
    if status.exit_code is not None:
        labels[_LABEL_EXIT] = str(status.exit_code)
    if status.cpu_seconds is not None:
        labels[_LABEL_CPU] = repr(status.cpu_seconds)
    if status.max_rss_bytes is not None:
        labels[_LABEL_RSS] = str(status.max_rss_bytes)
    if labels:
        out["labels"] = labels_to_mesos(labels)
    return out


def task_status_from_mesos(value: object, field: str = "status") -> TaskStatus:
    """A Mesos TaskStatus (as an executor's UPDATE carries it) as Agora's."""
    o = obj(value, field, _STATUS_KEYS)
    state = _enum(required(o, "state", field), f"{field}.state", "TASK_", TaskState)
    source = _enum(required(o, "source", field), f"{field}.source", "SOURCE_", StatusSource)
    reason = None
    if o.get("reason") is not None:
        reason = _enum(o["reason"], f"{field}.reason", "REASON_", Reason)
    extra: Mapping[str, str] = {}
    if "labels" in o:
        extra = labels_from_mesos(o["labels"], f"{field}.labels")
        for key in extra:
            if key not in (_LABEL_EXIT, _LABEL_CPU, _LABEL_RSS):
                fail(f"{field}.labels", f"label {key!r} is not supported by Agora")
    unreachable = None
    if o.get("unreachable_time") is not None:
        unreachable = duration_from_mesos(
            o["unreachable_time"], f"{field}.unreachable_time", hi=1e13
        )
    return TaskStatus(
        task_id=id_from_mesos(required(o, "task_id", field), TaskID, f"{field}.task_id"),
        state=state,
        source=source,
        reason=reason,
        message=string(o.get("message", ""), f"{field}.message", max_len=64 * 1024),
        agent_id=(
            id_from_mesos(o["agent_id"], AgentID, f"{field}.agent_id")
            if o.get("agent_id") is not None
            else None
        ),
        executor_id=(
            id_from_mesos(o["executor_id"], ExecutorID, f"{field}.executor_id")
            if o.get("executor_id") is not None
            else None
        ),
        uuid=b64decode(o["uuid"], f"{field}.uuid", max_len=64) if "uuid" in o else None,
        healthy=boolean(o["healthy"], f"{field}.healthy") if "healthy" in o else None,
        timestamp=number(o.get("timestamp", 0.0), f"{field}.timestamp", hi=1e13),
        unreachable_time=unreachable,
        data=b64decode(o["data"], f"{field}.data", max_len=_MAX_DATA) if "data" in o else b"",
        exit_code=(
            integer(extra[_LABEL_EXIT], f"{field}.labels.{_LABEL_EXIT}", lo=-255, hi=255)
            if _LABEL_EXIT in extra
            else None
        ),
        cpu_seconds=(
            _float_label(extra[_LABEL_CPU], f"{field}.labels.{_LABEL_CPU}")
            if _LABEL_CPU in extra
            else None
        ),
        max_rss_bytes=(
            integer(extra[_LABEL_RSS], f"{field}.labels.{_LABEL_RSS}", lo=0, hi=2**63 - 1)
            if _LABEL_RSS in extra
            else None
        ),
    )


def _float_label(text: str, f: str) -> float:
    try:
        v = float(text)
    except ValueError:
        fail(f, f"is not a number: {text!r}")
    return number(v, f, hi=1e15)


_E = TypeVar("_E", TaskState, StatusSource, Reason)


def _enum(value: object, f: str, prefix: str, cls: type[_E]) -> _E:
    text = string(value, f, max_len=64)
    if not text.startswith(prefix):
        fail(f, f"must start with {prefix!r}, not {text!r}")
    try:
        return cls(text[len(prefix) :])
    except ValueError:
        fail(f, f"{text!r} is not a value Agora knows")
