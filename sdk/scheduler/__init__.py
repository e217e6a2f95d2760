"""The scheduler SDK: write a :class:`Scheduler`, describe tasks as :class:`TaskSpec`, run it
with the asyncio :class:`SchedulerDriver` or the thread-backed :class:`BlockingSchedulerDriver`.
"""

from __future__ import annotations

from agora.sdk._lean import import_structlog_without_rich

import_structlog_without_rich()  # before the drivers import structlog: see agora.sdk._lean

from agora.sdk.scheduler.blocking import BlockingSchedulerDriver  # noqa: E402
from agora.sdk.scheduler.calls import SchedulerCalls  # noqa: E402
from agora.sdk.scheduler.driver import DriverError, SchedulerDriver  # noqa: E402
from agora.sdk.scheduler.scheduler import Scheduler  # noqa: E402
from agora.sdk.scheduler.spec import TaskSpec, default_executor, fit_resources  # noqa: E402

__all__ = [
    "BlockingSchedulerDriver",
    "DriverError",
    "Scheduler",
    "SchedulerCalls",
    "SchedulerDriver",
    "TaskSpec",
    "default_executor",
    "fit_resources",
]
