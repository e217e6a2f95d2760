"""The callbacks an executor implements; the driver calls them from its event loop."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from agora.sdk.ids import TaskID
from agora.sdk.messages import AgentInfo, ExecutorInfo, FrameworkInfo, TaskGroupInfo, TaskInfo

if TYPE_CHECKING:
    from agora.sdk.executor.driver import ExecutorDriver

__all__ = ["Executor"]


class Executor:
    """Override what you need. Every method may be a plain method or an ``async def``.

    Plain methods run inline in the driver's loop and must not block. Coroutines run as tasks of
    their own (so a slow ``launch_task`` does not hold up the next message), except ``shutdown``,
    which the driver awaits before it stops. An exception from a callback is logged; it does not
    stop the driver.
    """

    def registered(
        self,
        driver: ExecutorDriver,
        executor_info: ExecutorInfo,
        framework_info: FrameworkInfo,
        agent_info: AgentInfo,
    ) -> Awaitable[None] | None:
        """The agent accepted this executor (first registration)."""
        return None

    def reregistered(self, driver: ExecutorDriver, agent_info: AgentInfo) -> Awaitable[None] | None:
        """The agent accepted this executor again after the link came back."""
        return None

    def disconnected(self, driver: ExecutorDriver) -> Awaitable[None] | None:
        """The link to the agent dropped; the driver reconnects and re-registers on its own."""
        return None

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> Awaitable[None] | None:
        """Start ``task`` and report its states with ``driver.send_status_update``."""
        return None

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> Awaitable[None] | None:
        """Start every task of ``group`` together."""
        return None

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> Awaitable[None] | None:
        """Kill ``task_id`` and report TASK_KILLED."""
        return None

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> Awaitable[None] | None:
        """``data`` sent by the framework's scheduler."""
        return None

    def acknowledged(
        self, driver: ExecutorDriver, task_id: TaskID, uuid: bytes
    ) -> Awaitable[None] | None:
        """The framework acknowledged the update ``uuid`` of ``task_id``: it is not sent again."""
        return None

    def shutdown(self, driver: ExecutorDriver) -> Awaitable[None] | None:
        """Kill every task (reporting their terminal states); the driver stops afterwards."""
        return None

    def error(self, driver: ExecutorDriver, message: str) -> Awaitable[None] | None:
        """Something went wrong that the executor may want to know (e.g. a bad frame)."""
        return None
