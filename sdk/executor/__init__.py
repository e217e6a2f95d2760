"""Write an executor: the :class:`Executor` callbacks, the :class:`ExecutorDriver` that runs them
against the agent, and the streamed-output payload format (:data:`OUTPUT_LABEL`,
:func:`decode_output`) that frameworks read.

A minimal executor::

    from agora.sdk.executor import Executor, run_executor
    from agora.sdk.messages import TaskState, TaskStatus, StatusSource

    class Hello(Executor):
        def launch_task(self, driver, task):
            driver.send_status_update(
                TaskStatus(task_id=task.task_id, state=TaskState.FINISHED,
                           source=StatusSource.EXECUTOR)
            )

    if __name__ == "__main__":
        run_executor(Hello())
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agora.sdk.executor.driver import ExecutorDriver, run_executor
    from agora.sdk.executor.environment import (
        DEFAULT_RECOVERY_TIMEOUT,
        DEFAULT_SHUTDOWN_GRACE_PERIOD,
        EXECUTOR_ENV_VARS,
        ExecutorEnvironment,
    )
    from agora.sdk.executor.executor import Executor

# The output format is light and read by every framework that streams output; the driver (and
# its transport) loads on first use of one of its names, the environment contract on its own.
from agora.sdk.executor.output import (
    MAX_OUTPUT_CHUNK,
    OUTPUT_LABEL,
    OUTPUT_STREAMS,
    decode_output,
    decode_output_at,
    encode_output,
)

_LAZY: dict[str, str] = {
    "DEFAULT_RECOVERY_TIMEOUT": "agora.sdk.executor.environment",
    "DEFAULT_SHUTDOWN_GRACE_PERIOD": "agora.sdk.executor.environment",
    "EXECUTOR_ENV_VARS": "agora.sdk.executor.environment",
    "ExecutorDriver": "agora.sdk.executor.driver",
    "ExecutorEnvironment": "agora.sdk.executor.environment",
    "run_executor": "agora.sdk.executor.driver",
    "Executor": "agora.sdk.executor.executor",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_RECOVERY_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE_PERIOD",
    "EXECUTOR_ENV_VARS",
    "MAX_OUTPUT_CHUNK",
    "OUTPUT_LABEL",
    "OUTPUT_STREAMS",
    "Executor",
    "ExecutorDriver",
    "ExecutorEnvironment",
    "decode_output",
    "decode_output_at",
    "encode_output",
    "run_executor",
]
