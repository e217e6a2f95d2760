"""Group commit in the batch service: every change of one flush (task and job records, fair-share
usage) is one SQLite transaction, so one fsync; and nothing is launched or acknowledged before
the store holds it."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.records import JobState, TaskRecord, TaskState
from agora.frameworks.batch.service import BatchService
from agora.frameworks.batch.spec import ArraySpec, JobSpec
from agora.frameworks.batch.store import JobStore, StoreError
from agora.sdk.ids import AgentID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import Offer, StatusSource, TaskStatus
from agora.sdk.messages import TaskState as S
from agora.sdk.resources import Resources

SPEC = JobSpec(name="arr", user="alice", command="true", mem=8.0, array=ArraySpec(((0, 3, 1),)))


def count_commits(store: JobStore) -> list[str]:
    """The COMMITs the store's connection runs from now on (each one an fsync of the WAL)."""
    commits: list[str] = []
    store._conn.set_trace_callback(  # the only place a commit can be seen
        lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None
    )
    return commits


def on_disk(path: Path) -> sqlite3.Connection:
    """Another reader of the file: it sees only committed transactions."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def test_records_and_usage_are_one_commit_and_all_recovered_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    store = JobStore.open(path)
    job, tasks = store.add_job(SPEC, 1.0)
    commits = count_commits(store)
    ended = [TaskRecord(job.job_id, t.index, TaskState.COMPLETED, end_time=5.0) for t in tasks]
    job.state, job.end_time = JobState.COMPLETED, 5.0
    store.save([job], ended, {"alice": (3.5, 5.0), "bob": (1.0, 4.0)})
    assert len(commits) == 1
    store.close()
    store = JobStore.open(path)
    try:
        assert store.tasks_of(job.job_id) == ended
        assert store.job(job.job_id) == job
        assert store.load_usage() == {"alice": (3.5, 5.0), "bob": (1.0, 4.0)}
    finally:
        store.close()


def test_a_usage_row_that_cannot_be_stored_rolls_back_the_records_of_its_group(
    tmp_path: Path,
) -> None:
    store = JobStore.open(tmp_path / "jobs.sqlite")
    try:
        job, tasks = store.add_job(SPEC, 1.0)
        ended = [TaskRecord(job.job_id, t.index, TaskState.COMPLETED, end_time=5.0) for t in tasks]
        unstorable: Any = object()
        with pytest.raises(StoreError):
            store.save([], ended, {unstorable: (1.0, 5.0)})
        assert store.tasks_of(job.job_id) == tasks  # all of the group or none of it
        assert store.load_usage() == {}
    finally:
        store.close()


class RecordingDriver:
    """Checks, at each call the service makes, what another reader finds in the store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[str, Any]] = []

    def _stored(self) -> tuple[dict[int, str], dict[str, float]]:
        conn = on_disk(self.path)
        try:
            tasks = dict(conn.execute("SELECT idx, state FROM tasks").fetchall())
            usage = dict(conn.execute("SELECT user, usage FROM usage").fetchall())
        finally:
            conn.close()
        return tasks, usage

    def accept(self, offer_ids: list[OfferID], operations: list[Any], filters: Any) -> None:
        self.seen.append(("accept", self._stored()))

    def acknowledge(self, status: TaskStatus) -> None:
        self.seen.append(("ack", (status.state, self._stored())))

    def revive(self) -> None:
        pass

    def suppress(self) -> None:
        pass


def test_a_flush_is_one_commit_and_acts_only_on_what_is_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"

    async def main() -> None:
        store = JobStore.open(path)
        clock = iter(float(t) for t in range(100, 10_000))
        service = BatchService(BatchCore(CoreConfig()), store, clock=lambda: next(clock))
        driver = RecordingDriver(path)
        service.driver = driver
        try:
            service.submit(SPEC)
            service.flush()
            offer = Offer(
                offer_id=OfferID("o1"),
                framework_id=FrameworkID("fw"),
                agent_id=AgentID("a1"),
                hostname="host-a1",
                role="*",
                resources=Resources.parse("cpus:8;mem:1024"),
            )
            commits = count_commits(store)
            service.offers(None, [offer])
            service.flush()
            assert len(commits) == 1
            kind, (tasks, _) = driver.seen[-1]
            assert kind == "accept" and set(tasks.values()) == {"STARTING"}
            task_ids = [t for t in service.core.active]
            for state in (S.RUNNING, S.FINISHED):
                calls = len(driver.seen)
                for n, task_id in enumerate(task_ids):
                    service.status_update(None, TaskStatus(
                        task_id=TaskID(task_id), state=state, source=StatusSource.EXECUTOR,
                        agent_id=AgentID("a1"), uuid=bytes([n]) * 16,
                        exit_code=0 if state is S.FINISHED else None,
                    ))  # fmt: skip
                assert len(driver.seen) == calls  # nothing acknowledged before the commit
                del commits[:]
                service.flush()
                # Four updates, records of four tasks, the job and the user's usage: one commit.
                assert len(commits) == 1
            acks = [detail for kind, detail in driver.seen if kind == "ack"]
            assert len(acks) == 2 * len(task_ids)
            # Every acknowledgement went out with its update's outcome already on disk.
            for state, (stored, _) in acks[: len(task_ids)]:
                assert state is S.RUNNING and set(stored.values()) == {"RUNNING"}
            for state, (stored, usage) in acks[len(task_ids) :]:
                assert state is S.FINISHED and set(stored.values()) == {"COMPLETED"}
                assert usage["alice"] > 0
        finally:
            store.close()

    asyncio.run(asyncio.wait_for(main(), 20))
