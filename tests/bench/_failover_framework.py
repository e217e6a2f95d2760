"""The failover bench's framework: keeps a few ``sleep 3600`` tasks and notes every offer's epoch.

Offers it does not need go back at once with no filter, so the master offers again every
allocation round: the first offer of a new epoch then shows when the new leader allocates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agora.sdk import (
    Filters,
    FrameworkInfo,
    Offer,
    Resources,
    Scheduler,
    SchedulerDriver,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from agora.sdk.messages import is_terminal

SHAPE = Resources.parse("cpus:0.1;mem:16")
NO_FILTER = Filters(refuse_seconds=0)


class FailoverFramework(Scheduler):
    """Keeps ``tasks`` long-running tasks alive; ``offer_times`` are (perf_counter, epoch)."""

    def __init__(self, tasks: int) -> None:
        self.wanted = tasks
        self.live: set[str] = set()  # launched, not ended
        self.running: set[str] = set()
        self.launched = 0
        self.offer_times: list[tuple[float, int]] = []
        self.ended: list[tuple[str, str]] = []
        self.resubscribed: list[float] = []  # perf_counter times of SUBSCRIBED after the first

    def reregistered(self, driver: Any, master_info: Any) -> None:
        self.resubscribed.append(time.perf_counter())

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        now = time.perf_counter()
        info = driver.master_info
        epoch = info.epoch if info is not None else 0
        self.offer_times.append((now, epoch))
        for offer in offers:
            if len(self.live) < self.wanted and offer.resources.fits(SHAPE):
                name = f"sleeper-{self.launched}"
                self.launched += 1
                self.live.add(name)
                driver.launch(offer, [TaskSpec(name, "sleep 3600", SHAPE)], filters=NO_FILTER)
            else:
                driver.decline(offer.offer_id, filters=NO_FILTER)

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        name = str(status.task_id)
        if status.state is TaskState.RUNNING:
            self.running.add(name)
        elif is_terminal(status.state) or status.state is TaskState.LOST:
            self.live.discard(name)
            self.running.discard(name)
            self.ended.append((name, status.state.name))

    def first_offer_after(self, at: float, epoch: int) -> float | None:
        """perf_counter time of the first offer received after ``at`` at an epoch >= ``epoch``."""
        for when, offer_epoch in self.offer_times:
            if when > at and offer_epoch >= epoch:
                return when
        return None

    def resubscribed_after(self, at: float) -> float | None:
        """perf_counter time of the first re-subscription after ``at``."""
        return next((when for when in self.resubscribed if when > at), None)


async def start_failover_framework(
    masters: str, agents: int, check_alive: Callable[[], None], timeout: float
) -> tuple[FailoverFramework, SchedulerDriver, asyncio.Task[None]]:
    """Subscribe the bench framework to ``masters`` and wait until its tasks (one per agent, at
    most 5) run; the caller stops the driver and awaits the runner."""
    framework = FailoverFramework(tasks=min(agents, 5))
    info = FrameworkInfo(name="failover-bench", failover_timeout=3600.0)
    driver = SchedulerDriver(framework, info, masters)
    runner = asyncio.create_task(driver.run())
    deadline = time.perf_counter() + timeout
    while len(framework.running) < framework.wanted:
        check_alive()
        if time.perf_counter() > deadline or runner.done():
            driver.stop()
            raise TimeoutError(f"tasks running: {len(framework.running)}")
        await asyncio.sleep(0.05)
    return framework, driver, runner


async def wait_for_framework(
    found: Callable[[], float | None], runner: asyncio.Task[None], deadline: float, what: str
) -> float:
    """Poll ``found`` (a perf_counter time, or None) until it has one; RuntimeError if the
    driver stops first, TimeoutError with ``what`` at ``deadline``."""
    while (at := found()) is None:
        if runner.done():
            raise RuntimeError("the framework's driver stopped")
        if time.perf_counter() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)
    return at
