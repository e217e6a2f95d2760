"""The batch service's durable job store: one SQLite file (WAL, ``synchronous=FULL``).

Every call is synchronous and short, made from the service's asyncio loop. A write returns
only once it is on disk; a write of many rows (a job's tasks, a group commit of dirty
records) is one transaction, so a crash leaves all of it or none of it. Any SQLite failure
(an unreadable file, a full disk, a row that cannot be written) is a :class:`StoreError`.

Tables: ``meta`` (small settings such as the framework id), ``jobs`` (the spec as JSON text
plus its state; name, user and queue copied out of the spec for filtering), ``tasks`` (one
row per array index or gang rank, keyed by ``(job_id, idx)``) and ``usage`` (fair-share usage
per user). ``PRAGMA user_version`` holds the schema version. Version 2 added the jobs' ``run_as``,
``submitter`` and ``submit_uid``; version 3 the tasks' ``preemptions``. An older file is upgraded
in place when opened (a version 1 file's jobs keep running as the service's own user, as they
did; its tasks count no preemption).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any, Final

import structlog
from agora.frameworks.batch.records import JobRecord, JobState, TaskRecord, TaskState
from agora.frameworks.batch.spec import JobSpec

__all__ = ["SCHEMA_VERSION", "JobStore", "StoreError"]

log = structlog.get_logger(__name__)

#: The schema this code writes; a file with a higher ``user_version`` is refused.
SCHEMA_VERSION: Final = 3

_SCHEMA: Final = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    """CREATE TABLE jobs (
        job_id INTEGER PRIMARY KEY AUTOINCREMENT,
        spec TEXT NOT NULL,
        name TEXT NOT NULL,
        user TEXT NOT NULL,
        queue TEXT NOT NULL,
        submit_time REAL NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL,
        start_time REAL,
        end_time REAL,
        exit_code INTEGER,
        cancelled INTEGER NOT NULL,
        run_as TEXT NOT NULL DEFAULT '',
        submitter TEXT NOT NULL DEFAULT '',
        submit_uid INTEGER)""",
    "CREATE INDEX jobs_state ON jobs (state)",
    "CREATE INDEX jobs_end_time ON jobs (end_time) WHERE end_time IS NOT NULL",
    """CREATE TABLE tasks (
        job_id INTEGER NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        state TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        losses INTEGER NOT NULL,
        task_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        hostname TEXT NOT NULL,
        submit_time REAL NOT NULL,
        start_time REAL,
        end_time REAL,
        exit_code INTEGER,
        reason TEXT NOT NULL,
        cpu_seconds REAL,
        max_rss_bytes INTEGER,
        not_before REAL NOT NULL,
        kill_reason TEXT NOT NULL,
        preemptions INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, idx)) WITHOUT ROWID""",
    "CREATE INDEX tasks_end_time ON tasks (end_time) WHERE end_time IS NOT NULL",
    "CREATE INDEX tasks_job_state ON tasks (job_id, state)",
    "CREATE TABLE usage (user TEXT PRIMARY KEY, usage REAL NOT NULL, as_of REAL NOT NULL)",
)
#: From each older version to the next, in order (index: the version upgraded from, minus 1).
_UPGRADES: Final = (
    (
        "ALTER TABLE jobs ADD COLUMN run_as TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN submit_uid INTEGER",
    ),
    ("ALTER TABLE tasks ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0",),
)

# A task row's columns are the TaskRecord's fields in order ("index" is "idx" in SQL): a row
# read back is TaskRecord(*row), and a record written is _task_row(record).
_TASK_FIELDS: Final = tuple(f.name for f in dataclasses.fields(TaskRecord))
_TASK_COLUMNS: Final = ", ".join("idx" if f == "index" else f for f in _TASK_FIELDS)
_task_row: Final = attrgetter(*_TASK_FIELDS)  # TaskState is a str: SQLite stores its value
_JOB_COLUMNS: Final = (
    "job_id, spec, submit_time, state, reason, start_time, end_time, exit_code, cancelled, "
    "run_as, submitter, submit_uid"
)
_JOB_STATE_COLUMNS: Final = ("state", "reason", "start_time", "end_time", "exit_code", "cancelled")

_INSERT_TASK: Final = (
    f"INSERT INTO tasks ({_TASK_COLUMNS}) VALUES ({', '.join('?' * len(_TASK_FIELDS))}) "
    "ON CONFLICT (job_id, idx) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _TASK_COLUMNS.split(", ")[2:])
)
# Every index of a new job, from a JSON list: one statement, the rows made inside SQLite.
_NEW_TASKS: Final = (
    f"INSERT INTO tasks ({_TASK_COLUMNS}) SELECT ?, value, "
    + ", ".join("?" * (len(_TASK_FIELDS) - 2))
    + " FROM json_each(?)"
)
_UPSERT_JOB: Final = (
    "INSERT INTO jobs (job_id, spec, name, user, queue, submit_time, state, reason, start_time, "
    "end_time, exit_code, cancelled, run_as, submitter, submit_uid) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _JOB_STATE_COLUMNS)
)
_UPSERT_USAGE: Final = (
    "INSERT INTO usage (user, usage, as_of) VALUES (?, ?, ?) "
    "ON CONFLICT(user) DO UPDATE SET usage = excluded.usage, as_of = excluded.as_of"
)

_TASK_STATES: Final = {s.value: s for s in TaskState}  # faster than TaskState(value)
_ACTIVE_JOB_STATES: Final = tuple(s.value for s in JobState if not s.terminal)
_ENDED_TASK_STATES: Final = tuple(s.value for s in TaskState if s.terminal)


def _sql_list(values: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


_JOB_ACTIVE_SQL: Final = f"state IN {_sql_list(_ACTIVE_JOB_STATES)}"
_TASK_ENDED_SQL: Final = f"t.state IN {_sql_list(_ENDED_TASK_STATES)} AND t.end_time IS NOT NULL"


class StoreError(Exception):
    """The job store cannot be opened, read or written; the message says why."""


class JobStore:
    """The durable state of the batch service. Open with :meth:`open`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, path: Path) -> JobStore:
        """The store in ``path``, made (with its parent directories) if missing."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the job store {path}: {exc}") from exc
        try:
            _prepare(conn, path)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"the job store {path} is unusable: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        log.info("batch_store_opened", path=str(path), schema=SCHEMA_VERSION)
        return cls(conn, path)

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------ meta

    def get_meta(self, key: str) -> str | None:
        with self._errors():
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._write():
            self._conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # ------------------------------------------------------------------ writes

    def add_job(
        self,
        spec: JobSpec,
        submit_time: float,
        *,
        submitter: str = "",
        submit_uid: int | None = None,
    ) -> tuple[JobRecord, list[TaskRecord]]:
        """A new job (a fresh id, never one used before) that runs as its spec's user, and a
        PENDING task per index."""
        indices = spec.task_indices()
        new = JobRecord(
            0, spec, submit_time, run_as=spec.user, submitter=submitter, submit_uid=submit_uid
        )
        with self._write():
            row = _job_row(new)
            cursor = self._conn.execute(_UPSERT_JOB, (None, *row[1:]))  # None: a new id
            job_id = cursor.lastrowid
            if job_id is None:  # pragma: no cover - an INSERT always sets it
                raise StoreError("the job store gave the new job no id")
            # One statement makes every row in SQLite (json_each), from a template record so
            # the rows are exactly the records returned.
            template = _task_row(TaskRecord(job_id, 0, submit_time=submit_time))
            self._conn.execute(_NEW_TASKS, (job_id, *template[2:], json.dumps(indices)))
        tasks = [TaskRecord(job_id, i, submit_time=submit_time) for i in indices]
        log.debug("batch_job_stored", job_id=job_id, tasks=len(tasks))
        new.job_id = job_id
        return new, tasks

    def save(
        self,
        jobs: Iterable[JobRecord],
        tasks: Iterable[TaskRecord],
        usage: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        """Upsert every record, and the fair-share ``usage`` of the users in it (see
        :meth:`save_usage`), in one transaction: one commit, one fsync, for a whole group of
        changes (a job's spec is never rewritten)."""
        job_list = list(jobs)
        task_iter = iter(tasks)
        first = next(task_iter, None)
        usage_rows = _usage_rows(usage) if usage else []
        if not job_list and first is None and not usage_rows:
            return
        task_rows = map(_task_row, task_iter if first is None else chain((first,), task_iter))
        with self._write():
            if job_list:
                self._conn.executemany(_UPSERT_JOB, map(_job_row, job_list))
            if first is not None:
                self._conn.executemany(_INSERT_TASK, task_rows)
            if usage_rows:
                self._conn.executemany(_UPSERT_USAGE, usage_rows)

    # ------------------------------------------------------------------ reads

    def load_active(self) -> tuple[list[JobRecord], list[TaskRecord]]:
        """Jobs not ended, with all their tasks (by job, then index)."""
        with self._read():
            jobs = self._conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {_JOB_ACTIVE_SQL} ORDER BY job_id"
            ).fetchall()
            tasks = self._conn.execute(
                f"SELECT {_task_columns('t')} FROM tasks t WHERE t.job_id IN "
                f"(SELECT job_id FROM jobs WHERE {_JOB_ACTIVE_SQL}) ORDER BY t.job_id, t.idx"
            ).fetchall()
        return [_job_from_row(r) for r in jobs], [_task_from_row(r) for r in tasks]

    def load_job_states(self) -> dict[int, JobState]:
        with self._errors():
            rows = self._conn.execute("SELECT job_id, state FROM jobs").fetchall()
        return {int(job_id): JobState(state) for job_id, state in rows}

    def job(self, job_id: int) -> JobRecord | None:
        with self._errors():
            row = self._conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
        return None if row is None else _job_from_row(row)

    def task_counts(self, job_id: int) -> dict[str, int]:
        """The job's tasks by state (every TaskState value, 0s kept) and "total"."""
        with self._read():
            rows = self._conn.execute(
                "SELECT state, COUNT(*) FROM tasks WHERE job_id = ? GROUP BY state", (job_id,)
            ).fetchall()
        counts = _zero_counts()
        for state, n in rows:
            counts[state] = n
            counts["total"] += n
        return counts

    def tasks_of(self, job_id: int) -> list[TaskRecord]:
        with self._errors():
            rows = self._conn.execute(
                f"SELECT {_TASK_COLUMNS} FROM tasks WHERE job_id = ? ORDER BY idx", (job_id,)
            ).fetchall()
        return [_task_from_row(r) for r in rows]

    def task(self, job_id: int, index: int) -> TaskRecord | None:
        with self._errors():
            row = self._conn.execute(
                f"SELECT {_TASK_COLUMNS} FROM tasks WHERE job_id = ? AND idx = ?", (job_id, index)
            ).fetchone()
        return None if row is None else _task_from_row(row)

    def jobs(
        self, *, include_ended_since: float | None, user: str | None, limit: int
    ) -> list[tuple[JobRecord, dict[str, int]]]:
        """Newest first: jobs not ended, and ended ones (all of them when
        ``include_ended_since`` is None, else those that ended at or after it); each with its
        task counts by state (every TaskState value, 0s kept) and "total". ``limit`` <= 0:
        no limit."""
        where: list[str] = []
        params: list[Any] = []
        if include_ended_since is not None:
            where.append(f"({_JOB_ACTIVE_SQL} OR end_time >= ?)")
            params.append(include_ended_since)
        if user is not None:
            where.append("user = ?")
            params.append(user)
        selected = (
            "SELECT job_id FROM jobs"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY job_id DESC LIMIT ?"
        )
        params.append(limit if limit > 0 else -1)
        with self._read():
            rows = self._conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id IN ({selected}) "
                "ORDER BY job_id DESC",
                params,
            ).fetchall()
            counted = self._conn.execute(
                f"SELECT job_id, state, COUNT(*) FROM tasks WHERE job_id IN ({selected}) "
                "GROUP BY job_id, state",
                params,
            ).fetchall()
        counts: dict[int, dict[str, int]] = {}
        for job_id, state, n in counted:
            by_state = counts.setdefault(job_id, _zero_counts())
            by_state[state] = n
            by_state["total"] += n
        return [(_job_from_row(r), counts.get(r[0]) or _zero_counts()) for r in rows]

    def history(
        self, *, user: str | None, since: float | None, job_id: int | None, limit: int
    ) -> list[dict[str, Any]]:
        """Ended tasks, by end time (then job, index), each TaskRecord.to_json() plus its job's
        "name", "user" and "queue"; the first ``limit`` of them (<= 0: no limit)."""
        where = [_TASK_ENDED_SQL]
        params: list[Any] = []
        if user is not None:
            where.append("j.user = ?")
            params.append(user)
        if since is not None:
            where.append("t.end_time >= ?")
            params.append(since)
        if job_id is not None:
            where.append("t.job_id = ?")
            params.append(job_id)
        params.append(limit if limit > 0 else -1)
        with self._errors():
            rows = self._conn.execute(
                f"SELECT {_task_columns('t')}, j.name, j.user, j.queue "
                "FROM tasks t JOIN jobs j ON j.job_id = t.job_id "
                f"WHERE {' AND '.join(where)} ORDER BY t.end_time, t.job_id, t.idx LIMIT ?",
                params,
            ).fetchall()
        records = []
        for row in rows:
            record = _task_from_row(row[:-3]).to_json()
            record["name"], record["user"], record["queue"] = row[-3:]
            records.append(record)
        return records

    # ------------------------------------------------------------------ fair-share usage

    def load_usage(self) -> dict[str, tuple[float, float]]:
        with self._errors():
            rows = self._conn.execute("SELECT user, usage, as_of FROM usage").fetchall()
        return {str(user): (float(usage), float(as_of)) for user, usage, as_of in rows}

    def save_usage(self, usage: Mapping[str, tuple[float, float]]) -> None:
        """Store the usage of the users in ``usage``; the others' stays as it was."""
        rows = _usage_rows(usage)
        if not rows:
            return
        with self._write():
            self._conn.executemany(_UPSERT_USAGE, rows)

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"job store {self._path}: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction: committed (and on disk) at the end, rolled back if anything
        in it raises."""
        with self._errors():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._conn.rollback()
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[None]:
        """Several reads that see one snapshot."""
        with self._errors():
            self._conn.execute("BEGIN")
            try:
                yield
            finally:
                self._conn.rollback()


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    """Set the connection up and make or check the schema."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]  # reads the header
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the job store {path} has schema version {version}, newer than this Agora's "
            f"({SCHEMA_VERSION}): it was written by a newer version; upgrade Agora to use it"
        )
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"the job store {path} cannot use a write-ahead log (mode {mode})")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_size_limit = 67108864")
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if version == 0:
            if conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
                raise StoreError(f"{path} is an SQLite file but not an Agora job store")
            for statement in _SCHEMA:
                conn.execute(statement)
        else:
            for upgrade in _UPGRADES[version - 1 :]:
                for statement in upgrade:
                    conn.execute(statement)
            log.info("batch_store_upgraded", path=str(path), old=version, new=SCHEMA_VERSION)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.rollback()
        raise
    conn.execute("COMMIT")


def _task_columns(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in _TASK_COLUMNS.split(", "))


def _usage_rows(usage: Mapping[str, tuple[float, float]]) -> list[tuple[str, float, float]]:
    return [(user, float(u), float(as_of)) for user, (u, as_of) in usage.items()]


def _zero_counts() -> dict[str, int]:
    counts = {state.value: 0 for state in TaskState}
    counts["total"] = 0
    return counts


def _task_from_row(row: tuple[Any, ...]) -> TaskRecord:
    job_id, index, state, *rest = row
    try:
        task_state = _TASK_STATES[state]
    except KeyError:
        raise StoreError(f"task {job_id}.{index}: unknown stored state {state!r}") from None
    return TaskRecord(job_id, index, task_state, *rest)


def _job_row(j: JobRecord) -> tuple[Any, ...]:
    spec = j.spec
    return (
        j.job_id,
        json.dumps(spec.to_json(), separators=(",", ":")),
        spec.name,
        spec.user,
        spec.queue,
        j.submit_time,
        j.state.value,
        j.reason,
        j.start_time,
        j.end_time,
        j.exit_code,
        int(j.cancelled),
        j.run_as,
        j.submitter,
        j.submit_uid,
    )


def _job_from_row(row: tuple[Any, ...]) -> JobRecord:
    (job_id, spec_text, submit_time, state, reason, start, end, exit_code, cancelled,
     run_as, submitter, submit_uid) = row  # fmt: skip
    try:
        spec = JobSpec.from_json(json.loads(spec_text))
    except ValueError as exc:  # JSONDecodeError and SpecError are ValueErrors
        raise StoreError(f"job {job_id}: its stored spec is unreadable: {exc}") from exc
    return JobRecord(
        job_id,
        spec,
        submit_time,
        JobState(state),
        reason,
        start,
        end,
        exit_code,
        bool(cancelled),
        str(run_as),
        str(submitter),
        None if submit_uid is None else int(submit_uid),
    )
