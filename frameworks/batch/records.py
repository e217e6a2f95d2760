"""What the batch service keeps per job and per task: the rows of its job store.

The scheduling core (:mod:`agora.frameworks.batch.core`) changes these records in memory and
marks them dirty; the service writes every dirty record to the store in one transaction before
it sends anything that depends on them (a launch, an acknowledgement). One :class:`TaskRecord`
per array index (or gang rank) holds its latest attempt: it is that task's accounting record.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agora.frameworks.batch.spec import JobSpec

__all__ = ["JobRecord", "JobState", "TaskRecord", "TaskState", "task_id_of"]


class TaskState(StrEnum):
    PENDING = "PENDING"  # waiting for its dependencies, a slot, an offer, or its retry time
    STARTING = "STARTING"  # launched (durably recorded first), not yet running
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"  # exited 0
    FAILED = "FAILED"  # failed on its last attempt
    CANCELLED = "CANCELLED"  # cancelled by a user, or never started (dependency never met)
    TIMEOUT = "TIMEOUT"  # killed at its time limit

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """Launched and not known to be over: it holds resources on an agent."""
        return self is TaskState.STARTING or self is TaskState.RUNNING


_TERMINAL = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMEOUT}
)


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"

    @property
    def terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


def task_id_of(job_id: int, index: int, attempt: int) -> str:
    """The Agora task id of one attempt: unique for ever within the store."""
    return f"batch-{job_id}.{index}-{attempt}"


@dataclass(slots=True)
class TaskRecord:
    """One array index (or gang rank) of a job and its latest attempt.

    ``attempt`` counts launches; ``failures`` the failed attempts (retries used); ``losses`` the
    attempts lost to the infrastructure (requeued without using a retry). ``not_before``: a
    retry waits until then. ``kill_reason``: why the service asked to kill the running attempt
    ("timeout", "cancel", "gang", "launch", or ``preempt:JOB:PRIORITY`` for a job of higher
    priority that preempts it), which decides its final state. ``exit_code`` is the last
    attempt's; ``cpu_seconds`` and ``max_rss_bytes`` what its agent measured. ``preemptions``
    counts its attempts that were preempted (by a job of its queue, or by the master).
    """

    job_id: int
    index: int
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    failures: int = 0
    losses: int = 0
    task_id: str = ""
    agent_id: str = ""
    hostname: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str = ""
    cpu_seconds: float | None = None
    max_rss_bytes: int | None = None
    not_before: float = 0.0
    kill_reason: str = ""
    preemptions: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.index)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "index": self.index,
            "state": self.state.value,
            "attempt": self.attempt,
            "failures": self.failures,
            "losses": self.losses,
            "task_id": self.task_id,
            "agent_id": self.agent_id,
            "hostname": self.hostname,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "cpu_seconds": self.cpu_seconds,
            "max_rss_bytes": self.max_rss_bytes,
            "preemptions": self.preemptions,
        }


@dataclass(slots=True)
class JobRecord:
    """A job: its spec, its state and when it changed. ``exit_code`` is set once it ends: 0 when
    COMPLETED, else the highest exit code among its tasks (1 if none exited on its own)."""

    job_id: int
    spec: JobSpec
    submit_time: float
    state: JobState = JobState.PENDING
    reason: str = ""
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    #: Set when a user cancelled the whole job (its pending tasks are dropped at once).
    cancelled: bool = False
    #: The Unix user its tasks run as (the spec's user; "" for a job stored before the service
    #: ran jobs as their users: it runs as the framework's user, as it did then).
    run_as: str = ""
    #: Who submitted it: a login (over the Unix socket), ``token:PRINCIPAL``, ``insecure-http``.
    submitter: str = ""
    #: The submitter's uid, when it came over the Unix socket.
    submit_uid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.spec.name,
            "user": self.spec.user,
            "queue": self.spec.queue,
            "priority": self.spec.priority,
            "state": self.state.value,
            "reason": self.reason,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "exit_code": self.exit_code,
            "array": None if self.spec.array is None else str(self.spec.array),
            "ntasks": self.spec.ntasks,
            "dependencies": [str(d) for d in self.spec.dependencies],
            "run_as": self.run_as,
            "submitter": self.submitter,
            "submit_uid": self.submit_uid,
        }
