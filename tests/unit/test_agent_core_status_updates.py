"""The status-update manager on its own: ordering, retries, acks, duplicates, pause/resume."""

from __future__ import annotations

import pytest
from agora.agent.core import StatusUpdateManager
from agora.sdk import codec
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    StatusSource,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from hypothesis import given, settings
from hypothesis import strategies as st

F = FrameworkID("fw")
T = TaskID("t1")


def status(n: int, state: TaskState = TaskState.RUNNING, task: str = "t1") -> TaskStatus:
    return TaskStatus(
        task_id=TaskID(task),
        state=state,
        source=StatusSource.EXECUTOR,
        uuid=n.to_bytes(16, "big"),
    )


def uid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def sent(m: StatusUpdateManager) -> list[StatusUpdateMessage]:
    out = m.take()
    for msg in out:
        assert codec.decode(codec.encode(msg)).message == msg
    return out


def manager(active: bool = True) -> StatusUpdateManager:
    return StatusUpdateManager(1.0, 8.0, active=active)


def test_only_the_head_is_forwarded_with_the_newest_state_as_latest() -> None:
    m = manager()
    assert m.update(F, status(1, TaskState.RUNNING), 0.0)
    first = sent(m)
    assert [x.update.status.uuid for x in first] == [uid(1)]
    assert first[0].update.latest_state is TaskState.RUNNING
    assert first[0].update.framework_id == F
    assert m.update(F, status(2, TaskState.FINISHED), 0.5)
    assert sent(m) == []  # queued behind the head
    assert m.pending(F, T) == (status(1, TaskState.RUNNING), status(2, TaskState.FINISHED))
    # The head's resend carries the newest queued state, so the master can free resources.
    m.tick(1.0)
    resend = sent(m)
    assert [x.update.status.uuid for x in resend] == [uid(1)]
    assert resend[0].update.latest_state is TaskState.FINISHED


def test_ack_of_the_head_forwards_the_next_update_at_once() -> None:
    m = manager()
    m.update(F, status(1), 0.0)
    m.update(F, status(2), 0.0)
    m.update(F, status(3), 0.0)
    sent(m)
    acked = m.acknowledge(F, T, uid(1), 0.2)
    assert acked == status(1)
    assert [x.update.status.uuid for x in sent(m)] == [uid(2)]
    assert m.head(F, T) == status(2)
    assert m.next_retry(F, T) == pytest.approx(1.2)


def test_ack_for_anything_but_the_head_is_ignored() -> None:
    m = manager()
    m.update(F, status(1), 0.0)
    m.update(F, status(2), 0.0)
    sent(m)
    assert m.acknowledge(F, T, uid(2), 0.1) is None  # not the head
    assert m.acknowledge(F, T, uid(99), 0.1) is None  # never seen
    assert m.acknowledge(F, TaskID("other"), uid(1), 0.1) is None  # unknown stream
    assert m.acknowledge(FrameworkID("x"), T, uid(1), 0.1) is None
    assert sent(m) == []
    assert m.pending(F, T) == (status(1), status(2))
    assert m.acknowledge(F, T, uid(1), 0.2) == status(1)
    assert m.acknowledge(F, T, uid(1), 0.3) is None  # a duplicate ack


def test_head_is_retried_with_doubling_backoff_up_to_the_cap() -> None:
    m = manager()
    m.update(F, status(1), 0.0)
    sent(m)
    resend_times = []
    t = 0.0
    while t < 60:
        t = round(t + 0.25, 2)
        m.tick(t)
        if sent(m):
            resend_times.append(t)
    # First resend after 1 s, then 2, 4, 8, 8, 8 ... (capped at 8).
    gaps = [b - a for a, b in zip([0.0, *resend_times], resend_times, strict=False)]
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(g == 8.0 for g in gaps[3:])


def test_a_new_head_starts_from_the_initial_backoff() -> None:
    m = manager()
    m.update(F, status(1), 0.0)
    m.update(F, status(2), 0.0)
    for t in (1.0, 3.0, 7.0):
        m.tick(t)
    sent(m)
    m.acknowledge(F, T, uid(1), 7.5)
    assert [x.update.status.uuid for x in sent(m)] == [uid(2)]
    m.tick(8.4)
    assert sent(m) == []
    m.tick(8.5)
    assert [x.update.status.uuid for x in sent(m)] == [uid(2)]


def test_duplicates_are_ignored_pending_or_already_acknowledged() -> None:
    m = manager()
    assert m.update(F, status(1), 0.0)
    assert not m.update(F, status(1), 0.1)  # same uuid, still pending
    m.acknowledge(F, T, uid(1), 0.2)
    assert not m.update(F, status(1), 0.3)  # same uuid, already acknowledged
    assert m.pending(F, T) == ()
    assert [x.update.status.uuid for x in sent(m)] == [uid(1)]


def test_nothing_follows_a_final_update_and_the_stream_ends_when_it_is_acked() -> None:
    m = manager()
    m.update(F, status(1, TaskState.RUNNING), 0.0)
    assert m.update(F, status(2, TaskState.FAILED), 0.0)
    assert not m.update(F, status(3, TaskState.RUNNING), 0.0)
    assert not m.update(F, status(4, TaskState.FINISHED), 0.0)
    assert len(m.pending(F, T)) == 2
    m.acknowledge(F, T, uid(1), 0.1)
    assert (F, T) in m
    assert m.acknowledge(F, T, uid(2), 0.2) == status(2, TaskState.FAILED)
    assert (F, T) not in m
    assert len(m) == 0


def test_lost_ends_a_stream_like_a_terminal_state() -> None:
    m = manager()
    m.update(F, status(1, TaskState.LOST), 0.0)
    assert not m.update(F, status(2, TaskState.RUNNING), 0.0)
    m.acknowledge(F, T, uid(1), 0.1)
    assert len(m) == 0


def test_streams_are_independent() -> None:
    m = manager()
    m.update(F, status(1, task="a"), 0.0)
    m.update(F, status(2, task="b"), 0.0)
    m.update(F, status(3, task="a"), 0.0)
    assert [x.update.status.uuid for x in sent(m)] == [uid(1), uid(2)]
    assert m.unacknowledged() == 3
    m.acknowledge(F, TaskID("b"), uid(2), 0.1)
    assert sent(m) == []


def test_paused_manager_queues_but_sends_nothing_and_resume_sends_every_head() -> None:
    m = StatusUpdateManager(1.0, 8.0)  # starts paused
    assert not m.active
    m.update(F, status(1, task="a"), 0.0)
    m.update(F, status(2, task="a"), 0.0)
    m.update(F, status(3, task="b"), 0.0)
    m.tick(100.0)
    assert sent(m) == []
    assert m.next_retry(F, TaskID("a")) is None
    m.resume(200.0)
    assert [x.update.status.uuid for x in sent(m)] == [uid(1), uid(3)]
    assert m.next_retry(F, TaskID("a")) == 201.0
    # Pausing mid-backoff: nothing goes out until resumed, then at once with a fresh backoff.
    m.tick(201.0)
    m.tick(203.0)
    sent(m)
    m.pause()
    m.tick(500.0)
    assert sent(m) == []
    m.resume(600.0)
    assert len(sent(m)) == 2
    m.tick(600.9)
    assert sent(m) == []
    m.tick(601.0)
    assert len(sent(m)) == 2


def test_acks_while_paused_advance_the_stream_without_sending() -> None:
    m = manager()
    m.update(F, status(1), 0.0)
    m.update(F, status(2), 0.0)
    sent(m)
    m.pause()
    assert m.acknowledge(F, T, uid(1), 1.0) == status(1)
    assert sent(m) == []
    m.resume(2.0)
    assert [x.update.status.uuid for x in sent(m)] == [uid(2)]


def test_remove_and_remove_framework_drop_streams() -> None:
    m = manager()
    m.update(F, status(1, task="a"), 0.0)
    m.update(F, status(2, task="b"), 0.0)
    m.update(FrameworkID("other"), status(3, task="a"), 0.0)
    sent(m)
    m.remove(F, TaskID("a"))
    assert (F, TaskID("a")) not in m
    m.remove_framework(F)
    assert list(m) == [(FrameworkID("other"), TaskID("a"))]
    m.tick(10.0)
    assert [x.update.framework_id for x in sent(m)] == [FrameworkID("other")]


def test_an_update_without_uuid_is_a_programming_error() -> None:
    m = manager()
    bad = TaskStatus(task_id=T, state=TaskState.RUNNING, source=StatusSource.EXECUTOR)
    with pytest.raises(ValueError):
        m.update(F, bad, 0.0)
    with pytest.raises(ValueError):
        StatusUpdateManager(0.0, 1.0)
    with pytest.raises(ValueError):
        StatusUpdateManager(2.0, 1.0)


# --- property: random interleavings -------------------------------------------------------

_TASKS = ("a", "b", "c")
_FINAL = (TaskState.FINISHED, TaskState.FAILED, TaskState.KILLED, TaskState.LOST)

_step = st.one_of(
    st.tuples(st.just("update"), st.sampled_from(_TASKS), st.booleans()),
    st.tuples(st.just("dup"), st.sampled_from(_TASKS), st.integers(0, 50)),
    st.tuples(st.just("ack_head"), st.sampled_from(_TASKS), st.booleans()),
    st.tuples(st.just("ack_any"), st.sampled_from(_TASKS), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0, 20), st.booleans()),
    st.tuples(st.just("pause"), st.just(""), st.booleans()),
    st.tuples(st.just("resume"), st.just(""), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=80))
def test_master_sees_each_tasks_updates_in_order_one_at_a_time(
    steps: list[tuple[str, object, object]],
) -> None:
    m = StatusUpdateManager(1.0, 8.0, active=True)
    now = 0.0
    serial = 0
    created: dict[str, list[bytes]] = {t: [] for t in _TASKS}  # every update, in order
    accepted: dict[str, list[bytes]] = {t: [] for t in _TASKS}  # those the manager took
    final_queued: dict[str, bool] = dict.fromkeys(_TASKS, False)
    acked: dict[str, list[bytes]] = {t: [] for t in _TASKS}
    seen_by_master: dict[str, list[bytes]] = {t: [] for t in _TASKS}
    last_forwarded: dict[str, bytes | None] = dict.fromkeys(_TASKS)

    def deliver() -> None:
        for msg in m.take():
            task = str(msg.update.status.task_id)
            uuid = msg.update.status.uuid
            assert uuid is not None
            order = accepted[task]
            index = order.index(uuid)
            # Never a later update before every earlier one was acknowledged.
            assert acked[task] == order[:index], (task, acked[task], order, index)
            # latest_state is the newest accepted state.
            assert msg.update.latest_state is not None
            if not seen_by_master[task] or seen_by_master[task][-1] != uuid:
                seen_by_master[task].append(uuid)
            last_forwarded[task] = uuid

    for kind, a, b in steps:
        ended = {t for t in _TASKS if final_queued[t] and (F, TaskID(t)) not in m}
        if kind in ("update", "dup") and a in ended:
            continue  # the stream is over; the agent never feeds a finished task again
        if kind == "update":
            task = str(a)
            serial += 1
            uuid = uid(serial)
            state = _FINAL[serial % len(_FINAL)] if b else TaskState.RUNNING
            created[task].append(uuid)
            took = m.update(F, status(serial, state, task), now)
            assert took == (not final_queued[task])
            if took:
                accepted[task].append(uuid)
                final_queued[task] = final_queued[task] or state in _FINAL
        elif kind == "dup":
            task = str(a)
            if created[task]:
                uuid = created[task][int(str(b)) % len(created[task])]
                n = int.from_bytes(uuid, "big")
                assert not m.update(F, status(n, TaskState.RUNNING, task), now)
        elif kind == "ack_head":
            task = str(a)
            uuid_or_none = last_forwarded[task]
            if uuid_or_none is not None:
                head = m.head(F, TaskID(task))
                got = m.acknowledge(F, TaskID(task), uuid_or_none, now)
                if head is not None and head.uuid == uuid_or_none:
                    assert got == head
                    acked[task].append(uuid_or_none)
                else:
                    assert got is None
        elif kind == "ack_any":
            # Any uuid the master has seen for the task (stale or current), or one it never saw.
            task = str(a)
            known = seen_by_master[task]
            pick = int(str(b))
            uuid = known[pick % len(known)] if known and pick % 4 else uid(10**6 + pick)
            head = m.head(F, TaskID(task))
            got = m.acknowledge(F, TaskID(task), uuid, now)
            if head is not None and head.uuid == uuid:
                acked[task].append(uuid)
            else:
                assert got is None
        elif kind == "tick":
            now += float(str(a))
            m.tick(now)
        elif kind == "pause":
            m.pause()
        else:
            m.resume(now)
        deliver()
        # The manager's view matches the model: pending = accepted minus acked, in order.
        for task in _TASKS:
            done = len(acked[task])
            assert accepted[task][:done] == acked[task]
            pend = tuple(s.uuid for s in m.pending(F, TaskID(task)))
            assert pend == tuple(accepted[task][done:])
    # Flush: resume and ack heads until every stream is drained; all arrive, in order.
    m.resume(now)
    deliver()
    for _ in range(200):
        progressed = False
        for task in _TASKS:
            head = m.head(F, TaskID(task))
            if head is not None and head.uuid is not None and last_forwarded[task] == head.uuid:
                m.acknowledge(F, TaskID(task), head.uuid, now)
                acked[task].append(head.uuid)
                progressed = True
        deliver()
        if not progressed:
            break
    for task in _TASKS:
        assert seen_by_master[task] == accepted[task]
        assert acked[task] == accepted[task]
        if final_queued[task]:
            assert (F, TaskID(task)) not in m
