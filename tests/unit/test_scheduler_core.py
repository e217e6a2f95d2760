"""The scheduler driver's sans-IO core: what it decides for each event and call, with no
master, sockets or clock."""

from __future__ import annotations

import uuid

import pytest
from agora.sdk import TaskSpec
from agora.sdk.ids import AgentID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    Acknowledgements,
    Decline,
    Error,
    ErrorCode,
    Filters,
    FrameworkInfo,
    MasterInfo,
    Offer,
    Revive,
    StatusSource,
    Subscribe,
    Subscribed,
    Suppress,
    TaskState,
    TaskStatus,
)
from agora.sdk.messages.batching import BATCHES
from agora.sdk.resources import Resources
from agora.sdk.scheduler.core import ErrorVerdict, SchedulerCore

FID = FrameworkID("fw-1")
AID = AgentID("agent-1")


def _subscribed(core: SchedulerCore, *, batches: bool = True) -> None:
    info = MasterInfo(
        master_id="m", address="tcp://m", epoch=1, features=(BATCHES,) if batches else ()
    )
    core.on_subscribed(
        Subscribed(framework_id=FID, heartbeat_interval_seconds=15.0, master_info=info)
    )


def _offer(n: int, resources: str = "cpus:4;mem:4096") -> Offer:
    return Offer(
        offer_id=OfferID(f"o{n}"),
        framework_id=FID,
        agent_id=AID,
        hostname="h",
        role="*",
        resources=Resources.parse(resources),
    )


def _status(task: str, *, with_uuid: bool = True) -> TaskStatus:
    return TaskStatus(
        task_id=TaskID(task),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        agent_id=AID,
        uuid=uuid.uuid4().bytes if with_uuid else None,
    )


def _drain(core: SchedulerCore) -> list[object]:
    out = []
    while (message := core.next_call()) is not None:
        out.append(message)
    return out


def test_subscribe_names_the_framework_once_known_and_keeps_suppressed_roles() -> None:
    core = SchedulerCore(FrameworkInfo(name="f", roles=("a", "b")))
    first = core.subscribe()
    assert isinstance(first, Subscribe) and first.framework_info.framework_id is None
    assert BATCHES in first.features
    assert core.subscribe_pending(connected=False)  # queued for the coming connection
    assert not core.subscribe_pending(connected=True)
    _subscribed(core)
    core.suppress(("b", "a"))
    core.revive(("a",))
    core.lost()
    again = core.subscribe()
    assert again.framework_info.framework_id == FID
    assert again.suppressed_roles == ("b",)
    core.connection_lost()
    assert not core.subscribe_pending(connected=False)  # that SUBSCRIBE went on the old link


def test_subscribed_says_first_registration_or_return_and_voids_held_offers() -> None:
    core = SchedulerCore(FrameworkInfo(name="f"))
    core.subscribe()
    info = MasterInfo(master_id="m", address="tcp://m", epoch=1)
    m = Subscribed(framework_id=FID, heartbeat_interval_seconds=15.0, master_info=info)
    assert core.on_subscribed(m) == (True, False, [])
    core.on_offers([_offer(1), _offer(2)])
    assert core.connection_lost() is True  # it was subscribed: the scheduler is told
    assert core.connection_lost() is False
    assert core.on_subscribed(m) == (False, True, [OfferID("o1"), OfferID("o2")])
    assert core.offers == {}
    assert core.on_subscribed(m) == (False, False, [])  # a duplicate answer: nothing new


def test_messages_of_an_older_master_epoch_are_stale() -> None:
    core = SchedulerCore(FrameworkInfo(name="f"))
    assert core.fresh(3) and core.fresh(3) and core.fresh(4)
    assert not core.fresh(3)


def test_a_launch_places_task_specs_uses_up_its_offer_and_a_bad_one_changes_nothing() -> None:
    core = SchedulerCore(FrameworkInfo(name="f"))
    _subscribed(core)
    core.on_offers([_offer(1), _offer(2)])
    with pytest.raises(ValueError, match="task_id"):
        core.launch(_offer(1), [TaskSpec("x" * 300, "true", "cpus:1;mem:64")], None)
    with pytest.raises(ValueError, match="unknown offer id"):
        core.launch("o9", [TaskSpec("t", "true", "cpus:1;mem:64")], None)
    assert set(core.offers) == {"o1", "o2"} and not core.outbox
    accept = core.launch("o1", [TaskSpec("t", "true", "cpus:1;mem:64")], None)
    assert isinstance(accept, Accept) and accept.offer_ids == ("o1",)
    (task,) = accept.operations[0].task_infos  # type: ignore[union-attr]
    assert task.agent_id == AID and str(task.resources) == "cpus:1;mem:64"
    decline = core.decline([_offer(2)], Filters(refuse_seconds=30))
    assert isinstance(decline, Decline) and decline.filters.refuse_seconds == 30
    assert core.offers == {}
    assert _drain(core) == [accept, decline]


def test_calls_need_a_framework_id_and_acknowledge_needs_a_uuid() -> None:
    core = SchedulerCore(FrameworkInfo(name="f"))
    with pytest.raises(RuntimeError, match="not subscribed"):
        core.decline("o1", None)
    _subscribed(core)
    with pytest.raises(ValueError, match="uuid"):
        core.acknowledge(_status("t", with_uuid=False))
    assert isinstance(core.revive(()), Revive) and isinstance(core.suppress(()), Suppress)
    assert core.suppressed == {"*"}


def test_implicit_acknowledgements_are_queued_and_gathered_for_a_master_that_reads_batches() -> (
    None
):
    core = SchedulerCore(FrameworkInfo(name="f"))
    _subscribed(core)
    core.acknowledged(_status("t1"))
    core.revive(())  # a call made between two acknowledgements
    core.acknowledged(_status("t2"))
    core.acknowledged(_status("t3", with_uuid=False))  # nothing to acknowledge
    sent = _drain(core)
    assert [type(m) for m in sent] == [Acknowledgements, Revive]
    assert [a.task_id for a in sent[0].acks] == ["t1", "t2"]  # type: ignore[attr-defined]

    older = SchedulerCore(FrameworkInfo(name="f"))
    _subscribed(older, batches=False)
    older.acknowledged(_status("t1"))
    older.acknowledged(_status("t2"))
    assert [type(m) for m in _drain(older)] == [Acknowledge, Acknowledge]

    explicit = SchedulerCore(FrameworkInfo(name="f"), implicit_acknowledgements=False)
    _subscribed(explicit)
    explicit.acknowledged(_status("t1"))
    assert not explicit.outbox


@pytest.mark.parametrize(
    ("code", "registered", "new_connection", "verdict"),
    [
        (ErrorCode.FRAMEWORK_REMOVED, True, False, ErrorVerdict.FATAL),
        (ErrorCode.FORBIDDEN, False, False, ErrorVerdict.FATAL),
        (ErrorCode.FORBIDDEN, True, False, ErrorVerdict.FATAL),  # replaced by another scheduler
        (ErrorCode.FORBIDDEN, True, True, ErrorVerdict.STALE),
        (ErrorCode.BAD_REQUEST, False, False, ErrorVerdict.FATAL),  # the SUBSCRIBE was refused
        (ErrorCode.BAD_REQUEST, True, False, ErrorVerdict.REPORT),
        (ErrorCode.NOT_SUBSCRIBED, True, False, ErrorVerdict.RESUBSCRIBE),
        (ErrorCode.NOT_LEADER, True, False, ErrorVerdict.RESUBSCRIBE),
        (ErrorCode.NOT_SUBSCRIBED, False, False, ErrorVerdict.REPORT),
    ],
)
def test_what_an_error_from_the_master_means(
    code: ErrorCode, registered: bool, new_connection: bool, verdict: ErrorVerdict
) -> None:
    core = SchedulerCore(FrameworkInfo(name="f"))
    if registered:
        _subscribed(core)
    if new_connection:
        core.connection_lost()
    assert core.error_verdict(Error(message="no", code=code)) is verdict
