"""The operator client: read the master's state, kill a task on an operator's word.

Each call opens its own short-lived connection, so a client object is cheap, holds no socket
between calls and may be used from any event loop (or from plain code via the ``*_sync``
wrappers, which must not be called from a running event loop)::

    client = OperatorClient(master_address(None))
    state = client.get_state_sync()
    client.kill_sync("task-7")
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from agora.sdk.discovery import parse_masters
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import Error, ErrorCode, Message
from agora.sdk.messages.operator import GetState, OperatorKill, StateReply
from agora.sdk.transport import MasterLink

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["DEFAULT_TIMEOUT", "OperatorClient", "OperatorError"]

DEFAULT_TIMEOUT = 5.0


class OperatorError(RuntimeError):
    """The master refused an operator call (unknown task, forbidden, ...)."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


class OperatorClient:
    """Operator calls to the master at ``master`` (``curve``: credentials when CURVE is on)."""

    def __init__(self, master: str, *, curve: CurveClient | None = None) -> None:
        self.master = master
        self._curve = curve

    async def get_state(self, timeout: float = DEFAULT_TIMEOUT) -> StateReply:
        """A snapshot of agents, frameworks and tasks. TimeoutError when the master is silent."""
        return await self._exchange((GetState(),), timeout)

    async def kill(
        self,
        task_id: TaskID | str,
        framework_id: FrameworkID | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Kill a live task as if its framework asked (``framework_id`` disambiguates).

        Returns once the master has taken the call (the task's end arrives to its framework
        as usual); raises OperatorError when the master refuses it (e.g. UNKNOWN_TASK).
        """
        fid = FrameworkID(framework_id) if framework_id is not None else None
        # The master answers OPERATOR_KILL only when it refuses; the GET_STATE behind it on the
        # same connection is answered after it, so its reply proves the kill was taken.
        await self._exchange(
            (OperatorKill(task_id=TaskID(task_id), framework_id=fid), GetState()), timeout
        )

    def get_state_sync(self, timeout: float = DEFAULT_TIMEOUT) -> StateReply:
        _no_running_loop("get_state_sync")
        return asyncio.run(self.get_state(timeout))

    def kill_sync(
        self,
        task_id: TaskID | str,
        framework_id: FrameworkID | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        _no_running_loop("kill_sync")
        asyncio.run(self.kill(task_id, framework_id, timeout))

    async def _exchange(self, messages: tuple[Message, ...], timeout: float) -> StateReply:
        """Send ``messages``; the first ERROR raises, else the first STATE is the answer."""
        client = MasterLink.connect(parse_masters(self.master), curve=self._curve)
        deadline = time.monotonic() + timeout
        try:
            try:
                await client.wait_leader(timeout)
            except TimeoutError:
                why = client.handshake_error
                detail = f" ({why})" if why else " (no master says it leads)"
                raise TimeoutError(
                    f"no answer from the master at {self.master} in {timeout}s{detail}"
                ) from None
            for message in messages:
                await client.send(message)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer from the master at {self.master} in {timeout}s")
                try:
                    async with asyncio.timeout(left):
                        received = await client.recv()
                except TimeoutError:
                    why = client.handshake_error
                    detail = f" ({why})" if why else ""
                    raise TimeoutError(
                        f"no answer from the master at {self.master} in {timeout}s{detail}"
                    ) from None
                reply = received.message
                if isinstance(reply, Error):
                    raise OperatorError(reply.message, reply.code)
                if isinstance(reply, StateReply):
                    return reply
                # anything else (a master HEARTBEAT, say) is not an answer: keep waiting
        finally:
            client.close()


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"OperatorClient.{name} blocks: inside an event loop, await the async call")
