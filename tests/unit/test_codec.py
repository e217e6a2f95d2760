"""agora.sdk.codec: wire format, round trips and every kind of validation failure.

Run as a script (``python tests/unit/test_codec.py``) to print encode/decode timings of an OFFERS
frame with 100 offers; ``tests/bench/codec.py`` is the benchmark (figures: docs/benchmarks.md).
"""

from __future__ import annotations

import math
import pickle
import timeit
from typing import Any

import msgpack
import pytest
from agora.sdk.codec import MAX_FRAME_BYTES, PROTOCOL_VERSION, Envelope, decode, encode
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    URI,
    Accept,
    AgentInfo,
    AgentTask,
    CommandInfo,
    Decline,
    Error,
    ErrorCode,
    ExecutorInfo,
    ExecutorToFramework,
    Failure,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    GangRequest,
    Heartbeat,
    Launch,
    LaunchGroup,
    MasterInfo,
    Message,
    Offer,
    Offers,
    Placement,
    Reason,
    Reconcile,
    ReconcileTask,
    Request,
    ReregisterAgent,
    ReregisterExecutor,
    Reserve,
    RunTaskGroup,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Subscribe,
    Subscribed,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
    Teardown,
    Unreserve,
    Update,
)
from agora.sdk.resources import Resources

R = Resources.parse("cpus:2;mem:1024;ports:[31000-31010];zones:{a,b};cpus(batch):0.5")
FW = FrameworkID("fw-1")
AG = AgentID("agent-1")
EX = ExecutorID("exec-1")
CMD = CommandInfo(
    value="sleep 10", environment={"HOME": "/tmp"}, uris=(URI(value="http://x/y.tgz"),)
)
TASK = TaskInfo(
    task_id=TaskID("t-1"),
    name="sleeper",
    agent_id=AG,
    resources=R,
    command=CMD,
    labels={"team": "ml"},
    data=b"\x00\xff",
    kill_grace_period=3.5,
)
EXECUTOR = ExecutorInfo(executor_id=EX, framework_id=FW, command=CMD, resources=R, name="ex")
STATUS = TaskStatus(
    task_id=TaskID("t-1"),
    state=TaskState.RUNNING,
    source=StatusSource.EXECUTOR,
    reason=Reason.RECONCILIATION,
    message="ok",
    agent_id=AG,
    executor_id=EX,
    uuid=b"0123456789abcdef",
    healthy=True,
    timestamp=1.7e9,
    unreachable_time=None,
)
INFO = FrameworkInfo(
    name="spark",
    roles=("batch", "*"),
    failover_timeout=7 * 86_400,
    capabilities=(FrameworkCapability.PARTITION_AWARE, FrameworkCapability.GANG),
    principal="alice",
    framework_id=FW,
    checkpoint=True,
)

SAMPLES: list[Message] = [
    Heartbeat(),
    Teardown(framework_id=FW),
    Subscribe(framework_info=INFO, suppressed_roles=("batch",)),
    Accept(
        framework_id=FW,
        offer_ids=(OfferID("o-1"), OfferID("o-2")),
        operations=(
            Reserve(resources=R),
            Launch(
                task_infos=(
                    TASK,
                    TaskInfo(task_id=TaskID("t-2"), name="", agent_id=AG, resources=R),
                )
            ),
            LaunchGroup(executor=EXECUTOR, task_group=TaskGroupInfo(tasks=(TASK,))),
            Unreserve(resources=R),
        ),
        filters=Filters(refuse_seconds=0.5),
    ),
    Decline(framework_id=FW, offer_ids=()),
    Reconcile(framework_id=FW, tasks=(ReconcileTask(task_id=TaskID("t"), agent_id=AG),)),
    Request(
        framework_id=FW,
        gangs=(
            GangRequest(
                gang_id=GangID("g"),
                role="batch",
                count=8,
                shape=Resources.parse("cpus:1;gpus:1"),
                placement=Placement.PACK,
                hold_timeout=0.25,
                max_per_agent=2,
            ),
        ),
    ),
    Subscribed(
        framework_id=FW,
        heartbeat_interval_seconds=15.0,
        master_info=MasterInfo(master_id="m1", address="tcp://m:5050", epoch=4),
    ),
    Offers(
        offers=(
            Offer(
                offer_id=OfferID("o-1"),
                framework_id=FW,
                agent_id=AG,
                hostname="h1",
                role="*",
                resources=R,
                attributes={"rack": "r1"},
                gang_id=GangID("g"),
            ),
        )
    ),
    Update(status=STATUS),
    Failure(agent_id=AG, executor_id=EX, status=-9),
    Error(message="no", code=ErrorCode.NOT_LEADER),
    ReregisterAgent(
        agent_id=AG,
        agent_info=AgentInfo(hostname="h1", resources=R, attributes={"os": "linux"}, port=5051),
        tasks=(AgentTask(task=TASK, framework_id=FW, state=TaskState.STAGING, status_uuid=b"u"),),
        executors=(EXECUTOR,),
        frameworks=(INFO,),
    ),
    RunTaskGroup(
        framework_info=INFO,
        framework_id=FW,
        executor=EXECUTOR,
        task_group=TaskGroupInfo(tasks=(TASK,)),
    ),
    StatusUpdateMessage(
        update=StatusUpdate(framework_id=FW, status=STATUS, latest_state=TaskState.FINISHED)
    ),
    ExecutorToFramework(framework_id=FW, executor_id=EX, data=b"x" * 1000),
    ReregisterExecutor(
        framework_id=FW,
        executor_id=EX,
        tasks=(TASK,),
        updates=(StatusUpdate(framework_id=FW, status=STATUS),),
    ),
]


def _frame(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def _reject(obj: object, **kwargs: Any) -> ProtocolError:
    frame = obj if isinstance(obj, bytes) else _frame(obj)
    with pytest.raises(ProtocolError) as info:
        decode(frame, **kwargs)
    return info.value


def _body(**fields: object) -> list[object]:
    """An UPDATE frame whose status carries ``fields`` on top of a valid minimum."""
    status = {"task_id": "t", "state": "RUNNING", "source": "AGENT", **fields}
    return ["UPDATE", 1, 0, {"status": status}]


# ---- round trips and wire format ----------------------------------------------------------------


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.NAME)
def test_round_trip(message: Message) -> None:
    assert decode(encode(message, epoch=12)) == Envelope(message, 12)
    assert decode(encode(message)).epoch == 0


def test_decoded_values_have_their_declared_types() -> None:
    accept = SAMPLES[3]
    got = decode(encode(accept)).message
    assert isinstance(got, Accept)
    assert type(got.framework_id) is FrameworkID
    assert all(type(o) is OfferID for o in got.offer_ids)
    launch = got.operations[1]
    assert isinstance(launch, Launch)
    assert type(launch.task_infos[0].task_id) is TaskID
    assert isinstance(launch.task_infos[0].resources, Resources)
    assert type(got.operations) is tuple


def test_float_fields_accept_ints() -> None:
    decline = Decline(framework_id=FW, offer_ids=(), filters=Filters(refuse_seconds=5))
    got = decode(encode(decline)).message
    assert isinstance(got, Decline)
    assert got.filters.refuse_seconds == 5.0
    assert type(got.filters.refuse_seconds) is float


def test_wire_layout() -> None:
    frame = encode(SAMPLES[3], epoch=3)
    name, version, epoch, body = msgpack.unpackb(frame, raw=False)
    assert (name, version, epoch) == ("ACCEPT", 1, 3)
    assert PROTOCOL_VERSION == 1
    ops = body["operations"]
    assert [op["type"] for op in ops] == ["RESERVE", "LAUNCH", "LAUNCH_GROUP", "UNRESERVE"]
    assert ops[0]["resources"] == R.to_dict()
    task = ops[1]["task_infos"][0]
    assert isinstance(task["data"], bytes)  # msgpack bin, not str
    status = msgpack.unpackb(encode(SAMPLES[9]), raw=False)[3]["status"]
    assert status["state"] == "RUNNING" and status["reason"] == "RECONCILIATION"


def test_omitted_optional_fields_take_their_defaults() -> None:
    got = decode(_frame(["ACCEPT", 1, 0, {"framework_id": "f", "offer_ids": ["o"]}])).message
    assert got == Accept(framework_id=FrameworkID("f"), offer_ids=(OfferID("o"),))


def test_decode_accepts_bytes_like_frames() -> None:
    frame = encode(SAMPLES[1])
    assert decode(bytearray(frame)) == decode(memoryview(frame)) == decode(frame)


def test_protocol_error_pickles_with_its_field() -> None:
    err = pickle.loads(pickle.dumps(ProtocolError("x: bad", field="x")))
    assert str(err) == "x: bad" and err.field == "x"


# ---- decode failures, one per kind --------------------------------------------------------------


def test_wrong_type_names_the_dotted_path() -> None:
    info = {"name": "x", "roles": ["a", "b", 3]}
    err = _reject(["SUBSCRIBE", 1, 0, {"framework_info": info}])
    assert str(err) == "SUBSCRIBE.framework_info.roles[2]: expected str, got int"
    assert err.field == "SUBSCRIBE.framework_info.roles[2]"


def test_wrong_type_inside_an_operation() -> None:
    op = {"type": "LAUNCH", "task_infos": [{"task_id": "t", "name": 5, "agent_id": "a"}]}
    body = {"framework_id": "f", "offer_ids": [], "operations": [op]}
    err = _reject(["ACCEPT", 1, 0, body])
    assert str(err) == "ACCEPT.operations[0].task_infos[0].name: expected str, got int"


def test_missing_field() -> None:
    err = _reject(["ACCEPT", 1, 0, {"framework_id": "f"}])
    assert str(err) == "ACCEPT: missing required field 'offer_ids'"
    assert err.field == "ACCEPT.offer_ids"


def test_unknown_fields_are_ignored() -> None:
    # what a newer peer adds (rolling upgrades); tests/unit/test_codec_versions.py pins it
    got = decode(_frame(["ACCEPT", 1, 0, {"framework_id": "f", "offer_ids": [], "x": [1]}]))
    assert got.message == Accept(framework_id=FrameworkID("f"), offer_ids=())
    got = decode(_frame(_body(colour="red")))
    assert isinstance(got.message, Update) and got.message.status.task_id == "t"


def test_bad_enum_value() -> None:
    err = _reject(_body(state="RUNNIN"))
    assert str(err).startswith("UPDATE.status.state: expected a TaskState (STAGING, ")
    assert str(err).endswith("got 'RUNNIN'")
    assert "expected a Reason name, got int" in str(_reject(_body(reason=3)))


def test_bad_operation_type() -> None:
    body = {"framework_id": "f", "offer_ids": [], "operations": [{"type": "GROW_VOLUME"}]}
    err = _reject(["ACCEPT", 1, 0, body])
    assert str(err) == (
        "ACCEPT.operations[0]: unknown type 'GROW_VOLUME' "
        "(expected one of LAUNCH, LAUNCH_GROUP, RESERVE, UNRESERVE, CREATE, DESTROY)"
    )
    body["operations"] = [{"resources": {}}]
    assert str(_reject(["ACCEPT", 1, 0, body])) == (
        "ACCEPT.operations[0]: missing required field 'type'"
    )


def test_over_long_string() -> None:
    err = _reject(["TEARDOWN", 1, 0, {"framework_id": "x" * 256}])
    assert (
        str(err)
        == "TEARDOWN.framework_id: string of 256 characters exceeds the 255-character limit"
    )
    err = _reject(["ERROR", 1, 0, {"message": "x" * (64 * 1024 + 1)}])
    assert str(err).startswith("ERROR.message: string of 65537 characters exceeds")


def test_over_long_list() -> None:
    err = _reject(["REVIVE", 1, 0, {"framework_id": "f", "roles": ["r"] * 1025}])
    assert str(err) == "REVIVE.roles: 1025 items exceed the 1024-item limit"


def test_over_long_bytes() -> None:
    body = {"framework_id": "f", "agent_id": "a", "task_id": "t", "uuid": b"u" * 65}
    err = _reject(["ACKNOWLEDGE", 1, 0, body])
    assert str(err) == "ACKNOWLEDGE.uuid: 65 bytes exceed the 64-byte limit"
    body = {"framework_id": "f", "executor_id": "e", "data": b"d" * (4 * 1024 * 1024 + 1)}
    err = _reject(["FRAMEWORK_TO_EXECUTOR", 1, 0, body])
    assert str(err).startswith("FRAMEWORK_TO_EXECUTOR.data: 4194305 bytes exceed")


def test_over_long_mapping() -> None:
    offer = {
        "offer_id": "o",
        "framework_id": "f",
        "agent_id": "a",
        "hostname": "h",
        "role": "*",
        "resources": {},
        "attributes": {str(i): "v" for i in range(1025)},
    }
    err = _reject(["OFFERS", 1, 0, {"offers": [offer]}])
    assert str(err) == "OFFERS.offers[0].attributes: 1025 entries exceed the 1024-entry limit"
    offer["attributes"] = {"rack": 7}
    err = _reject(["OFFERS", 1, 0, {"offers": [offer]}])
    assert err.field == "OFFERS.offers[0].attributes['rack']"


def test_hostile_lengths_stop_in_the_parser() -> None:
    # An array header claiming 2**32 - 1 items in a 10-byte frame must not allocate them.
    frame = _frame(["OFFERS", 1, 0])[:-1] + b"\x94" + b"\xdd\xff\xff\xff\xff"
    assert str(_reject(frame)).startswith("malformed msgpack frame")


def test_oversized_frame() -> None:
    err = _reject(b"\x00" * 20_000_000)
    assert str(err) == "frame of 20000000 bytes exceeds the 16777216-byte limit"
    assert err.field is None
    frame = encode(SAMPLES[3])
    err = _reject(frame, max_frame_bytes=100)
    assert str(err) == f"frame of {len(frame)} bytes exceeds the 100-byte limit"
    # a caller can only lower the limit
    assert str(_reject(b"\x00" * (MAX_FRAME_BYTES + 1), max_frame_bytes=2**40)).startswith(
        f"frame of {MAX_FRAME_BYTES + 1} bytes"
    )


def test_unknown_message() -> None:
    err = _reject(["FOO", 1, 0, {}])
    assert str(err) == "unknown message 'FOO'"
    assert err.field is None


def test_unsupported_version() -> None:
    assert str(_reject(["RUN_TASK", 9, 0, {}])) == "RUN_TASK version 9 is not supported (max 1)"
    assert str(_reject(["HEARTBEAT", 0, 0, {}])) == "HEARTBEAT version 0 is not supported (max 1)"
    assert str(_reject(["HEARTBEAT", "1", 0, {}])) == "HEARTBEAT version: expected int, got str"


def test_trailing_bytes() -> None:
    err = _reject(encode(Heartbeat()) + b"\xc0\xc0")
    assert str(err) == "2 trailing bytes after the frame"


def test_bool_is_not_an_int_nor_an_int_a_bool() -> None:
    err = _reject(["FAILURE", 1, 0, {"agent_id": "a", "status": True}])
    assert str(err) == "FAILURE.status: expected int, got bool"
    assert str(_reject(_body(healthy=1))) == "UPDATE.status.healthy: expected bool, got int"
    assert (
        str(_reject(_body(timestamp=True))) == "UPDATE.status.timestamp: expected float, got bool"
    )
    assert str(_reject(["HEARTBEAT", True, 0, {}])) == "HEARTBEAT version: expected int, got bool"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers(value: float) -> None:
    err = _reject(_body(timestamp=value))
    assert str(err) == f"UPDATE.status.timestamp: expected a finite number, got {value!r}"


def test_out_of_range_numbers() -> None:
    body = {"framework_id": "f", "offer_ids": [], "filters": {"refuse_seconds": -1}}
    err = _reject(["DECLINE", 1, 0, body])
    assert str(err) == "DECLINE.filters.refuse_seconds: -1.0 is out of range [0, 31536000]"
    gang = {"gang_id": "g", "role": "*", "count": 0, "shape": {}}
    err = _reject(["REQUEST", 1, 0, {"framework_id": "f", "gangs": [gang]}])
    assert str(err) == "REQUEST.gangs[0].count: 0 is out of range [1, 10000]"
    gang = {**gang, "count": 1, "hold_timeout": 0}
    err = _reject(["REQUEST", 1, 0, {"framework_id": "f", "gangs": [gang]}])
    assert str(err) == "REQUEST.gangs[0].hold_timeout: 0.0 is out of range (0, 31536000]"


def test_bad_resources_name_the_field() -> None:
    offer: dict[str, object] = {
        "offer_id": "o",
        "framework_id": "f",
        "agent_id": "a",
        "hostname": "h",
        "role": "*",
        "resources": {"cpus": "x"},
    }
    err = _reject(["OFFERS", 1, 0, {"offers": [offer]}])
    assert str(err).startswith("OFFERS.offers[0].resources: bad resources: ")
    assert err.field == "OFFERS.offers[0].resources"
    offer["resources"] = [1]
    assert str(_reject(["OFFERS", 1, 0, {"offers": [offer]}])) == (
        "OFFERS.offers[0].resources: expected map, got array"
    )


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"a": 1}, "a frame is an array [name, version, epoch, body], got map"),
        (["HEARTBEAT", 1, 0], "a frame is an array [name, version, epoch, body], got 3 items"),
        ([7, 1, 0, {}], "message name: expected str, got int"),
        (["HEARTBEAT", 1, -1, {}], "HEARTBEAT epoch: expected an int >= 0, got -1"),
        (["HEARTBEAT", 1, 0.0, {}], "HEARTBEAT epoch: expected an int >= 0, got 0.0"),
        (["HEARTBEAT", 1, 0, []], "HEARTBEAT: expected map, got array"),
        (["HEARTBEAT", 1, 0, {b"k": 1}], "HEARTBEAT: field names must be str, got bytes b'k'"),
        (
            ["TEARDOWN", 1, 0, {"framework_id": None}],
            "TEARDOWN.framework_id: expected str, got nil",
        ),
    ],
)
def test_bad_envelopes(obj: object, expected: str) -> None:
    assert str(_reject(obj)) == expected


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"\x94\xa3FOO",  # truncated
        b"\x94\xa2\xff\xfe\x01\x00\x80",  # invalid UTF-8 in a str
        b"\x94\xa9HEARTBEAT\x01\x00\x81\xd4\x01\x00",  # ext type
        b"\x91" * 100_000,  # deep nesting
        b"\x94\xa9HEARTBEAT\x01\x00\x81\x80\x00",  # a map as a map key
    ],
)
def test_malformed_msgpack(frame: bytes) -> None:
    err = _reject(frame)
    assert err.field is None


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(ProtocolError, match="a frame must be bytes, not str"):
        decode("HEARTBEAT")  # type: ignore[arg-type]


# ---- encode failures ----------------------------------------------------------------------------


def test_encode_checks_types_and_bounds_with_paths() -> None:
    with pytest.raises(ProtocolError) as info:
        bad_roles: Any = ("a", 3)
        encode(Subscribe(framework_info=FrameworkInfo(name="x", roles=bad_roles)))
    assert str(info.value) == "SUBSCRIBE.framework_info.roles[1]: expected str, got int"
    with pytest.raises(ProtocolError, match=r"^ACCEPT.offer_ids: expected tuple, got list$"):
        encode(Accept(framework_id=FW, offer_ids=[OfferID("o")]))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"^UPDATE.status.state: expected TaskState, got str$"):
        state: Any = "RUNNING"
        encode(
            Update(status=TaskStatus(task_id=TaskID("t"), state=state, source=StatusSource.MASTER))
        )
    with pytest.raises(ProtocolError, match="finite"):
        encode(Decline(framework_id=FW, offer_ids=(), filters=Filters(refuse_seconds=math.nan)))
    with pytest.raises(ProtocolError, match=r"^TEARDOWN.framework_id: string of 300"):
        encode(Teardown(framework_id=FrameworkID("f" * 300)))
    with pytest.raises(ProtocolError, match="out of range"):
        encode(Failure(agent_id=AG, status=2**64))


def test_encode_rejects_bad_epochs_and_unregistered_types() -> None:
    with pytest.raises(ProtocolError, match="epoch"):
        encode(Heartbeat(), epoch=-1)
    with pytest.raises(ProtocolError, match="epoch"):
        encode(Heartbeat(), epoch=True)
    with pytest.raises(ProtocolError, match="not a registered message"):
        encode(Filters())  # type: ignore[arg-type]


def test_encode_rejects_unpackable_strings() -> None:
    with pytest.raises(ProtocolError, match="cannot be packed"):
        encode(Error(message="\ud800"))


def test_encode_refuses_oversized_frames() -> None:
    big = TaskInfo(task_id=TaskID("t"), name="t", agent_id=AG, resources=R, data=b"x" * 4_000_000)
    with pytest.raises(
        ProtocolError, match=r"^frame of \d+ bytes exceeds the 16777216-byte limit$"
    ):
        encode(ReregisterExecutor(framework_id=FW, executor_id=EX, tasks=(big,) * 5))


# ---- timing note (not a test) -------------------------------------------------------------------


def _timing() -> None:
    offers = tuple(
        Offer(
            offer_id=OfferID(f"offer-{i}"),
            framework_id=FW,
            agent_id=AgentID(f"agent-{i}"),
            hostname=f"host-{i}.example",
            role="*",
            resources=Resources.parse("cpus:8;mem:16384;disk:100000;ports:[31000-32000]"),
            attributes={"rack": f"r{i % 10}"},
        )
        for i in range(100)
    )
    message = Offers(offers=offers)
    frame = encode(message, epoch=7)
    n = 200
    enc = min(timeit.repeat(lambda: encode(message, epoch=7), number=n, repeat=5)) / n
    dec = min(timeit.repeat(lambda: decode(frame), number=n, repeat=5)) / n
    print(f"OFFERS x100: {len(frame)} bytes, encode {enc * 1e6:.0f} us, decode {dec * 1e6:.0f} us")


if __name__ == "__main__":
    _timing()
