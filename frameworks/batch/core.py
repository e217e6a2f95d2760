"""The batch scheduler's state machine: jobs and their tasks in, launches, kills and requests out.

Pure: offers, status updates, submissions, cancellations and ticks come in with the time as an
argument; :mod:`~agora.frameworks.batch.actions` come out. Every record it changes is marked
dirty, and :meth:`BatchCore.take_dirty` hands them to the service, which commits them to the
job store *before* doing the actions — a launch is durable before it leaves, an update is
durable before it is acknowledged. That is what makes a restart of the service safe: whatever
was launched is known (and reconciled), whatever was acknowledged is recorded.

Order of service: a job's priority, then the fair-share key of its user (decayed usage plus what
runs now, over the user's share), then submission order. An offer goes to the best job whose task
fits it; a job whose task does not fit (or whose constraints the agent fails) lets the next one
take the offer — backfill.

Failures: a failed attempt is retried after ``retry_backoff * 2**(n-1)`` (capped) while the
job's ``retries`` last, then the task is FAILED. A task lost by the infrastructure (dropped, gone,
lost) is requeued without using a retry, at most ``max_losses`` times. A task whose agent is
unreachable keeps its slot (it may still run) until ``unreachable_timeout`` has passed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agora.frameworks.batch import _jobs, preempt
from agora.frameworks.batch.actions import (
    Action,
    Decline,
    Kill,
    Launch,
    Reconcile,
    RequestGang,
    Revive,
    Suppress,
)
from agora.frameworks.batch.fairshare import FairShare
from agora.frameworks.batch.placement import (
    GANG_HOLD_SECONDS,
    gang_id_of,
    gang_request,
    task_info,
    task_resources,
)
from agora.frameworks.batch.records import JobRecord, JobState, TaskRecord, TaskState, task_id_of
from agora.sdk.ids import TaskID
from agora.sdk.messages import Offer, StatusSource, TaskInfo, TaskStatus
from agora.sdk.messages import TaskState as AgoraState
from agora.sdk.resources import Resources
from agora.sdk.scheduler.spec import fit_resources

__all__ = ["BatchCore", "CoreConfig"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    roles: tuple[str, ...] = ("*",)
    retry_backoff: float = 1.0
    retry_backoff_max: float = 60.0
    max_losses: int = 5
    unreachable_timeout: float = 300.0
    kill_resend: float = 10.0
    reconcile_interval: float = 60.0
    half_life: float = 3600.0
    #: Seconds an offer that nothing fits is refused for (the master re-offers after it).
    refuse_seconds: float = 2.0
    #: A launched attempt not RUNNING after this long is killed and requeued without using a
    #: retry: its launch was lost on the way (the master still says STAGING), or it is stuck.
    launch_timeout: float = 300.0
    #: Work waits and no offer came for this long: REVIVE again (a REVIVE lost on its way
    #: would leave the framework suppressed at the master for ever).
    revive_interval: float = 60.0
    #: Priority preemption per queue (role): "requeue", "cancel" or "off" (absent: off); see
    #: preempt.py. A job waits ``preempt_after`` s before it preempts, and a task that started
    #: less than ``preempt_min_runtime`` s ago is never preempted.
    preempt: Mapping[str, str] = field(default_factory=dict)
    preempt_after: float = 10.0
    preempt_min_runtime: float = 30.0


_INFRA_LOSS = frozenset(
    {AgoraState.LOST, AgoraState.DROPPED, AgoraState.GONE, AgoraState.GONE_BY_OPERATOR}
)
_MAYBE_ALIVE = frozenset({AgoraState.UNREACHABLE, AgoraState.UNKNOWN})


class BatchCore:
    def __init__(self, config: CoreConfig, fairshare: FairShare | None = None) -> None:
        self.config = config
        self.fairshare = fairshare or FairShare(config.half_life)
        self.jobs: dict[int, JobRecord] = {}  # jobs not ended
        self.ended: dict[int, JobState] = {}  # jobs ended: their final state
        self.tasks: dict[int, list[TaskRecord]] = {}  # of jobs not ended, by index
        self.ready: dict[int, deque[TaskRecord]] = {}  # pending, due now, in order
        self.delayed: list[TaskRecord] = []  # pending, retry not due yet
        self.active: dict[str, TaskRecord] = {}  # STARTING/RUNNING attempts by task id
        self.active_per_job: dict[int, int] = {}
        self.unfinished: dict[int, int] = {}  # job -> its tasks not in a terminal state
        self.waiting: set[int] = set()  # jobs held by their dependencies
        self.gangs: dict[int, str] = {}  # gang job -> outstanding gang id
        self.gang_asked: dict[int, tuple[float, int]] = {}  # gang job -> (asked when, attempt)
        self.killing: dict[str, float] = {}  # task id -> when the last kill went out
        self.launched: dict[str, float] = {}  # STARTING attempt -> when launched (or loaded)
        self.unreachable: dict[str, float] = {}  # task id -> since when
        self.dependents: dict[int, set[int]] = {}  # job -> jobs that wait for it
        self.ready_since: dict[int, float] = {}  # job with tasks ready, none running -> since
        self.preempted_for: dict[int, list[TaskRecord]] = {}  # waiting job -> its victims
        self._dirty_jobs: dict[int, JobRecord] = {}
        self._dirty_tasks: dict[tuple[int, int], TaskRecord] = {}
        self._suppressed = False
        self._last_reconcile = 0.0
        self._last_offer: float | None = None  # when an offer last came (None: not yet asked)

    # ------------------------------------------------------------------ loading and submitting

    def load(
        self,
        jobs: Iterable[JobRecord],
        tasks: Iterable[TaskRecord],
        ended: dict[int, JobState],
        now: float,
    ) -> None:
        """The store's active jobs with all their tasks, and the jobs' states (only those of
        ended jobs are kept: a dependency on a job still in ``jobs`` waits for it)."""
        self.ended.update((j, state) for j, state in ended.items() if state.terminal)
        by_job: dict[int, list[TaskRecord]] = {}
        for task in tasks:
            by_job.setdefault(task.job_id, []).append(task)
        for job in jobs:
            self._adopt(job, sorted(by_job.get(job.job_id, []), key=lambda t: t.index))
        for task in (t for ts in self.tasks.values() for t in ts):
            if task.state.active:
                self.active[task.task_id] = task
                if task.state is TaskState.STARTING:
                    self.launched[task.task_id] = now
                self.active_per_job[task.job_id] = self.active_per_job.get(task.job_id, 0) + 1
                self.fairshare.started(self.jobs[task.job_id].spec.user, self._cpus(task))
        for job in [j for j in self.jobs.values() if j.cancelled]:
            # Offers and gangs its dependents may now want are asked for at registration.
            _jobs.drop_cancelled(self, job, now)
        for job_id in list(self.jobs):
            self._check_dependencies(job_id, now)

    def add_job(self, job: JobRecord, tasks: Sequence[TaskRecord], now: float) -> list[Action]:
        """A job the store has just committed."""
        self._adopt(job, list(tasks))
        actions = self._check_dependencies(job.job_id, now)
        return actions + self._want_offers() + self._request_gangs(now)

    def _adopt(self, job: JobRecord, tasks: list[TaskRecord]) -> None:
        self.jobs[job.job_id] = job
        self.tasks[job.job_id] = tasks
        self.unfinished[job.job_id] = sum(1 for t in tasks if not t.state.terminal)
        self.ready[job.job_id] = deque(t for t in tasks if t.state is TaskState.PENDING)
        if job.spec.dependencies:
            self.waiting.add(job.job_id)
            for dep in job.spec.dependencies:
                _jobs.add_dependent(self, dep.job_id, job.job_id)
        for task in list(self.ready[job.job_id]):
            if task.not_before > 0:
                self.ready[job.job_id].remove(task)
                self.delayed.append(task)

    # ------------------------------------------------------------------ user requests

    def cancel(self, job_id: int, index: int | None, now: float) -> tuple[int, list[Action]]:
        """Cancel a job (``index`` None) or one of its tasks; (tasks affected, actions).
        KeyError for a job or index this core does not hold (ended jobs: ask the store)."""
        job = self.jobs[job_id]
        tasks = self.tasks[job_id]
        if index is not None and job.spec.is_gang:
            if not any(t.index == index for t in tasks):
                raise KeyError(index)
            index = None  # a gang runs whole or not at all: one rank cancelled is all of them
        if index is not None:
            chosen = [t for t in tasks if t.index == index]
            if not chosen:
                raise KeyError(index)
        else:
            chosen = tasks
            job.cancelled = True
            self._mark_job(job)
        actions: list[Action] = []
        count = 0
        for task in chosen:
            if task.state is TaskState.PENDING:
                self._unqueue(task)
                self._finish(task, TaskState.CANCELLED, now, "cancelled")
                count += 1
            elif task.state.active and task.kill_reason != "cancel":
                task.kill_reason = "cancel"
                self._mark(task)
                actions.append(self._kill(task, now))
                count += 1
        actions += _jobs.settle(self, job, now)
        return count, actions

    # ------------------------------------------------------------------ offers

    def offers(self, offers: Sequence[Offer], now: float) -> list[Action]:
        self._release_due(now)
        if offers:
            self._last_offer = now
        actions: list[Action] = []
        plain: list[Offer] = []
        bundles: dict[str, list[Offer]] = {}
        for offer in offers:
            if offer.gang_id is None:
                plain.append(offer)
            else:
                bundles.setdefault(offer.gang_id, []).append(offer)
        for gang_id, bundle in bundles.items():
            actions += self._gang_offer(gang_id, bundle, now)
        candidates = [j for j in self._schedulable() if not j.spec.is_gang]
        for offer in plain:
            actions.append(self._fill(offer, candidates, now))
        actions += self._want_offers()
        actions += self._request_gangs(now)
        return actions

    def _schedulable(self) -> list[JobRecord]:
        return [
            job
            for job_id, job in self.jobs.items()
            if job_id not in self.waiting and not job.cancelled and self.ready[job_id]
        ]

    def _fill(self, offer: Offer, candidates: list[JobRecord], now: float) -> Action:
        remaining = offer.resources
        infos: list[TaskInfo] = []
        unfit: set[int] = set()
        while True:
            best: JobRecord | None = None
            best_key: tuple[int, float, int] | None = None
            for job in candidates:
                if job.job_id in unfit or not self._has_slot(job):
                    continue
                key = (-job.spec.priority, self.fairshare.key(job.spec.user, now), job.job_id)
                if best_key is None or key < best_key:
                    best, best_key = job, key
            if best is None:
                break
            used = self._fits(best, offer, remaining)
            if used is None:
                unfit.add(best.job_id)  # backfill: the next job may use this offer
                continue
            task = self.ready[best.job_id].popleft()
            remaining = remaining - used
            infos.append(self._start(best, task, offer, used, now))
        if not infos:
            return Decline((offer.offer_id,), self.config.refuse_seconds)
        return Launch((offer.offer_id,), tuple(infos), self.config.refuse_seconds)

    def _has_slot(self, job: JobRecord) -> bool:
        if not self.ready[job.job_id]:
            return False
        cap = job.spec.array.max_running if job.spec.array is not None else 0
        return not cap or self.active_per_job.get(job.job_id, 0) < cap

    def _fits(self, job: JobRecord, offer: Offer, remaining: Resources) -> Resources | None:
        spec = job.spec
        if offer.role != spec.role or not all(c.allows(offer.attributes) for c in spec.constraints):
            return None
        return fit_resources(task_resources(spec), remaining, offer.role)

    def _start(
        self, job: JobRecord, task: TaskRecord, offer: Offer, used: Resources, now: float
    ) -> TaskInfo:
        task.attempt += 1
        task.task_id = task_id_of(job.job_id, task.index, task.attempt)
        task.state = TaskState.STARTING
        task.agent_id = offer.agent_id
        task.hostname = offer.hostname
        task.start_time = None
        task.end_time = None
        task.exit_code = None
        task.kill_reason = ""
        task.reason = ""
        task.cpu_seconds = task.max_rss_bytes = None
        self._mark(task)
        self.active[task.task_id] = task
        self.launched[task.task_id] = now
        self.active_per_job[job.job_id] = self.active_per_job.get(job.job_id, 0) + 1
        self.fairshare.started(job.spec.user, self._cpus(task))
        return task_info(job, task, offer, used)

    def _gang_offer(self, gang_id: str, bundle: list[Offer], now: float) -> list[Action]:
        ids = tuple(o.offer_id for o in bundle)
        job = next(
            (self.jobs[j] for j, g in self.gangs.items() if g == gang_id and j in self.jobs), None
        )
        if job is None or job.cancelled:
            return [Decline(ids, 0.0)]
        ranks = [t for t in self.tasks[job.job_id] if t.state is TaskState.PENDING]
        spec = job.spec
        shape = task_resources(spec)
        placed: list[tuple[TaskRecord, Offer, Resources]] = []
        for offer in bundle:
            left, here = offer.resources, 0
            while len(placed) < len(ranks) and (
                not spec.ntasks_per_node or here < spec.ntasks_per_node
            ):
                used = fit_resources(shape, left, offer.role)
                if used is None:
                    break
                placed.append((ranks[len(placed)], offer, used))
                left, here = left - used, here + 1
        del self.gangs[job.job_id]
        if len(placed) < spec.ntasks or len(ranks) < spec.ntasks:
            return [Decline(ids, 0.0), *self._request_gangs(now)]
        for task, _, _ in placed:
            self.ready[job.job_id].remove(task)
        infos = tuple(self._start(job, t, o, used, now) for t, o, used in placed)
        return [Launch(ids, infos, self.config.refuse_seconds)]

    def gang_expired(self, gang_id: str, now: float) -> list[Action]:
        for job_id, outstanding in list(self.gangs.items()):
            if outstanding == gang_id:
                del self.gangs[job_id]
        return self._request_gangs(now)

    def _request_gangs(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for job in self._schedulable():
            if not job.spec.is_gang or job.job_id in self.gangs:
                continue
            if len(self.ready[job.job_id]) < job.spec.ntasks:
                continue  # some ranks still run or wait for their retry time
            attempt = max(t.attempt for t in self.tasks[job.job_id]) + 1
            self.gangs[job.job_id] = gang_id_of(job.job_id, attempt)
            self.gang_asked[job.job_id] = (now, attempt)
            actions.append(RequestGang(gang_request(job, attempt)))
        return actions

    def _ask_gangs_again(self, now: float) -> list[Action]:
        """A gang request with neither a bundle nor GANG_EXPIRED well past its hold timeout was
        lost (or its answer was): ask again, the same gang (the master keeps a pending one)."""
        actions: list[Action] = []
        for job_id in sorted(self.gangs):
            asked, attempt = self.gang_asked.get(job_id, (now, 0))
            job = self.jobs.get(job_id)
            if job is None or now - asked < GANG_HOLD_SECONDS + self.config.reconcile_interval:
                continue
            self.gang_asked[job_id] = (now, attempt)
            actions.append(RequestGang(gang_request(job, attempt)))
        return actions

    # ------------------------------------------------------------------ status updates

    def status(self, status: TaskStatus, now: float) -> list[Action]:
        task = self.active.get(status.task_id)
        if task is None:
            return self._stray(status)
        state = status.state
        if state in (AgoraState.STAGING, AgoraState.STARTING, AgoraState.KILLING):
            self.unreachable.pop(task.task_id, None)
            return []
        if state is AgoraState.RUNNING:
            self.unreachable.pop(task.task_id, None)
            if task.state is TaskState.STARTING:
                self.launched.pop(task.task_id, None)
                task.state = TaskState.RUNNING
                task.start_time = now
                self._mark(task)
                _jobs.started(self, self.jobs[task.job_id], now)
            return []
        if state in _MAYBE_ALIVE:
            self.unreachable.setdefault(task.task_id, now)
            return []
        return _jobs.attempt_ended(self, task, status, now)

    def _stray(self, status: TaskStatus) -> list[Action]:
        """An update for no live attempt: an old one resurfacing (after we gave up on it) is
        killed; anything else (a duplicate, an old terminal state) is only acknowledged."""
        alive = (AgoraState.STAGING, AgoraState.STARTING, AgoraState.RUNNING)
        if status.state in alive and status.task_id.startswith("batch-") and status.agent_id:
            return [Kill(status.task_id, status.agent_id)]
        return []

    # ------------------------------------------------------------------ time

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        self._release_due(now)
        for task in list(self.active.values()):
            job = self.jobs[task.job_id]
            limit = job.spec.time_limit
            if (
                limit is not None
                and task.state is TaskState.RUNNING
                and task.start_time is not None
                and now - task.start_time >= limit
                and not task.kill_reason
            ):
                task.kill_reason = "timeout"
                self._mark(task)
                actions.append(self._kill(task, now))
            elif (
                task.state is TaskState.STARTING
                and not task.kill_reason
                and now - self.launched.get(task.task_id, now) >= self.config.launch_timeout
            ):
                task.kill_reason = "launch"
                self._mark(task)
                actions.append(self._kill(task, now))
            elif task.kill_reason and now - self.killing.get(task.task_id, 0.0) >= (
                self.config.kill_resend
            ):
                actions.append(self._kill(task, now))
        for task_id, since in list(self.unreachable.items()):
            gone = self.active.get(task_id)
            if gone is None:
                del self.unreachable[task_id]
            elif now - since >= self.config.unreachable_timeout:
                del self.unreachable[task_id]
                lost = TaskStatus(
                    task_id=TaskID(task_id),
                    state=AgoraState.LOST,
                    source=StatusSource.MASTER,
                    message=f"unreachable for {self.config.unreachable_timeout:g} s",
                )
                actions += _jobs.attempt_ended(self, gone, lost, now)
        if self.active and now - self._last_reconcile >= self.config.reconcile_interval:
            actions.append(self.reconcile(now))
        if self.config.preempt:
            actions += preempt.preempt(self, now)
        actions += self._request_gangs(now)
        actions += self._want_offers()
        actions += self._revive_again(now)
        actions += self._ask_gangs_again(now)
        return actions

    def reconcile(self, now: float) -> Reconcile:
        """Ask for the latest state of every launched task (at (re)subscription, and now and
        then: a launch lost on its way is answered DROPPED/GONE/LOST and is requeued)."""
        self._last_reconcile = now
        return Reconcile(tuple((t.task_id, t.agent_id) for t in self.active.values()))

    def registered(self, now: float) -> list[Action]:
        """The driver (re)subscribed: reconcile, ask for gangs and offers again."""
        self._suppressed = False
        self._last_offer = now  # the new subscription brings offers
        self.gangs.clear()  # the master forgot our requests along with our old subscription
        actions: list[Action] = [self.reconcile(now), Revive()]
        actions += self._request_gangs(now)
        return actions

    def _release_due(self, now: float) -> None:
        if not self.delayed:
            return
        due = [t for t in self.delayed if t.not_before <= now]
        if not due:
            return
        self.delayed = [t for t in self.delayed if t.not_before > now]
        for task in sorted(due, key=lambda t: t.index):
            if task.state is TaskState.PENDING:
                self.ready[task.job_id].append(task)

    def _wanted(self) -> bool:
        return any(not job.spec.is_gang and self._has_slot(job) for job in self._schedulable())

    def _revive_again(self, now: float) -> list[Action]:
        """Work waits, yet no offer came for ``revive_interval``: say so again."""
        if self._last_offer is None:
            self._last_offer = now
        if self._suppressed or now - self._last_offer < self.config.revive_interval:
            return []
        if not self._wanted():
            return []
        self._last_offer = now  # once per interval
        return [Revive()]

    def _want_offers(self) -> list[Action]:
        wanted = self._wanted()
        if wanted and self._suppressed:
            self._suppressed = False
            return [Revive()]
        if not wanted and not self._suppressed and not self.delayed:
            self._suppressed = True
            return [Suppress()]
        return []

    # ------------------------------------------------------------------ bookkeeping

    def _kill(self, task: TaskRecord, now: float) -> Kill:
        self.killing[task.task_id] = now
        return Kill(task.task_id, task.agent_id)

    def _cpus(self, task: TaskRecord) -> float:
        return self.jobs[task.job_id].spec.cpus

    def _unqueue(self, task: TaskRecord) -> None:
        queue = self.ready.get(task.job_id)
        if queue is not None and task in queue:
            queue.remove(task)
        if task in self.delayed:
            self.delayed.remove(task)

    def _finish(self, task: TaskRecord, state: TaskState, now: float, reason: str) -> None:
        if not task.state.terminal:
            self.unfinished[task.job_id] -= 1
        task.state = state
        task.end_time = now
        task.reason = reason
        self._mark(task)

    def _check_dependencies(self, job_id: int, now: float) -> list[Action]:
        return _jobs.check_dependencies(self, job_id, now)

    def _mark(self, task: TaskRecord) -> None:
        self._dirty_tasks[task.key] = task

    def _mark_job(self, job: JobRecord) -> None:
        self._dirty_jobs[job.job_id] = job

    def take_dirty(self) -> tuple[list[JobRecord], list[TaskRecord]]:
        jobs, tasks = list(self._dirty_jobs.values()), list(self._dirty_tasks.values())
        self._dirty_jobs.clear()
        self._dirty_tasks.clear()
        return jobs, tasks

    @property
    def has_dirty(self) -> bool:
        return bool(self._dirty_jobs or self._dirty_tasks)
