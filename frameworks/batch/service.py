"""The batch service: the scheduling core, the job store and an SDK driver, wired together.

Every event (offers, a status update, a submission, a cancellation, a tick) goes to the core;
the actions it returns wait in a queue. Once per burst of events, :meth:`BatchService.flush`
commits every record the core changed in one SQLite transaction, and only then sends the
actions and the acknowledgements of the updates handled: nothing is launched that the store does
not know, and nothing is acknowledged that the store has not recorded. After a crash, the store
says which attempts were launched; the master, asked to reconcile them, says what became of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
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
from agora.frameworks.batch.core import BatchCore
from agora.frameworks.batch.records import JobRecord, TaskRecord
from agora.frameworks.batch.spec import JobSpec
from agora.frameworks.batch.store import JobStore
from agora.sdk.ids import AgentID, GangID, TaskID
from agora.sdk.messages import (
    Filters,
    MasterInfo,
    Offer,
    ReconcileTask,
    TaskStatus,
)
from agora.sdk.messages import (
    Launch as LaunchOp,
)
from agora.sdk.scheduler import SchedulerDriver
from agora.sdk.scheduler.scheduler import Scheduler

__all__ = ["BatchService"]

log = structlog.get_logger(__name__)

#: Flush at once when this many records wait (a flood of updates must not grow without bound).
FLUSH_AT = 2000
#: Group commit: at most one commit (one fsync) per this many seconds while events pour in.
FLUSH_INTERVAL = 0.01


class BatchService(Scheduler):
    """The framework scheduler of the batch service (its driver is attached after creation)."""

    def __init__(
        self, core: BatchCore, store: JobStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.core = core
        self.store = store
        self.clock = clock
        self.driver: SchedulerDriver | None = None
        self._actions: list[Action] = []
        self._acks: list[TaskStatus] = []
        self._flush_handle: asyncio.Handle | None = None
        self._last_flush = 0.0
        self.failed: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None

    # ------------------------------------------------------------------ driver callbacks

    def registered(self, driver: Any, framework_id: Any, master_info: MasterInfo) -> None:
        self.store.set_meta("framework_id", str(framework_id))
        log.info("batch_registered", framework_id=framework_id, master=master_info.address)
        self._do(self.core.registered(self.clock()))

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        log.info("batch_reregistered", master=master_info.address)
        self._do(self.core.registered(self.clock()))

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        self._do(self.core.offers(offers, self.clock()))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        self._do(self.core.status(status, self.clock()))
        if status.uuid is not None and status.agent_id is not None:
            self._acks.append(status)
            self._schedule()

    def gang_expired(self, driver: Any, gang_id: GangID, message: str) -> None:
        self._do(self.core.gang_expired(gang_id, self.clock()))

    def error(self, driver: Any, message: str) -> None:
        log.warning("batch_master_error", error=message)

    # ------------------------------------------------------------------ user requests

    def submit(
        self, spec: JobSpec, *, submitter: str = "", submit_uid: int | None = None
    ) -> tuple[JobRecord, list[TaskRecord]]:
        """Queue a checked spec, to run as its user: durable in the store before this returns.
        ``submitter`` and ``submit_uid`` record who asked (see JobRecord)."""
        now = self.clock()
        job, tasks = self.store.add_job(spec, now, submitter=submitter, submit_uid=submit_uid)
        self._do(self.core.add_job(job, tasks, now))
        log.info(
            "batch_job_submitted",
            job_id=job.job_id,
            user=spec.user,
            submitter=submitter,
            submit_uid=submit_uid,
            tasks=len(tasks),
        )
        return job, tasks

    def cancel(self, job_id: int, index: int | None) -> int:
        count, actions = self.core.cancel(job_id, index, self.clock())
        self._do(actions)
        self.flush()
        log.info("batch_job_cancelled", job_id=job_id, index=index, tasks=count)
        return count

    def tick(self) -> None:
        self._do(self.core.tick(self.clock()))

    # ------------------------------------------------------------------ the commit point

    def _do(self, actions: Sequence[Action]) -> None:
        self._actions.extend(actions)
        self._schedule()

    def _schedule(self) -> None:
        if len(self._acks) + len(self._actions) >= FLUSH_AT:
            self.flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            wait = self._last_flush + FLUSH_INTERVAL - loop.time()
            if wait > 0:
                self._flush_handle = loop.call_later(wait, self.flush)
            else:
                self._flush_handle = loop.call_soon(self.flush)

    def flush(self) -> None:
        """Commit what changed, then act on it. A store that cannot commit stops the service:
        acting on what the store does not hold would break the exactly-once promise."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self.failed is not None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a direct call
            self._last_flush = asyncio.get_running_loop().time()
        try:
            jobs, tasks = self.core.take_dirty()
            usage = self.core.fairshare.take_changed(self.clock())
            if jobs or tasks or usage:
                self.store.save(jobs, tasks, usage)  # one transaction: one fsync per flush
        except Exception as exc:
            log.exception("batch_store_failed")
            self.failed = exc
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        actions, self._actions = self._actions, []
        acks, self._acks = self._acks, []
        driver = self.driver
        if driver is None:
            return
        for action in actions:
            self._send(driver, action)
        for status in acks:
            with contextlib.suppress(RuntimeError, ValueError):
                driver.acknowledge(status)

    def _send(self, driver: SchedulerDriver, action: Action) -> None:
        try:
            if isinstance(action, Launch):
                driver.accept(
                    list(action.offer_ids),
                    [LaunchOp(task_infos=action.tasks)],
                    Filters(refuse_seconds=action.refuse_seconds),
                )
            elif isinstance(action, Decline):
                driver.decline(
                    list(action.offer_ids), Filters(refuse_seconds=action.refuse_seconds)
                )
            elif isinstance(action, Kill):
                driver.kill(TaskID(action.task_id), AgentID(action.agent_id))
            elif isinstance(action, Reconcile):
                driver.reconcile(
                    [ReconcileTask(task_id=TaskID(t), agent_id=AgentID(a) if a else None)
                     for t, a in action.tasks]
                )  # fmt: skip
            elif isinstance(action, RequestGang):
                driver.request([action.request])
            elif isinstance(action, Revive):
                driver.revive()
            elif isinstance(action, Suppress):
                driver.suppress()
        except RuntimeError as exc:  # not subscribed (yet): registration reconciles and revives
            log.debug("batch_action_deferred", action=type(action).__name__, error=str(exc))
