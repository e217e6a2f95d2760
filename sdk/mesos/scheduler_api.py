"""The Mesos v1 scheduler API's JSON (``scheduler.proto``) <-> Agora's scheduler messages.

Pure: a decoded ``Call`` body in, a :class:`SchedulerCall` (the Agora messages it becomes) out;
an Agora message to a framework in, the Mesos ``Event`` objects for it out.

Calls: SUBSCRIBE, TEARDOWN, ACCEPT (LAUNCH, LAUNCH_GROUP, RESERVE, UNRESERVE), DECLINE,
ACCEPT_INVERSE_OFFERS, DECLINE_INVERSE_OFFERS, REVIVE, SUPPRESS, KILL, SHUTDOWN, ACKNOWLEDGE,
RECONCILE, MESSAGE and REQUEST (accepted and ignored, as Mesos's allocator does). Known calls
Agora has no counterpart for (UPDATE_FRAMEWORK, operation feedback, CREATE/DESTROY volume
operations) raise :class:`Unsupported`; anything malformed raises
:class:`~agora.sdk.errors.ProtocolError` naming the field.

An executor given without ``type: DEFAULT`` is a Mesos custom executor: it runs under Agora's
bridge (``ExecutorInfo.mesos``) and speaks the executor HTTP API. ``slave_id`` (older clients)
is read as ``agent_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.mesos._json import (
    array,
    b64decode,
    b64encode,
    duration_to_mesos,
    fail,
    number,
    obj,
    required,
    string,
)
from agora.sdk.mesos.executor_api import error_event, heartbeat_event
from agora.sdk.mesos.frameworks import framework_info_from_mesos
from agora.sdk.mesos.ids import id_from_mesos, id_to_mesos
from agora.sdk.mesos.offers import offer_to_mesos
from agora.sdk.mesos.resources import resources_from_mesos
from agora.sdk.mesos.tasks import executor_info_from_mesos, task_info_from_mesos
from agora.sdk.mesos.tasks import task_status_to_mesos as status_to_mesos
from agora.sdk.messages import (
    Accept,
    AcceptInverseOffers,
    Acknowledge,
    Decline,
    DeclineInverseOffers,
    Error,
    ExecutorInfo,
    Failure,
    Filters,
    FrameworkMessage,
    Heartbeat,
    InverseOffers,
    Kill,
    Launch,
    LaunchGroup,
    Message,
    Offers,
    Operation,
    Reconcile,
    ReconcileTask,
    Rescind,
    RescindInverseOffer,
    Reserve,
    Revive,
    SendMessage,
    Shutdown,
    Subscribe,
    Subscribed,
    Suppress,
    TaskGroupInfo,
    TaskInfo,
    TaskStatus,
    Teardown,
    Unreserve,
    Update,
    Updates,
)
from msgspec.structs import replace

__all__ = [
    "MAX_CALL_BYTES",
    "SchedulerCall",
    "Unsupported",
    "events_to_mesos",
    "scheduler_call_from_mesos",
]

#: The largest call body read (an ACCEPT launching many tasks with data fits easily).
MAX_CALL_BYTES: Final = 4 << 20
_MAX_DATA: Final = 1 << 20
#: Most tasks one LAUNCH (or task group) may hold: a framework fills a big agent's offer with
#: thousands of small tasks at once, as Mesos lets it (the body limit bounds the rest).
MAX_TASKS: Final = 20_000

#: Calls of scheduler.proto Agora does not serve: answered 501, as Mesos answers UNKNOWN.
UNSUPPORTED_CALLS: Final = frozenset(
    {"UPDATE_FRAMEWORK", "ACKNOWLEDGE_OPERATION_STATUS", "RECONCILE_OPERATIONS"}
)
_CALL_KEYS: Final = (
    "type",
    "framework_id",
    "subscribe",
    "accept",
    "decline",
    "accept_inverse_offers",
    "decline_inverse_offers",
    "revive",
    "suppress",
    "kill",
    "shutdown",
    "acknowledge",
    "reconcile",
    "message",
    "request",
)


class Unsupported(ProtocolError):
    """A call or operation Mesos has and Agora does not (answered 501, not 400)."""


@dataclass(frozen=True, slots=True)
class SchedulerCall:
    """One scheduler call: its Mesos ``kind``, the framework it names (None for a first
    SUBSCRIBE) and the Agora message it becomes (None: nothing to do, e.g. REQUEST)."""

    kind: str
    framework_id: FrameworkID | None
    message: Message | None


def scheduler_call_from_mesos(value: object) -> SchedulerCall:
    """A decoded ``Call`` body as a :class:`SchedulerCall`."""
    o = obj(value, "call", _CALL_KEYS)
    kind = string(required(o, "type", "call"), "call.type", max_len=64)
    if kind in UNSUPPORTED_CALLS:
        raise Unsupported(f"mesos: call {kind} is not supported by Agora", field="call.type")
    fid: FrameworkID | None = None
    if o.get("framework_id") is not None:
        fid = id_from_mesos(o["framework_id"], FrameworkID, "call.framework_id")
    if kind == "SUBSCRIBE":
        return SchedulerCall(kind, fid, _subscribe(o, fid))
    if fid is None:
        fail("call.framework_id", f"is required for {kind}")
    build = _CALLS.get(kind)
    if build is None:
        fail("call.type", f"{kind!r} is not a scheduler call")
    body = o.get(kind.lower())
    return SchedulerCall(kind, fid, build(fid, body, f"call.{kind.lower()}"))


def _subscribe(o: Mapping[str, object], fid: FrameworkID | None) -> Subscribe:
    sub = obj(
        required(o, "subscribe", "call"), "call.subscribe", ("framework_info", "suppressed_roles")
    )
    info = framework_info_from_mesos(
        required(sub, "framework_info", "call.subscribe"), "call.subscribe.framework_info"
    )
    if fid is not None and info.framework_id is not None and info.framework_id != fid:
        fail("call.framework_id", "differs from call.subscribe.framework_info.id")
    if info.framework_id is None and fid is not None:
        info = replace(info, framework_id=fid)
    return Subscribe(
        framework_info=info, suppressed_roles=_roles(sub, "suppressed_roles", "call.subscribe")
    )


def _roles(o: Mapping[str, object], key: str, field: str) -> tuple[str, ...]:
    return tuple(
        string(r, f"{field}.{key}[{i}]", max_len=255, empty=False)
        for i, r in enumerate(array(o.get(key, []), f"{field}.{key}"))
    )


def _body(value: object, field: str, keys: tuple[str, ...]) -> Mapping[str, object]:
    if value is None:
        fail(field, "is required")
    return obj(value, field, keys)


def _filters(o: Mapping[str, object], field: str) -> Filters:
    if o.get("filters") is None:
        return Filters()
    f = obj(o["filters"], f"{field}.filters", ("refuse_seconds",))
    if "refuse_seconds" not in f:
        return Filters()
    return Filters(
        refuse_seconds=number(
            f["refuse_seconds"], f"{field}.filters.refuse_seconds", hi=365 * 86400
        )
    )


def _ids(o: Mapping[str, object], key: str, field: str) -> tuple[str, ...]:
    return tuple(
        id_from_mesos(v, str, f"{field}.{key}[{i}]")
        for i, v in enumerate(array(required(o, key, field), f"{field}.{key}"))
    )


def _agent_key(o: Mapping[str, object], field: str) -> Mapping[str, object]:
    """``o`` with an older client's ``slave_id`` read as ``agent_id``."""
    if "slave_id" not in o:
        return o
    if "agent_id" in o:
        fail(f"{field}.slave_id", "and agent_id are both set")
    out = dict(o)
    out["agent_id"] = out.pop("slave_id")
    return out


def _agent_id(o: Mapping[str, object], field: str) -> AgentID | None:
    if o.get("agent_id") is None:
        return None
    return id_from_mesos(o["agent_id"], AgentID, f"{field}.agent_id")


def _needed_agent(o: Mapping[str, object], field: str) -> AgentID:
    return id_from_mesos(required(o, "agent_id", field), AgentID, f"{field}.agent_id")


def _executor(value: object, fid: FrameworkID, field: str) -> ExecutorInfo:
    """A Mesos ExecutorInfo; a CUSTOM (or untyped) one runs under the bridge, DEFAULT as
    Agora's own executor."""
    executor = executor_info_from_mesos(value, framework_id=fid, field=field)
    return replace(executor, mesos=_is_custom(value))


def _is_custom(value: object) -> bool:
    return not (isinstance(value, Mapping) and value.get("type") == "DEFAULT")


def _task(value: object, fid: FrameworkID, field: str) -> TaskInfo:
    if isinstance(value, Mapping):
        value = _agent_key(value, field)
    task = task_info_from_mesos(value, framework_id=fid, field=field)
    if task.executor is not None:
        assert isinstance(value, Mapping)
        task = replace(task, executor=replace(task.executor, mesos=_is_custom(value["executor"])))
    return task


def _operation(value: object, fid: FrameworkID, field: str) -> Operation:
    o = obj(
        value,
        field,
        ("type", "id", "launch", "launch_group", "reserve", "unreserve", "create", "destroy"),
    )
    kind = string(required(o, "type", field), f"{field}.type", max_len=32)
    if "id" in o:
        raise Unsupported(
            "mesos: operation feedback (operation id) is not supported by Agora",
            field=f"{field}.id",
        )
    if kind == "LAUNCH":
        launch = _body(o.get("launch"), f"{field}.launch", ("task_infos",))
        tasks = array(
            required(launch, "task_infos", f"{field}.launch"),
            f"{field}.launch.task_infos",
            max_items=MAX_TASKS,
        )
        return Launch(
            task_infos=tuple(
                _task(t, fid, f"{field}.launch.task_infos[{i}]") for i, t in enumerate(tasks)
            )
        )
    if kind == "LAUNCH_GROUP":
        f = f"{field}.launch_group"
        group = _body(o.get("launch_group"), f, ("executor", "task_group"))
        executor = _executor(required(group, "executor", f), fid, f"{f}.executor")
        tg = obj(required(group, "task_group", f), f"{f}.task_group", ("tasks",))
        tasks = array(
            required(tg, "tasks", f"{f}.task_group"), f"{f}.task_group.tasks", max_items=MAX_TASKS
        )
        return LaunchGroup(
            executor=executor,
            task_group=TaskGroupInfo(
                tasks=tuple(
                    _task(t, fid, f"{f}.task_group.tasks[{i}]") for i, t in enumerate(tasks)
                )
            ),
        )
    if kind in ("RESERVE", "UNRESERVE"):
        f = f"{field}.{kind.lower()}"
        body = _body(o.get(kind.lower()), f, ("resources",))
        resources = resources_from_mesos(required(body, "resources", f), f"{f}.resources")
        return Reserve(resources=resources) if kind == "RESERVE" else Unreserve(resources=resources)
    if kind in ("CREATE", "DESTROY"):
        raise Unsupported(
            f"mesos: operation {kind} (persistent volumes) is not supported over the Mesos "
            "API; Agora's own SDK has it",
            field=f"{field}.type",
        )
    fail(f"{field}.type", f"{kind!r} is not an offer operation Agora knows")


def _accept(fid: FrameworkID, value: object, field: str) -> Message:
    o = _body(value, field, ("offer_ids", "operations", "filters"))
    ops = array(o.get("operations", []), f"{field}.operations")
    return Accept(
        framework_id=fid,
        offer_ids=tuple(OfferID(i) for i in _ids(o, "offer_ids", field)),
        operations=tuple(
            _operation(op, fid, f"{field}.operations[{i}]") for i, op in enumerate(ops)
        ),
        filters=_filters(o, field),
    )


def _decline(fid: FrameworkID, value: object, field: str) -> Message:
    o = _body(value, field, ("offer_ids", "filters"))
    return Decline(
        framework_id=fid,
        offer_ids=tuple(OfferID(i) for i in _ids(o, "offer_ids", field)),
        filters=_filters(o, field),
    )


def _inverse(
    answer: type[AcceptInverseOffers] | type[DeclineInverseOffers],
) -> Callable[[FrameworkID, object, str], Message]:
    def build(fid: FrameworkID, value: object, field: str) -> Message:
        o = _body(value, field, ("inverse_offer_ids", "filters"))
        return answer(framework_id=fid, inverse_offer_ids=_ids(o, "inverse_offer_ids", field))

    return build


def _revive(fid: FrameworkID, value: object, field: str) -> Message:
    o = obj(value if value is not None else {}, field, ("roles",))
    return Revive(framework_id=fid, roles=_roles(o, "roles", field))


def _suppress(fid: FrameworkID, value: object, field: str) -> Message:
    o = obj(value if value is not None else {}, field, ("roles",))
    return Suppress(framework_id=fid, roles=_roles(o, "roles", field))


def _kill(fid: FrameworkID, value: object, field: str) -> Message:
    o = _agent_key(_body(value, field, ("task_id", "agent_id", "slave_id")), field)
    return Kill(
        framework_id=fid,
        task_id=id_from_mesos(required(o, "task_id", field), TaskID, f"{field}.task_id"),
        agent_id=_agent_id(o, field),
    )


def _shutdown(fid: FrameworkID, value: object, field: str) -> Message:
    o = _agent_key(_body(value, field, ("executor_id", "agent_id", "slave_id")), field)
    return Shutdown(
        framework_id=fid,
        executor_id=id_from_mesos(
            required(o, "executor_id", field), ExecutorID, f"{field}.executor_id"
        ),
        agent_id=_needed_agent(o, field),
    )


def _acknowledge(fid: FrameworkID, value: object, field: str) -> Message:
    o = _agent_key(_body(value, field, ("agent_id", "slave_id", "task_id", "uuid")), field)
    uuid = b64decode(required(o, "uuid", field), f"{field}.uuid", max_len=64)
    if len(uuid) != 16:
        fail(f"{field}.uuid", "must be 16 bytes")
    return Acknowledge(
        framework_id=fid,
        agent_id=_needed_agent(o, field),
        task_id=id_from_mesos(required(o, "task_id", field), TaskID, f"{field}.task_id"),
        uuid=uuid,
    )


def _reconcile(fid: FrameworkID, value: object, field: str) -> Message:
    o = obj(value if value is not None else {}, field, ("tasks",))
    tasks = []
    for i, t in enumerate(array(o.get("tasks", []), f"{field}.tasks")):
        tf = f"{field}.tasks[{i}]"
        to = _agent_key(obj(t, tf, ("task_id", "agent_id", "slave_id")), tf)
        tasks.append(
            ReconcileTask(
                task_id=id_from_mesos(required(to, "task_id", tf), TaskID, f"{tf}.task_id"),
                agent_id=_agent_id(to, tf),
            )
        )
    return Reconcile(framework_id=fid, tasks=tuple(tasks))


def _message(fid: FrameworkID, value: object, field: str) -> Message:
    o = _agent_key(_body(value, field, ("agent_id", "slave_id", "executor_id", "data")), field)
    return SendMessage(
        framework_id=fid,
        agent_id=_needed_agent(o, field),
        executor_id=id_from_mesos(
            required(o, "executor_id", field), ExecutorID, f"{field}.executor_id"
        ),
        data=b64decode(required(o, "data", field), f"{field}.data", max_len=_MAX_DATA),
    )


def _teardown(fid: FrameworkID, value: object, field: str) -> Message:
    return Teardown(framework_id=fid)


def _request(fid: FrameworkID, value: object, field: str) -> Message | None:
    # Mesos's allocator ignores resource requests; so does Agora (its gang requests differ).
    o = obj(value if value is not None else {}, field, ("requests",))
    array(o.get("requests", []), f"{field}.requests")
    return None


_CALLS: Final = {
    "TEARDOWN": _teardown,
    "ACCEPT": _accept,
    "DECLINE": _decline,
    "ACCEPT_INVERSE_OFFERS": _inverse(AcceptInverseOffers),
    "DECLINE_INVERSE_OFFERS": _inverse(DeclineInverseOffers),
    "REVIVE": _revive,
    "SUPPRESS": _suppress,
    "KILL": _kill,
    "SHUTDOWN": _shutdown,
    "ACKNOWLEDGE": _acknowledge,
    "RECONCILE": _reconcile,
    "MESSAGE": _message,
    "REQUEST": _request,
}


# --------------------------------------------------------------------------- events


def events_to_mesos(message: Message, *, version: str) -> list[dict[str, object]]:
    """The Mesos events for one Agora message to a framework (none for what Mesos has no event
    for, such as a gang's expiry). ``version``: the API level SUBSCRIBED reports."""
    if isinstance(message, Update):
        return [_update(message.status)]
    if isinstance(message, Updates):
        return [_update(s) for s in message.statuses]
    if isinstance(message, Offers):
        offers = [offer_to_mesos(o) for o in message.offers if o.gang_id is None]
        return [{"type": "OFFERS", "offers": {"offers": offers}}] if offers else []
    if isinstance(message, Rescind):
        return [{"type": "RESCIND", "rescind": {"offer_id": id_to_mesos(message.offer_id)}}]
    if isinstance(message, Subscribed):
        return [_subscribed(message, version)]
    if isinstance(message, FrameworkMessage):
        body = {
            "agent_id": id_to_mesos(message.agent_id),
            "executor_id": id_to_mesos(message.executor_id),
            "data": b64encode(message.data),
        }
        return [{"type": "MESSAGE", "message": body}]
    if isinstance(message, Failure):
        failure: dict[str, object] = {"agent_id": id_to_mesos(message.agent_id)}
        if message.executor_id is not None:
            failure["executor_id"] = id_to_mesos(message.executor_id)
        if message.status is not None:
            failure["status"] = message.status
        return [{"type": "FAILURE", "failure": failure}]
    if isinstance(message, Error):
        return [error_event(message.message)]
    if isinstance(message, Heartbeat):
        return [heartbeat_event()]
    if isinstance(message, InverseOffers):
        return [
            {
                "type": "INVERSE_OFFERS",
                "inverse_offers": {
                    "inverse_offers": [
                        {
                            "id": id_to_mesos(o.inverse_offer_id),
                            "framework_id": id_to_mesos(o.framework_id),
                            "agent_id": id_to_mesos(o.agent_id),
                            "unavailability": {
                                "start": duration_to_mesos(o.start),
                                "duration": duration_to_mesos(o.duration),
                            },
                            "resources": [],
                        }
                        for o in message.inverse_offers
                    ]
                },
            }
        ]
    if isinstance(message, RescindInverseOffer):
        rescind = {"inverse_offer_id": id_to_mesos(message.inverse_offer_id)}
        return [{"type": "RESCIND_INVERSE_OFFER", "rescind_inverse_offer": rescind}]
    return []


def _update(status: TaskStatus) -> dict[str, object]:
    return {"type": "UPDATE", "update": {"status": status_to_mesos(status)}}


def _subscribed(message: Subscribed, version: str) -> dict[str, object]:
    info = message.master_info
    host, _, port = info.address.removeprefix("tcp://").rpartition(":")
    master: dict[str, object] = {
        "id": info.master_id,
        "ip": 0,
        "port": int(port) if port.isdigit() else 0,
        "hostname": host.strip("[]"),
        "version": version,
        "address": {"hostname": host.strip("[]"), "port": int(port) if port.isdigit() else 0},
    }
    return {
        "type": "SUBSCRIBED",
        "subscribed": {
            "framework_id": id_to_mesos(message.framework_id),
            "heartbeat_interval_seconds": message.heartbeat_interval_seconds,
            "master_info": master,
        },
    }
