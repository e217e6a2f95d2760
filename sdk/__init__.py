"""Agora's public contract: resources, messages and codec, transport, drivers, CLI.

The names below are imported lazily (on first use), so ``import agora.sdk`` stays cheap for
code that only needs one sub-module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
    from agora.sdk.messages import (
        Filters,
        FrameworkInfo,
        Offer,
        TaskState,
        TaskStatus,
        is_terminal,
    )
    from agora.sdk.resources import Resources
    from agora.sdk.scheduler import (
        BlockingSchedulerDriver,
        DriverError,
        Scheduler,
        SchedulerCalls,
        SchedulerDriver,
        TaskSpec,
        default_executor,
    )

_LAZY: dict[str, str] = {
    "Scheduler": "agora.sdk.scheduler",
    "SchedulerDriver": "agora.sdk.scheduler",
    "SchedulerCalls": "agora.sdk.scheduler",
    "BlockingSchedulerDriver": "agora.sdk.scheduler",
    "DriverError": "agora.sdk.scheduler",
    "TaskSpec": "agora.sdk.scheduler",
    "default_executor": "agora.sdk.scheduler",
    "FrameworkInfo": "agora.sdk.messages",
    "TaskState": "agora.sdk.messages",
    "TaskStatus": "agora.sdk.messages",
    "Offer": "agora.sdk.messages",
    "Filters": "agora.sdk.messages",
    "is_terminal": "agora.sdk.messages",
    "Resources": "agora.sdk.resources",
    "AgentID": "agora.sdk.ids",
    "ExecutorID": "agora.sdk.ids",
    "FrameworkID": "agora.sdk.ids",
    "OfferID": "agora.sdk.ids",
    "TaskID": "agora.sdk.ids",
}

__all__ = [
    "AgentID",
    "BlockingSchedulerDriver",
    "DriverError",
    "ExecutorID",
    "Filters",
    "FrameworkID",
    "FrameworkInfo",
    "Offer",
    "OfferID",
    "Resources",
    "Scheduler",
    "SchedulerCalls",
    "SchedulerDriver",
    "TaskID",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "default_executor",
    "is_terminal",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agora.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
