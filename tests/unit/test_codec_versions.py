"""Neighbouring versions of the wire schema talk to each other (rolling upgrades).

An "older" schema is a real record class without its newest optional field(s), built here the way
the older release declared it; the "newer" one is today's class, or today's class with a field
added. Each side decodes what the other encodes: unknown fields are ignored, missing optional
fields take their defaults. Both the frame codec (``encode``/``decode``) and the bare-record codec
(``pack_record``/``unpack_record``, the checkpoints' and registry's) are pinned.
"""

from __future__ import annotations

from typing import Any, ClassVar, get_type_hints

import msgpack
import msgspec
import pytest
from agora.sdk.codec import decode, encode, pack_record, unpack_record
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, TaskID
from agora.sdk.messages import (
    MasterInfo,
    Message,
    Record,
    StateReply,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from agora.sdk.messages._record import ShortStr
from agora.sdk.resources import Resources


def _without(cls: type[Record], *dropped: str) -> type[Record]:
    """``cls`` as a release before ``dropped`` were added declared it (same NAME, if any)."""
    hints = get_type_hints(cls, include_extras=True)
    spec: list[Any] = []
    for f in msgspec.structs.fields(cls):
        if f.name in dropped:
            continue
        if f.default is not msgspec.NODEFAULT:
            spec.append((f.name, hints[f.name], f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            spec.append((f.name, hints[f.name], msgspec.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, hints[f.name]))
    assert len(spec) == len(msgspec.structs.fields(cls)) - len(dropped)
    ns = {"NAME": getattr(cls, "NAME", None)} if issubclass(cls, Message) else {}
    old: type[Record] = msgspec.defstruct(
        f"Old{cls.__name__}",
        spec,
        bases=(cls.__mro__[1],),
        namespace=ns,
        frozen=True,
        kw_only=True,
    )
    return old


def _common(record: Record, other: type[Record]) -> dict[str, Any]:
    names = {f.name for f in msgspec.structs.fields(other)}
    return {k: v for k, v in _fields(record).items() if k in names}


def _fields(record: Record) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in msgspec.structs.fields(record)}


MASTER = MasterInfo(master_id="m1", address="tcp://m:5050", epoch=4)
NEW_STATE = StateReply(
    master_info=MASTER,
    cluster="prod",
    resources_total=Resources.parse("cpus:8;mem:1024"),
    insecure=True,
)
OldStateReply = _without(StateReply, "insecure")


# ---- a real message: STATE before and after its ``insecure`` field ------------------------------


def _body_of(frame: bytes) -> tuple[str, int, int, dict[str, Any]]:
    name, version, epoch, body = msgpack.unpackb(frame, raw=False)
    return name, version, epoch, body


def test_an_older_peer_decodes_a_newer_frame() -> None:
    name, _version, epoch, body = _body_of(encode(NEW_STATE, epoch=4))
    assert (name, epoch, body["insecure"]) == ("STATE", 4, True)
    # the older release reads the same body with its own schema: the new field is skipped
    old = unpack_record(OldStateReply, msgpack.packb(body, use_bin_type=True))
    assert type(old) is OldStateReply
    assert _fields(old) == _common(NEW_STATE, OldStateReply)


def test_a_newer_peer_decodes_an_older_frame() -> None:
    old = OldStateReply(master_info=MASTER, cluster="prod")  # type: ignore[call-arg]
    body = msgpack.unpackb(pack_record(old), raw=False)
    assert "insecure" not in body
    frame = msgpack.packb(["STATE", 1, 4, body], use_bin_type=True)
    got = decode(frame)
    assert got.epoch == 4
    assert got.message == StateReply(master_info=MASTER, cluster="prod", insecure=False)


# ---- a nested record one version ahead: a field added deep inside a status update ---------------


class NewerTaskStatus(TaskStatus, frozen=True, kw_only=True):
    """TaskStatus as a later release might extend it: a new optional field."""

    container_id: ShortStr | None = None


class NewerStatusUpdate(Record, frozen=True, kw_only=True):
    framework_id: str
    status: NewerTaskStatus
    latest_state: TaskState | None = None
    #: a second new field, at this level
    batch: int = 0


class NewerStatusUpdateMessage(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "STATUS_UPDATE_NEWER"
    update: NewerStatusUpdate
    priority: int = 0


def _newer_status() -> NewerStatusUpdateMessage:
    status = NewerTaskStatus(
        task_id=TaskID("t-1"),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        agent_id=AgentID("a-1"),
        executor_id=ExecutorID("t-1"),
        uuid=b"0123456789abcdef",
        timestamp=1.7e9,
        container_id="c-42",
    )
    return NewerStatusUpdateMessage(
        update=NewerStatusUpdate(framework_id="fw", status=status, batch=3), priority=7
    )


def test_todays_codec_decodes_a_frame_with_new_fields_at_every_level() -> None:
    newer = _newer_status()
    body = msgpack.unpackb(pack_record(newer), raw=False)
    assert body["priority"] == 7 and body["update"]["status"]["container_id"] == "c-42"
    got = decode(msgpack.packb(["STATUS_UPDATE", 1, 0, body], use_bin_type=True)).message
    assert isinstance(got, StatusUpdateMessage)
    status = newer.update.status
    assert got.update == StatusUpdate(
        framework_id=newer.update.framework_id,
        status=TaskStatus(**_common(status, TaskStatus)),
    )


def test_a_newer_schema_decodes_todays_frame_with_its_defaults() -> None:
    status = TaskStatus(task_id=TaskID("t"), state=TaskState.FINISHED, source=StatusSource.AGENT)
    today = StatusUpdateMessage(update=StatusUpdate(framework_id="fw", status=status))  # type: ignore[arg-type]
    _name, _version, _epoch, body = _body_of(encode(today))
    got = unpack_record(NewerStatusUpdateMessage, msgpack.packb(body, use_bin_type=True))
    assert got.priority == 0 and got.update.batch == 0
    assert got.update.status.container_id is None
    assert got.update.status.state is TaskState.FINISHED


def test_new_fields_are_still_checked_by_the_peer_that_knows_them() -> None:
    bad = msgpack.unpackb(pack_record(_newer_status()), raw=False)
    bad["update"]["status"]["container_id"] = "x" * 300
    data = msgpack.packb(bad, use_bin_type=True)
    with pytest.raises(ProtocolError) as info:
        unpack_record(NewerStatusUpdateMessage, data)
    assert info.value.field == "NewerStatusUpdateMessage.update.status.container_id"
    # ...and ignored, whatever they hold, by the one that does not
    got = decode(msgpack.packb(["STATUS_UPDATE", 1, 0, bad], use_bin_type=True)).message
    assert isinstance(got, StatusUpdateMessage)


def test_a_required_field_an_older_peer_omits_is_still_reported() -> None:
    body = msgpack.unpackb(pack_record(OldStateReply(master_info=MASTER)), raw=False)  # type: ignore[call-arg]
    del body["master_info"]
    with pytest.raises(ProtocolError) as info:
        decode(msgpack.packb(["STATE", 1, 0, body], use_bin_type=True))
    assert str(info.value) == "STATE: missing required field 'master_info'"
