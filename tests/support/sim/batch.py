"""The batch service in the simulation: the real scheduling core and job store on the real
scheduler driver core.

It does what ``agora.frameworks.batch.service.BatchService`` does: every event goes to the
:class:`~agora.frameworks.batch.core.BatchCore`; the records it changed are committed to the
:class:`~agora.frameworks.batch.store.JobStore` (SQLite, in a temporary file: it survives a crash
of the service) before its actions go out and before any update is acknowledged
(explicit acknowledgements, as the service's driver is made). A crash loses the core and the
driver; the restart loads the store's active jobs and re-subscribes with the stored framework id.

The workload is the made-up part: jobs arrive at random times, some arrays, some retrying, some
with a time limit shorter than their tasks, some waiting on an earlier job (afterok, afterany,
afternotok), and now and then one is cancelled. What the service promised is checked at the end
(:meth:`SimBatch.problems`): every job ends, none starts before its dependencies allow, none
runs when they cannot be met, no task runs more attempts than its retries and losses allow, and a
task completed only when its last attempt finished.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

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
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.fairshare import FairShare
from agora.frameworks.batch.records import JobState, TaskState
from agora.frameworks.batch.spec import ArraySpec, Dependency, DepKind, JobSpec
from agora.frameworks.batch.store import JobStore
from agora.sdk.ids import AgentID, FrameworkID, GangID, TaskID
from agora.sdk.messages import (
    Error,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    Offer,
    ReconcileTask,
    TaskStatus,
)
from agora.sdk.messages import Launch as LaunchOp
from agora.sdk.messages import TaskState as AgoraState

from support.sim.clock import EventQueue
from support.sim.driver import SimDriver
from support.sim.framework import FrameworkSpec, FwTask, last_word, record_status
from support.sim.network import SimNetwork

__all__ = ["BatchWorkload", "SimBatch"]


@dataclass(slots=True)
class BatchWorkload:
    jobs: int = 40
    #: Seconds between submissions.
    gap: tuple[float, float] = (2.0, 9.0)
    array_probability: float = 0.4
    #: Gang jobs (MPI-like: ``ntasks`` ranks placed together or not at all).
    gang_probability: float = 0.1
    dependency_probability: float = 0.3
    time_limit_probability: float = 0.15
    cancel_probability: float = 0.08
    max_retries: int = 2
    #: Crashes of the service (each restarted after a random downtime in the range).
    crashes: int = 0
    downtime: tuple[float, float] = (1.0, 15.0)
    core: CoreConfig = field(
        default_factory=lambda: CoreConfig(
            retry_backoff=2.0, reconcile_interval=30.0, launch_timeout=60.0
        )
    )


class SimBatch:
    """The batch service as one framework of the simulation (see the module docstring)."""

    def __init__(
        self,
        workload: BatchWorkload,
        queue: EventQueue,
        net: SimNetwork,
        rng: random.Random,
    ) -> None:
        self.workload = workload
        self.name = "batch"
        #: What the generic framework checks read (it is partition-aware, as the service is).
        self.spec = FrameworkSpec("batch", partition_aware=True, failover_timeout=3600.0)
        self.queue = queue
        self.net = net
        self.rng = rng
        # On tmpfs when there is one: the store's fsyncs cost nothing there.
        shm = Path("/dev/shm")
        self._dir = Path(
            tempfile.mkdtemp(prefix="agora-sim-batch-", dir=shm if shm.is_dir() else None)
        )
        self.store = JobStore.open(self._dir / "jobs.db")
        self.core: BatchCore | None = None
        self.driver: SimDriver | None = None
        self.incarnation = 0
        self.crashes = 0
        self.launching = True
        self.tasks: dict[TaskID, FwTask] = {}
        self.kills: dict[str, TaskID] = {}
        self.errors: list[Error] = []
        self.foreign_offers: list[Offer] = []
        self.unknown_updates: list[TaskStatus] = []
        self.subscriptions = 0
        self.gangs_launched = 0
        self.gang_kills = 0
        #: (job, index) -> the attempts launched: (task id, simulated time).
        self.launches: dict[tuple[int, int], list[tuple[str, float]]] = {}
        self.submitted: list[int] = []
        self.cancelled: set[int] = set()

    # --- what the runner and the checks read ----------------------------------------------
    @property
    def framework_id(self) -> FrameworkID | None:
        """The framework's id, also while the service is down (the store keeps it)."""
        if self.driver is not None and self.driver.framework_id is not None:
            return self.driver.framework_id
        known = self.store.get_meta("framework_id")
        return FrameworkID(known) if known else None

    @property
    def subscribed(self) -> bool:
        return self.driver is not None and self.driver.core.subscribed

    @property
    def removed(self) -> bool:
        return self.driver is not None and self.driver.stopped and self.core is not None

    def settled(self) -> bool:
        """Every job submitted has ended (the store says so)."""
        states = self.store.load_job_states()
        return all(states[j].terminal for j in self.submitted)

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._boot()
        wl = self.workload
        at = 0.0
        for _ in range(wl.jobs):
            at += self.rng.uniform(*wl.gap)
            self.queue.later(at, self._submit, "batch submit")
        for _ in range(wl.crashes):
            when = self.rng.uniform(20.0, max(20.0, at))
            down = self.rng.uniform(*wl.downtime)
            self.queue.later(when, lambda down=down: self._crash(down), "batch crash")

    def stop_launching(self) -> None:
        self.launching = False

    def close(self) -> None:
        """The run is over: drop the store's file."""
        self.store.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _boot(self) -> None:
        """Start the service: the core from the store, a driver subscribing with the stored id."""
        self.incarnation += 1
        now = self.queue.clock.now
        fairshare = FairShare(self.workload.core.half_life)
        fairshare.restore(self.store.load_usage())
        core = BatchCore(self.workload.core, fairshare)
        jobs, tasks = self.store.load_active()
        core.load(jobs, tasks, self.store.load_job_states(), now)
        self.core = core
        known = self.store.get_meta("framework_id")
        info = FrameworkInfo(
            name="batch",
            user="batch",
            roles=("*",),
            failover_timeout=self.spec.failover_timeout,
            capabilities=(FrameworkCapability.PARTITION_AWARE, FrameworkCapability.GANG),
            framework_id=FrameworkID(known) if known else None,
            checkpoint=True,
        )
        self.driver = SimDriver(
            "batch",
            info,
            self,
            self.queue,
            self.net,
            subscribe_retry=4.0,
            implicit_acknowledgements=False,
        )
        self.driver.start()
        incarnation = self.incarnation
        self.queue.later(1.0, lambda: self._tick(incarnation), "batch tick")

    def _crash(self, downtime: float) -> None:
        """The service dies: core and driver gone, the store (the file) and the tasks stay."""
        if self.driver is None or self.driver.stopped:
            return
        self.crashes += 1
        self.driver.stopped = True
        self.net.detach("batch")
        self.core = None
        self.driver = None
        self.incarnation += 1
        self.queue.later(downtime, self._boot, "batch restart")

    def _tick(self, incarnation: int) -> None:
        if incarnation != self.incarnation or self.core is None:
            return
        self._do(self.core.tick(self.queue.clock.now))
        self.queue.later(1.0, lambda: self._tick(incarnation), "batch tick")

    # --- the link (a group of masters) -----------------------------------------------------
    def link_up(self) -> None:
        if self.driver is not None:
            self.driver.link_up()

    def link_down(self) -> None:
        if self.driver is not None:
            self.driver.link_down()

    def connection_lost(self) -> None:
        if self.driver is not None:
            self.driver.connection_lost()

    # --- the workload ----------------------------------------------------------------------
    def _submit(self) -> None:
        if not self.launching or self.core is None:
            return  # a submission while the service is down is refused; the user retries later
        wl, rng = self.workload, self.rng
        array = rng.random() < wl.array_probability
        ranks = rng.randint(2, 3) if not array and rng.random() < wl.gang_probability else 1
        deps: tuple[Dependency, ...] = ()
        if self.submitted and rng.random() < wl.dependency_probability:
            kind = rng.choice((DepKind.AFTEROK, DepKind.AFTERANY, DepKind.AFTERNOTOK))
            deps = (Dependency(kind, rng.choice(self.submitted)),)
        limit = rng.uniform(3.0, 20.0) if rng.random() < wl.time_limit_probability else None
        spec = JobSpec(
            name=f"job{len(self.submitted) + 1}",
            user=rng.choice(("ann", "bob", "cy")),
            command="true",
            cpus=rng.choice((0.25, 0.5, 1.0)),
            mem=rng.choice((64.0, 128.0, 256.0)),
            array=ArraySpec(((0, rng.randint(1, 4), 1),)) if array else None,
            ntasks=ranks,
            dependencies=deps,
            priority=rng.randint(0, 3),
            time_limit=limit,
            retries=rng.randint(0, wl.max_retries),
        )
        now = self.queue.clock.now
        job, tasks = self.store.add_job(spec, now)
        self.submitted.append(job.job_id)
        self._do(self.core.add_job(job, tasks, now))
        if rng.random() < wl.cancel_probability:
            later = rng.uniform(1.0, 30.0)
            self.queue.later(later, lambda job_id=job.job_id: self._cancel(job_id), "cancel")

    def _cancel(self, job_id: int) -> None:
        if self.core is None or job_id not in self.core.jobs:
            return  # as the API answers: an ended job has nothing left to cancel
        _count, actions = self.core.cancel(job_id, None, self.queue.clock.now)
        self.cancelled.add(job_id)
        self._do(actions)

    # --- the driver's callbacks (the service's) ------------------------------------------------
    def registered(self, framework_id: FrameworkID) -> None:
        self.subscriptions += 1
        self.store.set_meta("framework_id", str(framework_id))
        if self.core is not None:
            self._do(self.core.registered(self.queue.clock.now))

    def reregistered(self) -> None:
        self.subscriptions += 1
        if self.core is not None:
            self._do(self.core.registered(self.queue.clock.now))

    def disconnected(self) -> None:
        pass

    def error(self, message: Error) -> None:
        self.errors.append(message)

    def gang_expired(self, gang_id: GangID) -> None:
        if self.core is not None:
            self._do(self.core.gang_expired(gang_id, self.queue.clock.now))

    def offers(self, offers: list[Offer]) -> None:
        if self.core is None or self.framework_id is None:
            return
        mine = []
        for offer in offers:
            if offer.framework_id != self.framework_id:
                self.foreign_offers.append(offer)
            else:
                mine.append(offer)
        self._do(self.core.offers(mine, self.queue.clock.now))

    def status_update(self, status: TaskStatus) -> None:
        task = self.tasks.get(status.task_id)
        if task is None:
            self.unknown_updates.append(status)
        else:
            record_status(task, status, self.queue.clock.now)
        if self.core is None:
            return
        self._do(self.core.status(status, self.queue.clock.now), ack=status)

    # --- the commit point ----------------------------------------------------------------------
    def _do(self, actions: list[Action], ack: TaskStatus | None = None) -> None:
        """Commit what the core changed, then act, then acknowledge (BatchService.flush)."""
        core, driver = self.core, self.driver
        assert core is not None and driver is not None
        jobs, tasks = core.take_dirty()
        usage = core.fairshare.take_changed(self.queue.clock.now)
        if jobs or tasks or usage:
            self.store.save(jobs, tasks, usage)
        now = self.queue.clock.now
        for action in actions:
            if isinstance(action, Launch):  # launched for the service once stored, sent or not
                for info in action.tasks:
                    self._launched(info.task_id, info.agent_id, now)
        for action in actions:
            # No framework id yet (RuntimeError): registration reconciles and revives.
            with contextlib.suppress(RuntimeError):
                self._send(action)
        if ack is not None and ack.uuid is not None and ack.agent_id is not None:
            with contextlib.suppress(RuntimeError, ValueError):
                driver.core.acknowledge(ack)
        driver.flush()

    def _send(self, action: Action) -> None:
        driver = self.driver
        assert driver is not None
        core = driver.core
        now = self.queue.clock.now
        if isinstance(action, Launch):
            held = [core.offers.get(offer_id) for offer_id in action.offer_ids]
            self.gangs_launched += any(o is not None and o.gang_id for o in held)
            core.accept(
                list(action.offer_ids),
                [LaunchOp(task_infos=action.tasks)],
                Filters(refuse_seconds=action.refuse_seconds),
            )
        elif isinstance(action, Decline):
            core.decline(list(action.offer_ids), Filters(refuse_seconds=action.refuse_seconds))
        elif isinstance(action, Kill):
            kill_id = f"batch-k{len(self.kills) + 1}"
            self.kills[kill_id] = TaskID(action.task_id)
            task = self.tasks.get(TaskID(action.task_id))
            if task is not None:
                if not task.kill_ids:
                    task.states_before_kill = len(task.states)
                task.kill_ids.append(kill_id)
                task.kill_sent_at = now
            core.kill(action.task_id, action.agent_id, kill_id)
        elif isinstance(action, Reconcile):
            core.reconcile(
                [
                    ReconcileTask(task_id=TaskID(t), agent_id=AgentID(a) if a else None)
                    for t, a in action.tasks
                ]
            )
        elif isinstance(action, RequestGang):
            core.request([action.request])
        elif isinstance(action, Revive):
            core.revive([])
        elif isinstance(action, Suppress):
            core.suppress([])

    def _launched(self, task_id: TaskID, agent_id: AgentID | None, now: float) -> None:
        assert task_id not in self.tasks, f"batch launched attempt {task_id} twice"
        assert agent_id is not None
        self.tasks[task_id] = FwTask(task_id, agent_id, now, last_news=now)
        job, index, _attempt = _parse(task_id)
        self.launches.setdefault((job, index), []).append((task_id, now))

    # --- end of run --------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What the batch service promised and did not keep."""
        out: list[str] = []
        states = self.store.load_job_states()
        first_launch: dict[int, float] = {}
        for (job, _index), attempts in self.launches.items():
            first = min(at for _t, at in attempts)
            first_launch[job] = min(first, first_launch.get(job, first))
        for job_id in self.submitted:
            state = states[job_id]
            if not state.terminal:
                out.append(f"batch job {job_id} never ended ({state.value})")
                continue
            record = self.store.job(job_id)
            assert record is not None
            spec = record.spec
            for dep in spec.dependencies:
                out.extend(self._dependency_problems(job_id, state, dep, states, first_launch))
            for task in self.store.tasks_of(job_id):
                attempts = self.launches.get((job_id, task.index), [])
                most = spec.retries + 1 + self.workload.core.max_losses
                if len(attempts) > most:
                    out.append(
                        f"batch task {job_id}.{task.index} ran {len(attempts)} attempts, "
                        f"more than {spec.retries} retries and the losses allow"
                    )
                if task.state is TaskState.COMPLETED:
                    heard = self.tasks.get(TaskID(task.task_id))
                    last = last_word(heard) if heard is not None else None
                    if last is not AgoraState.FINISHED:
                        out.append(
                            f"batch task {job_id}.{task.index} COMPLETED but its last attempt "
                            f"{task.task_id} was heard {last.name if last else 'never'}"
                        )
        return out

    def _dependency_problems(
        self,
        job_id: int,
        state: JobState,
        dep: Dependency,
        states: dict[int, JobState],
        first_launch: dict[int, float],
    ) -> list[str]:
        dep_state = states[dep.job_id]
        met = (
            dep_state is JobState.COMPLETED
            if dep.kind is DepKind.AFTEROK
            else dep_state.terminal and dep_state is not JobState.COMPLETED
            if dep.kind is DepKind.AFTERNOTOK
            else dep_state.terminal
        )
        started = job_id in first_launch
        if started and not met:
            return [f"batch job {job_id} ran though {dep} ended {dep_state.value}"]
        if not started and not met:
            record = self.store.job(job_id)
            never = record is not None and record.reason.startswith("DependencyNeverSatisfied")
            if not (state is JobState.FAILED and never) and state is not JobState.CANCELLED:
                return [f"batch job {job_id} ended {state.value} though {dep} was never met"]
        if started:
            dep_record = self.store.job(dep.job_id)
            ended = dep_record.end_time if dep_record is not None else None
            if ended is None or first_launch[job_id] < ended:
                return [f"batch job {job_id} started before {dep} ended"]
        return []


def _parse(task_id: str) -> tuple[int, int, int]:
    """``batch-{job}.{index}-{attempt}`` -> (job, index, attempt)."""
    body = task_id.removeprefix("batch-")
    head, attempt = body.rsplit("-", 1)
    job, index = head.split(".")
    return int(job), int(index), int(attempt)
