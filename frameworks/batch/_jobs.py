"""The job-level rules of the batch core: how an attempt's end decides its task's fate, when a job
has ended and in which state, and dependencies (Slurm's afterok / afterany / afternotok).

Functions over a :class:`~agora.frameworks.batch.core.BatchCore`, kept apart so the core's file
holds the flow (offers, updates, time) and this one the verdicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agora.frameworks.batch.actions import Action
from agora.frameworks.batch.preempt import by_whom
from agora.frameworks.batch.records import JobRecord, JobState, TaskRecord, TaskState
from agora.frameworks.batch.spec import DepKind
from agora.sdk.messages import Reason, TaskStatus
from agora.sdk.messages import TaskState as AgoraState

if TYPE_CHECKING:
    from agora.frameworks.batch.core import BatchCore

__all__ = [
    "add_dependent",
    "attempt_ended",
    "check_dependencies",
    "drop_cancelled",
    "settle",
    "started",
]

_LOSSES = frozenset(
    {
        AgoraState.LOST,
        AgoraState.DROPPED,
        AgoraState.GONE,
        AgoraState.GONE_BY_OPERATOR,
        AgoraState.UNREACHABLE,
        AgoraState.UNKNOWN,
    }
)

# Stopped by the master to give another role its guarantee back: no fault of the task's.
_PREEMPTED = frozenset({AgoraState.KILLED})
_PREEMPTING = frozenset({Reason.TASK_PREEMPTED, Reason.RESOURCES_REVOKED})

# What ended an attempt, worst last: the verdict of a gang attempt is its worst rank's (a
# preempted rank outranks the losses of the ranks stopped because of it).
_ORDER = ("completed", "loss", "preempted", "failure", "timeout", "cancel")


def add_dependent(core: BatchCore, on: int, dependent: int) -> None:
    core.dependents.setdefault(on, set()).add(dependent)


def started(core: BatchCore, job: JobRecord, now: float) -> None:
    if job.state is JobState.PENDING:
        job.state = JobState.RUNNING
        job.start_time = now
        core._mark_job(job)


def _outcome(task: TaskRecord, job: JobRecord, status: TaskStatus) -> str:
    if status.state is AgoraState.FINISHED:
        return "completed"
    if task.kill_reason == "timeout":
        return "timeout"
    if task.kill_reason == "cancel" or job.cancelled:
        return "cancel"
    if status.state in _PREEMPTED and status.reason in _PREEMPTING:
        return "preempted"  # by the master, for another queue's guarantee
    if by_whom(task.kill_reason) is not None:
        return "preempted"  # by a job of higher priority in the queue
    if task.kill_reason in ("gang", "launch"):
        # Stopped because another rank ended (the culprit decides the verdict), or never
        # started in time (its launch was lost): not the task's fault.
        return "loss"
    if status.state in _LOSSES:
        return "loss"
    return "failure"


def attempt_ended(
    core: BatchCore, task: TaskRecord, status: TaskStatus, now: float
) -> list[Action]:
    """A launched attempt is over (``status`` is terminal): record it and decide what next."""
    job = core.jobs[task.job_id]
    spec = job.spec
    core.active.pop(task.task_id, None)
    core.active_per_job[job.job_id] = core.active_per_job.get(job.job_id, 1) - 1
    core.killing.pop(task.task_id, None)
    core.launched.pop(task.task_id, None)
    core.unreachable.pop(task.task_id, None)
    if task.start_time is not None:
        core.fairshare.ended(spec.user, spec.cpus, now - task.start_time, now)
    else:
        core.fairshare.forget_running(spec.user, spec.cpus)
    task.exit_code = status.exit_code
    task.cpu_seconds = status.cpu_seconds
    task.max_rss_bytes = status.max_rss_bytes
    if status.agent_id:
        task.agent_id = status.agent_id
    outcome = _outcome(task, job, status)
    why = status.message or status.state.value
    if status.reason is not None:
        why = f"{status.reason.value}: {why}"
    if outcome == "preempted":
        preemptor = by_whom(task.kill_reason)
        if preemptor is None:
            why = f"PREEMPTED by the cluster ({why})"
        else:
            why = f"PREEMPTED by job {preemptor[0]} (priority {preemptor[1]})"
    actions: list[Action] = []
    if spec.is_gang:
        actions += _gang_rank_ended(core, job, task, outcome, why, now)
    else:
        _single_ended(core, job, task, outcome, why, now)
    actions += settle(core, job, now)
    return actions


def _single_ended(
    core: BatchCore, job: JobRecord, task: TaskRecord, outcome: str, why: str, now: float
) -> None:
    if outcome == "completed":
        core._finish(task, TaskState.COMPLETED, now, "")
    elif outcome == "timeout":
        core._finish(task, TaskState.TIMEOUT, now, f"time limit of {job.spec.time_limit:g} s")
    elif outcome == "cancel":
        core._finish(task, TaskState.CANCELLED, now, "cancelled")
    elif outcome == "preempted":
        task.preemptions += 1
        if _cancels(core, job, task):
            core._finish(task, TaskState.CANCELLED, now, why)
        else:
            _requeue(core, task, now, 0.0, f"requeued: {why}")
    elif outcome == "loss":
        task.losses += 1
        if task.losses > core.config.max_losses:
            core._finish(task, TaskState.FAILED, now, f"lost {task.losses} times; last: {why}")
        else:
            _requeue(core, task, now, 0.0, f"requeued: {why}")
    else:
        task.failures += 1
        if task.failures > job.spec.retries:
            core._finish(task, TaskState.FAILED, now, why)
        else:
            _requeue(core, task, now, _backoff(core, task.failures), f"retrying after: {why}")


def _gang_rank_ended(
    core: BatchCore, job: JobRecord, task: TaskRecord, outcome: str, why: str, now: float
) -> list[Action]:
    """One rank of a gang attempt ended. Any end but success stops the other ranks; once none
    runs, the worst way a rank ended decides for the whole gang: retried together (after a
    failure, while retries last; after a loss, at once), or every unfinished rank ends so."""
    actions: list[Action] = []
    if outcome == "completed":
        core._finish(task, TaskState.COMPLETED, now, "")
    else:
        if task.kill_reason != "gang" and by_whom(task.kill_reason) is None:
            task.kill_reason = outcome  # kept with the record: how this rank ended the attempt
        core._finish(task, TaskState.FAILED, now, why)
        for sibling in core.tasks[job.job_id]:
            if sibling.state.active and not sibling.kill_reason:
                sibling.kill_reason = "gang"
                core._mark(sibling)
                actions.append(core._kill(sibling, now))
    ranks = core.tasks[job.job_id]
    if any(t.state.active for t in ranks):
        return actions
    ended = [r for r in ranks if r.state is not TaskState.COMPLETED]
    if not ended:
        return actions
    culprit = max(ended, key=lambda r: _ORDER.index(_how_ended(r)))
    verdict, reason = _how_ended(culprit), f"task {culprit.index}: {culprit.reason}"
    if job.cancelled:  # cancelled while its ranks were stopping: never run again
        verdict, reason = "cancel", "cancelled"
    final = {"timeout": TaskState.TIMEOUT, "cancel": TaskState.CANCELLED}.get(verdict)
    if verdict == "preempted":
        for rank in ended:  # the gang's attempt was preempted: so was every rank's
            rank.preemptions += 1
        if _cancels(core, job, culprit):
            final = TaskState.CANCELLED
    if final is None:
        lead = ranks[0]
        if verdict == "preempted":
            again, delay = True, 0.0  # neither a retry nor a loss
        elif verdict == "loss":
            lead.losses += 1
            again = lead.losses <= core.config.max_losses
            delay = 0.0
        else:
            lead.failures += 1
            again = lead.failures <= job.spec.retries
            delay = _backoff(core, lead.failures)
        if again:
            for rank in ranks:
                rank.failures, rank.losses = lead.failures, lead.losses
                _requeue(core, rank, now, delay, f"gang retrying after: {reason}")
            return actions + core._request_gangs(now)
        final = TaskState.FAILED
    for rank in ended:
        rank.state = final  # already terminal: no change to the unfinished count
        rank.reason = reason
        core._mark(rank)
    return actions


def _cancels(core: BatchCore, job: JobRecord, task: TaskRecord) -> bool:
    """A task preempted by a job of its queue whose mode is ``cancel`` ends CANCELLED (one the
    master preempted is always requeued)."""
    return by_whom(task.kill_reason) is not None and core.config.preempt.get(job.spec.role) == (
        "cancel"
    )


def _how_ended(rank: TaskRecord) -> str:
    """A rank's part in its gang attempt's end: its own outcome, or "loss" for a rank stopped
    because another one ended."""
    if by_whom(rank.kill_reason) is not None:
        return "preempted"
    return rank.kill_reason if rank.kill_reason in _ORDER else "loss"


def _backoff(core: BatchCore, failures: int) -> float:
    base, cap = core.config.retry_backoff, core.config.retry_backoff_max
    return float(min(cap, base * 2 ** max(0, failures - 1)))


def _requeue(core: BatchCore, task: TaskRecord, now: float, delay: float, reason: str) -> None:
    if task.state.terminal:  # a gang rank ended by its attempt's end: pending again
        core.unfinished[task.job_id] += 1
    task.state = TaskState.PENDING
    task.reason = reason
    task.end_time = None
    task.kill_reason = ""
    task.not_before = now + delay if delay > 0 else 0.0
    core._mark(task)
    if task.not_before:
        core.delayed.append(task)
    else:
        core.ready[task.job_id].append(task)


# ---------------------------------------------------------------------- jobs ending


def settle(core: BatchCore, job: JobRecord, now: float) -> list[Action]:
    """End ``job`` if none of its tasks is pending or running; then its dependents may move."""
    tasks = core.tasks.get(job.job_id)
    if tasks is None or core.unfinished[job.job_id]:
        return []
    states = {t.state for t in tasks}
    if job.reason.startswith("DependencyNeverSatisfied"):
        job.state = JobState.FAILED
    elif states == {TaskState.COMPLETED}:
        job.state = JobState.COMPLETED
    elif job.cancelled:
        job.state = JobState.CANCELLED
    elif TaskState.FAILED in states:
        job.state = JobState.FAILED
    elif TaskState.TIMEOUT in states:
        job.state = JobState.TIMEOUT
    else:
        job.state = JobState.CANCELLED
    codes = [t.exit_code for t in tasks if t.exit_code is not None and t.exit_code > 0]
    job.exit_code = 0 if job.state is JobState.COMPLETED else max(codes, default=1)
    job.end_time = now
    if not job.reason and job.state is not JobState.COMPLETED:
        bad = next((t for t in tasks if t.state is not TaskState.COMPLETED), None)
        job.reason = "" if bad is None else f"task {bad.index}: {bad.state.value} {bad.reason}"
    core._mark_job(job)
    del core.jobs[job.job_id]
    del core.tasks[job.job_id]
    core.ready.pop(job.job_id, None)
    core.active_per_job.pop(job.job_id, None)
    core.unfinished.pop(job.job_id, None)
    core.gangs.pop(job.job_id, None)
    core.gang_asked.pop(job.job_id, None)
    core.ready_since.pop(job.job_id, None)
    core.preempted_for.pop(job.job_id, None)
    core.waiting.discard(job.job_id)
    core.ended[job.job_id] = job.state
    actions: list[Action] = []
    for dependent in sorted(core.dependents.pop(job.job_id, set())):
        actions += check_dependencies(core, dependent, now)
    return actions


def drop_cancelled(core: BatchCore, job: JobRecord, now: float) -> list[Action]:
    """A cancelled job still holds pending tasks (a store written before cancels ended a gang
    whose ranks were stopping): end them, and the job once nothing of it runs."""
    for task in core.tasks[job.job_id]:
        if task.state is TaskState.PENDING:
            core._unqueue(task)
            core._finish(task, TaskState.CANCELLED, now, "cancelled")
    return settle(core, job, now)


def check_dependencies(core: BatchCore, job_id: int, now: float) -> list[Action]:
    """Release ``job_id`` when its dependencies are met; fail it when one never can be."""
    job = core.jobs.get(job_id)
    if job is None or job_id not in core.waiting:
        return []
    met = True
    for dep in job.spec.dependencies:
        state = core.ended.get(dep.job_id)
        if state is None:
            if dep.job_id in core.jobs:
                met = False
                continue
            state = JobState.CANCELLED  # unknown to the store: it can never end well
        ok = state is JobState.COMPLETED
        if (dep.kind is DepKind.AFTEROK and not ok) or (dep.kind is DepKind.AFTERNOTOK and ok):
            return _never(core, job, f"{dep} (job {dep.job_id} {state.value})", now)
    if not met:
        return []
    core.waiting.discard(job_id)
    return core._want_offers() + core._request_gangs(now)


def _never(core: BatchCore, job: JobRecord, why: str, now: float) -> list[Action]:
    job.reason = f"DependencyNeverSatisfied: {why}"
    core.waiting.discard(job.job_id)
    for task in core.tasks[job.job_id]:
        if task.state is TaskState.PENDING:
            core._unqueue(task)
            core._finish(task, TaskState.CANCELLED, now, "dependency never satisfied")
    return settle(core, job, now)
