"""The scheduler SDK: write a :class:`Scheduler`, describe tasks as :class:`TaskSpec`, run it
with the asyncio :class:`SchedulerDriver` or the thread-backed :class:`BlockingSchedulerDriver`.
"""

from __future__ import annotations

from agora.sdk.scheduler.blocking import BlockingSchedulerDriver
from agora.sdk.scheduler.driver import DriverError, SchedulerDriver
from agora.sdk.scheduler.scheduler import Scheduler
from agora.sdk.scheduler.spec import TaskSpec, default_executor, fit_resources

__all__ = [
    "BlockingSchedulerDriver",
    "DriverError",
    "Scheduler",
    "SchedulerDriver",
    "TaskSpec",
    "default_executor",
    "fit_resources",
]
