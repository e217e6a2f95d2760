"""Several updates or acknowledgements in one message: merging keeps order and bounds, taking a
batch apart gives back exactly what was merged, and the master core handles a batch as the
messages it carries."""

from __future__ import annotations

import uuid

import msgpack
import pytest
from agora.master.core import Send
from agora.master.server.batches import Batcher
from agora.sdk import codec
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    Acknowledge,
    Acknowledgements,
    AgentInfo,
    FrameworkInfo,
    Heartbeat,
    Message,
    Offers,
    RegisterAgent,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateAcks,
    StatusUpdateMessage,
    StatusUpdates,
    Subscribe,
    TaskState,
    TaskStatus,
    Update,
    Updates,
)
from agora.sdk.messages.batching import BATCHES, MAX_ITEM_BYTES, coalesce, unbatch
from agora.sdk.messages.common import MAX_BATCH_ITEMS
from agora.sdk.resources import Resources
from support.master_kit import Harness, offers_in

FW = FrameworkID("fw-1")
AG = AgentID("ag-1")


def _status(i: int, *, data: bytes = b"") -> TaskStatus:
    return TaskStatus(
        task_id=TaskID(f"t{i}"),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        agent_id=AG,
        uuid=uuid.UUID(int=i + 1).bytes,
        data=data,
    )


def _update(i: int, **kw: bytes) -> Update:
    return Update(status=_status(i, **kw))


def _ack(i: int) -> Acknowledge:
    return Acknowledge(framework_id=FW, agent_id=AG, task_id=TaskID(f"t{i}"), uuid=b"u" * 16)


def _flat(messages: list[Message]) -> list[Message]:
    return [part for m in messages for part in unbatch(m)]


def test_a_run_of_updates_becomes_one_message_and_comes_back_in_order() -> None:
    messages: list[Message] = [_update(i) for i in range(5)]
    merged = coalesce(messages)
    assert len(merged) == 1 and isinstance(merged[0], Updates)
    assert _flat(merged) == messages


def test_each_kind_merges_into_its_own_batch_and_a_lone_message_stays_plain() -> None:
    su = [
        StatusUpdateMessage(update=StatusUpdate(framework_id=FW, status=_status(i))) for i in (1, 2)
    ]
    acks = [StatusUpdateAck(framework_id=FW, task_id=TaskID("t"), uuid=b"u" * 16) for _ in (1, 2)]
    assert [type(m) for m in coalesce(su)] == [StatusUpdates]
    assert [type(m) for m in coalesce(acks)] == [StatusUpdateAcks]
    assert [type(m) for m in coalesce([_ack(1), _ack(2)])] == [Acknowledgements]
    assert coalesce([_update(1)]) == [_update(1)]  # what an older peer would get
    assert coalesce([]) == []


def test_another_message_ends_a_run_so_order_is_kept() -> None:
    beat = Heartbeat()
    messages: list[Message] = [
        _update(1),
        _update(2),
        beat,
        _update(3),
        _ack(4),
        _ack(5),
        _update(6),
    ]
    merged = coalesce(messages)
    assert [type(m) for m in merged] == [Updates, Heartbeat, Update, Acknowledgements, Update]
    assert _flat(merged) == messages


def test_runs_are_cut_at_the_batch_limit() -> None:
    messages: list[Message] = [_update(i) for i in range(2 * MAX_BATCH_ITEMS + 1)]
    merged = coalesce(messages)
    assert [len(unbatch(m)) for m in merged] == [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 1]
    assert _flat(merged) == messages


def test_an_update_with_a_large_payload_travels_alone() -> None:
    big = _update(2, data=b"x" * (MAX_ITEM_BYTES + 1))
    messages: list[Message] = [_update(1), big, _update(3), _update(4)]
    merged = coalesce(messages)
    assert merged[:2] == [_update(1), big]
    assert isinstance(merged[2], Updates)
    # The worst batch stays far below the frame limit.
    worst = Updates(
        statuses=tuple(_status(i, data=b"x" * MAX_ITEM_BYTES) for i in range(MAX_BATCH_ITEMS))
    )
    assert len(codec.encode(worst)) < codec.MAX_FRAME_BYTES // 4


def test_batches_cross_the_wire() -> None:
    for batch in coalesce([_update(1), _update(2)]) + coalesce([_ack(1), _ack(2)]):
        assert codec.decode(codec.encode(batch)).message == batch


def test_a_batch_over_the_limit_is_refused_both_ways() -> None:
    too_many = Updates(statuses=tuple(_status(i) for i in range(MAX_BATCH_ITEMS + 1)))
    with pytest.raises(ProtocolError, match="statuses"):
        codec.encode(too_many)
    # A peer that sends one anyway: the frame is refused whole, naming the field.
    name, version, epoch, body = msgpack.unpackb(
        codec.encode(Updates(statuses=too_many.statuses[:-1]))
    )
    body["statuses"].append(body["statuses"][-1])
    with pytest.raises(ProtocolError, match="statuses"):
        codec.decode(msgpack.packb([name, version, epoch, body]))


# ---- the master daemon's batcher ----------------------------------------------------------


def _send(to: str, message: Message, epoch: int = 1) -> Send:
    return Send(to=to, message=message, epoch=epoch)


def _reader(peer: str = "fw-peer") -> Batcher:
    batcher = Batcher()
    info = FrameworkInfo(name="fw")
    batcher.heard(peer, Subscribe(framework_info=info, features=(BATCHES, "from-the-future")))
    return batcher


def test_only_peers_that_announced_batches_get_their_updates_held() -> None:
    batcher = _reader()
    assert batcher.hold(_send("fw-peer", _update(1)))
    assert not batcher.hold(_send("other", _update(2)))  # never said it reads batches
    assert not batcher.hold(_send("fw-peer", Offers(offers=())))  # only updates and acks wait
    batcher.heard("fw-peer", Subscribe(framework_info=FrameworkInfo(name="fw")))
    assert not batcher.hold(_send("fw-peer", _update(3)))  # re-subscribed as an older driver
    info = AgentInfo(hostname="h", resources=Resources.parse("cpus:1;mem:64"))
    batcher.heard("agent-peer", RegisterAgent(agent_info=info, features=(BATCHES,)))
    ack = StatusUpdateAck(framework_id=FW, task_id=TaskID("t"), uuid=b"u" * 16)
    assert batcher.hold(_send("agent-peer", ack))
    batcher.forget("agent-peer")
    assert not batcher.hold(_send("agent-peer", ack))


def test_held_messages_leave_merged_per_peer_and_never_across_an_epoch() -> None:
    batcher = _reader("a")
    batcher.heard("b", Subscribe(framework_info=FrameworkInfo(name="b"), features=(BATCHES,)))
    for i in range(3):
        batcher.hold(_send("a", _update(i)))
    batcher.hold(_send("b", _update(9)))
    batcher.hold(_send("a", _update(3), epoch=2))
    released = batcher.release()
    assert [(peer, type(m), epoch) for peer, m, epoch in released] == [
        ("a", Updates, 1),
        ("a", Update, 2),
        ("b", Update, 1),
    ]
    assert _flat([m for peer, m, _ in released if peer == "a"]) == [_update(i) for i in range(4)]
    assert batcher.release() == [] and not batcher.holding


def test_what_is_held_for_a_peer_can_go_ahead_of_its_next_message() -> None:
    batcher = _reader("a")
    batcher.hold(_send("a", _update(1)))
    batcher.hold(_send("a", _update(2)))
    assert [type(m) for m, _ in batcher.release_for("a")] == [Updates]
    assert batcher.release_for("a") == []


# ---- the master core ----------------------------------------------------------------------


def _two_tasks_running(h: Harness) -> tuple[FrameworkID, AgentID]:
    agent_id = h.register_agent("agent")
    fid = h.subscribe("fw")
    offers = offers_in(h.sent, "fw")
    h.launch(
        "fw",
        fid,
        offers[:1],
        [("t1", "cpus:1;mem:64", agent_id), ("t2", "cpus:1;mem:64", agent_id)],
    )
    return fid, agent_id


def test_the_core_handles_a_batch_as_the_updates_it_carries() -> None:
    one_by_one, batched = Harness(), Harness()
    for h in (one_by_one, batched):
        fid, agent_id = _two_tasks_running(h)
    updates = [
        StatusUpdate(
            framework_id=fid,
            status=TaskStatus(
                task_id=TaskID(t),
                state=TaskState.FINISHED,
                source=StatusSource.EXECUTOR,
                uuid=uuid.UUID(int=n).bytes,
            ),
        )
        for n, t in enumerate(("t1", "t2"), start=1)
    ]
    singles = [
        a for u in updates for a in one_by_one.handle("agent", StatusUpdateMessage(update=u))
    ]
    together = batched.handle("agent", StatusUpdates(updates=tuple(updates)))
    assert [(a.to, type(a.message)) for a in together] == [(a.to, type(a.message)) for a in singles]
    assert [a.message.status.task_id for a in of_type_sends(together, Update)] == ["t1", "t2"]
    # And one ACKNOWLEDGEMENTS acknowledges both: the agent gets both acks, the tasks complete.
    acks = tuple(
        Acknowledge(
            framework_id=fid, agent_id=agent_id, task_id=u.status.task_id, uuid=u.status.uuid
        )
        for u in updates
        if u.status.uuid is not None
    )
    out = batched.handle("fw", Acknowledgements(acks=acks))
    assert [a.message.task_id for a in of_type_sends(out, StatusUpdateAck)] == ["t1", "t2"]
    assert not batched.master.state.tasks


def of_type_sends(actions: list[Send], kind: type[Message]) -> list[Send]:
    return [a for a in actions if isinstance(a.message, kind)]
