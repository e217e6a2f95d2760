"""JobStore: what the batch service finds in its job store, across restarts and failed writes."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.frameworks.batch.records import JobRecord, JobState, TaskRecord, TaskState
from agora.frameworks.batch.spec import (
    ArraySpec,
    Constraint,
    Dependency,
    DepKind,
    JobSpec,
)
from agora.frameworks.batch.store import SCHEMA_VERSION, JobStore, StoreError


def plain(name: str = "job", user: str = "alice", ntasks: int = 1) -> JobSpec:
    return JobSpec(name=name, user=user, command="true", ntasks=ntasks)


def array(n: int, user: str = "alice") -> JobSpec:
    return JobSpec(name="arr", user=user, command="true", array=ArraySpec(((0, n - 1, 1),)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path / "state" / "jobs.db")
    yield s
    s.close()


def reopened(tmp_path: Path) -> JobStore:
    return JobStore.open(tmp_path / "state" / "jobs.db")


def end(task: TaskRecord, state: TaskState, at: float, exit_code: int = 0) -> TaskRecord:
    return dataclasses.replace(task, state=state, end_time=at, exit_code=exit_code)


def finish(job: JobRecord, state: JobState, at: float) -> JobRecord:
    return dataclasses.replace(job, state=state, end_time=at, exit_code=0)


def test_every_field_of_both_records_round_trips_through_a_reopen(tmp_path: Path) -> None:
    spec = JobSpec(
        name="full",
        user="bob",
        script="#!/bin/sh\necho $1\n",
        script_args=("a b", "c"),
        cpus=2.5,
        mem=300.0,
        disk=10.0,
        gpus=1,
        array=ArraySpec(((0, 8, 2), (20, 21, 1)), max_running=2),
        dependencies=(Dependency(DepKind.AFTEROK, 7), Dependency(DepKind.AFTERNOTOK, 9)),
        priority=-5,
        queue="gpu",
        time_limit=90.5,
        retries=3,
        environment={"A": "1", "B": "two words"},
        workdir="/srv/work",
        constraints=(Constraint("rack", "r1"), Constraint("os", "bsd", negate=True)),
    )
    store = JobStore.open(tmp_path / "state" / "jobs.db")
    job, tasks = store.add_job(spec, 1000.25)
    assert [t.index for t in tasks] == [0, 2, 4, 6, 8, 20, 21]
    job = dataclasses.replace(
        job,
        state=JobState.FAILED,
        reason="task 2 failed",
        start_time=1001.5,
        end_time=1010.75,
        exit_code=3,
        cancelled=True,
    )
    task = TaskRecord(
        job_id=job.job_id,
        index=2,
        state=TaskState.FAILED,
        attempt=4,
        failures=3,
        losses=1,
        task_id="batch-1.2-4",
        agent_id="agent-7",
        hostname="node7",
        submit_time=1000.25,
        start_time=1002.0,
        end_time=1010.75,
        exit_code=3,
        reason="exited 3",
        cpu_seconds=1.25,
        max_rss_bytes=123_456_789_012,
        not_before=1003.5,
        kill_reason="preempt:12:3",
        preemptions=2,
    )
    store.save([job], [task])
    store.close()

    store = reopened(tmp_path)
    try:
        assert store.job(job.job_id) == job
        assert store.task(job.job_id, 2) == task
        assert store.tasks_of(job.job_id)[1] == task
    finally:
        store.close()


def test_add_job_returns_the_records_as_stored(store: JobStore) -> None:
    job, tasks = store.add_job(array(5), 50.0)
    assert job == JobRecord(job.job_id, array(5), 50.0, run_as="alice")
    assert store.job(job.job_id) == job
    assert tasks == [TaskRecord(job.job_id, i, submit_time=50.0) for i in range(5)]
    assert store.tasks_of(job.job_id) == tasks
    gang, ranks = store.add_job(plain(ntasks=3), 51.0)
    assert [r.index for r in ranks] == [0, 1, 2]
    assert store.tasks_of(gang.job_id) == ranks


def test_a_100k_array_is_stored_whole(store: JobStore) -> None:
    job, tasks = store.add_job(array(100_000), 1.0)
    assert len(tasks) == 100_000
    counts = store.jobs(include_ended_since=None, user=None, limit=10)[0][1]
    assert counts["total"] == counts["PENDING"] == 100_000
    assert store.task(job.job_id, 99_999) == TaskRecord(job.job_id, 99_999, submit_time=1.0)


def test_job_ids_grow_and_are_never_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / "jobs.db"
    store = JobStore.open(path)
    ids = [store.add_job(plain(), 1.0)[0].job_id for _ in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    store.close()
    # Remove the newest job behind the store's back (as a future purge would).
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM jobs WHERE job_id = ?", (ids[-1],))
    raw.close()
    store = JobStore.open(path)
    try:
        assert store.job(ids[-1]) is None
        assert store.tasks_of(ids[-1]) == []
        assert store.add_job(plain(), 2.0)[0].job_id > ids[-1]
    finally:
        store.close()


def test_save_upserts_and_never_rewrites_a_spec(store: JobStore) -> None:
    job, tasks = store.add_job(array(3), 1.0)
    running = dataclasses.replace(tasks[1], state=TaskState.RUNNING, attempt=1, agent_id="a")
    store.save([dataclasses.replace(job, state=JobState.RUNNING, start_time=2.0)], [running])
    assert store.task(job.job_id, 1) == running
    assert store.task(job.job_id, 0) == tasks[0]
    assert store.job(job.job_id) == dataclasses.replace(job, state=JobState.RUNNING, start_time=2.0)
    # A record with a different spec changes the job's state columns, never its spec.
    other = dataclasses.replace(job, spec=plain(name="renamed"), state=JobState.COMPLETED)
    store.save([other], [])
    stored = store.job(job.job_id)
    assert stored is not None
    assert stored.state is JobState.COMPLETED and stored.spec == array(3)
    # A task row not there before is inserted.
    extra = TaskRecord(job.job_id, 77, state=TaskState.PENDING, submit_time=9.0)
    store.save([], [extra])
    assert store.task(job.job_id, 77) == extra


def test_save_of_nothing_does_not_touch_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = JobStore.open(path)
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")  # another writer holds the lock: any write would wait 5 s
    try:
        empty: list[TaskRecord] = []
        store.save([], [])
        store.save(iter(()), (t for t in empty))
    finally:
        raw.execute("ROLLBACK")
        raw.close()
        store.close()


def test_a_failure_in_the_middle_of_save_writes_nothing(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "state" / "jobs.db")
    job, tasks = store.add_job(array(1000), 1.0)
    changed_job = dataclasses.replace(job, state=JobState.RUNNING, start_time=5.0)
    changed = [dataclasses.replace(t, state=TaskState.RUNNING, attempt=1) for t in tasks]

    def records_then_crash() -> Iterator[TaskRecord]:
        yield from changed[:600]
        raise RuntimeError("crash while serialising")

    with pytest.raises(RuntimeError, match="crash while serialising"):
        store.save([changed_job], records_then_crash())
    # A value SQLite cannot store, after 700 good rows: the whole save is refused.
    unstorable = dataclasses.replace(changed[700], exit_code=object())  # type: ignore[arg-type]
    bad = [*changed[:700], unstorable]
    with pytest.raises(StoreError):
        store.save([changed_job], bad)
    assert store.job(job.job_id) == job
    assert store.tasks_of(job.job_id) == tasks
    # The store still works after a rolled-back save.
    store.save([], changed[:1])
    store.close()
    store = reopened(tmp_path)
    try:
        assert store.job(job.job_id) == job
        assert store.tasks_of(job.job_id) == changed[:1] + tasks[1:]
    finally:
        store.close()


def test_a_task_of_an_unknown_job_is_refused(store: JobStore) -> None:
    with pytest.raises(StoreError):
        store.save([], [TaskRecord(job_id=999, index=0)])


def test_load_active_has_unended_jobs_with_all_their_tasks(store: JobStore) -> None:
    ended, ended_tasks = store.add_job(array(2), 1.0)
    running, running_tasks = store.add_job(array(3), 2.0)
    pending, pending_tasks = store.add_job(plain(), 3.0)
    running = dataclasses.replace(running, state=JobState.RUNNING)
    done = end(running_tasks[0], TaskState.COMPLETED, 4.0)
    store.save(
        [finish(ended, JobState.COMPLETED, 5.0), running],
        [end(t, TaskState.COMPLETED, 5.0) for t in ended_tasks] + [done],
    )
    jobs, tasks = store.load_active()
    assert jobs == [running, pending]
    assert tasks == [done, *running_tasks[1:], *pending_tasks]
    assert store.load_job_states() == {
        ended.job_id: JobState.COMPLETED,
        running.job_id: JobState.RUNNING,
        pending.job_id: JobState.PENDING,
    }


def test_jobs_lists_newest_first_with_task_counts(store: JobStore) -> None:
    old, old_tasks = store.add_job(array(2), 1.0)
    recent, recent_tasks = store.add_job(array(3, user="bob"), 2.0)
    live, live_tasks = store.add_job(array(4), 3.0)
    store.save(
        [finish(old, JobState.COMPLETED, 100.0), finish(recent, JobState.FAILED, 200.0)],
        [end(t, TaskState.COMPLETED, 100.0) for t in old_tasks]
        + [end(recent_tasks[0], TaskState.FAILED, 200.0, exit_code=2)]
        + [end(t, TaskState.CANCELLED, 200.0) for t in recent_tasks[1:]]
        + [dataclasses.replace(live_tasks[0], state=TaskState.RUNNING)],
    )
    listed = store.jobs(include_ended_since=None, user=None, limit=0)
    assert [j.job_id for j, _ in listed] == [live.job_id, recent.job_id, old.job_id]
    counts = {j.job_id: c for j, c in listed}
    zero = {s.value: 0 for s in TaskState}
    assert counts[live.job_id] == {**zero, "PENDING": 3, "RUNNING": 1, "total": 4}
    assert counts[recent.job_id] == {**zero, "FAILED": 1, "CANCELLED": 2, "total": 3}
    assert counts[old.job_id] == {**zero, "COMPLETED": 2, "total": 2}

    since = store.jobs(include_ended_since=150.0, user=None, limit=10)
    assert [j.job_id for j, _ in since] == [live.job_id, recent.job_id]
    assert [j.job_id for j, _ in store.jobs(include_ended_since=None, user="bob", limit=10)] == [
        recent.job_id
    ]
    assert [j.job_id for j, _ in store.jobs(include_ended_since=250.0, user="alice", limit=9)] == [
        live.job_id
    ]
    assert [j.job_id for j, _ in store.jobs(include_ended_since=None, user=None, limit=2)] == [
        live.job_id,
        recent.job_id,
    ]


def test_history_lists_ended_tasks_by_end_time_with_their_job(store: JobStore) -> None:
    a, a_tasks = store.add_job(array(3), 1.0)
    b, b_tasks = store.add_job(JobSpec(name="bee", user="bob", command="x", queue="gpu"), 1.0)
    store.save(
        [],
        [
            end(a_tasks[2], TaskState.COMPLETED, 10.0),
            end(b_tasks[0], TaskState.TIMEOUT, 10.0, exit_code=137),
            end(a_tasks[0], TaskState.FAILED, 5.0, exit_code=1),
            # Running with an end time from an earlier attempt: not ended, not in history.
            dataclasses.replace(a_tasks[1], state=TaskState.RUNNING, end_time=3.0),
        ],
    )
    records = store.history(user=None, since=None, job_id=None, limit=100)
    assert [(r["job_id"], r["index"]) for r in records] == [
        (a.job_id, 0),
        (a.job_id, 2),
        (b.job_id, 0),
    ]
    first = store.task(a.job_id, 0)
    assert first is not None
    assert records[0] == {**first.to_json(), "name": "arr", "user": "alice", "queue": "default"}
    assert records[2]["state"] == "TIMEOUT" and records[2]["queue"] == "gpu"

    def keys(**kw: object) -> list[tuple[int, int]]:
        args: dict[str, object] = {"user": None, "since": None, "job_id": None, "limit": 100}
        return [(r["job_id"], r["index"]) for r in store.history(**{**args, **kw})]  # type: ignore[arg-type]

    assert keys(user="bob") == [(b.job_id, 0)]
    assert keys(since=10.0) == [(a.job_id, 2), (b.job_id, 0)]
    assert keys(job_id=a.job_id) == [(a.job_id, 0), (a.job_id, 2)]
    assert keys(limit=1) == [(a.job_id, 0)]


def test_meta_and_usage_survive_a_reopen(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "state" / "jobs.db")
    assert store.get_meta("framework_id") is None
    assert store.load_usage() == {}
    store.set_meta("framework_id", "fw-1")
    store.set_meta("framework_id", "fw-2")
    store.save_usage({"alice": (12.5, 100.0), "bob": (0.25, 101.0)})
    store.save_usage({"alice": (13.5, 102.0), "carol": (1.0, 102.0)})
    store.close()
    store = reopened(tmp_path)
    try:
        assert store.get_meta("framework_id") == "fw-2"
        # Each save carries only the users whose usage changed; bob's stays as it was.
        assert store.load_usage() == {
            "alice": (13.5, 102.0),
            "bob": (0.25, 101.0),
            "carol": (1.0, 102.0),
        }
    finally:
        store.close()


def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "state" / "jobs.db")
    job, tasks = store.add_job(array(4), 1.0)
    done, _ = store.add_job(plain(), 2.0)
    tasks[3] = dataclasses.replace(tasks[3], state=TaskState.STARTING, attempt=1, task_id="t")
    store.save([finish(done, JobState.COMPLETED, 3.0)], [tasks[3]])
    before = (
        store.load_active(),
        store.load_job_states(),
        store.jobs(include_ended_since=None, user=None, limit=0),
    )
    store.close()
    store = reopened(tmp_path)
    try:
        after = (
            store.load_active(),
            store.load_job_states(),
            store.jobs(include_ended_since=None, user=None, limit=0),
        )
        assert after == before
        assert after[0] == ([job], tasks)
        assert store.add_job(plain(), 4.0)[0].job_id > done.job_id
    finally:
        store.close()


def test_a_version_2_store_is_upgraded_and_its_tasks_count_no_preemption(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    store = JobStore.open(path)
    job, _ = store.add_job(array(2), 1.0)
    store.close()
    raw = sqlite3.connect(path)  # make it what version 2 wrote: no preemptions column
    raw.execute("ALTER TABLE tasks DROP COLUMN preemptions")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    store = JobStore.open(path)
    try:
        assert [t.preemptions for t in store.tasks_of(job.job_id)] == [0, 0]
        preempted = dataclasses.replace(store.tasks_of(job.job_id)[1], preemptions=1)
        store.save([], [preempted])
        _, tasks = store.load_active()
        assert [t.preemptions for t in tasks] == [0, 1]
        new, new_tasks = store.add_job(plain(), 2.0)
        assert store.tasks_of(new.job_id) == new_tasks
    finally:
        store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    raw.close()


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    JobStore.open(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError, match="newer"):
        JobStore.open(path)


def test_a_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a database\n" * 400)
    with pytest.raises(StoreError, match="unusable"):
        JobStore.open(path)


def test_some_other_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE jobs (x)")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="not an Agora job store"):
        JobStore.open(path)


def test_a_path_that_cannot_be_made_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError):
        JobStore.open(tmp_path / "file" / "jobs.db")


def test_a_closed_store_raises_store_error(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "jobs.db")
    store.close()
    with pytest.raises(StoreError):
        store.get_meta("x")
