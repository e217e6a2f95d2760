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

from agora.sdk.executor.driver import (
    DEFAULT_RECOVERY_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE_PERIOD,
    EXECUTOR_ENV_VARS,
    ExecutorDriver,
    ExecutorEnvironment,
    run_executor,
)
from agora.sdk.executor.executor import Executor
from agora.sdk.executor.output import (
    MAX_OUTPUT_CHUNK,
    OUTPUT_LABEL,
    OUTPUT_STREAMS,
    decode_output,
    decode_output_at,
    encode_output,
)

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
