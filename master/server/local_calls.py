"""Calls made to the master in-process (the operator HTTP API), as if sent over its socket.

Each call gets a peer name of its own (:data:`LOCAL_PEER` + n) and goes through the same ACL and
the same core, in order with everything else; the core's first answer to that peer is handed to
the waiting caller instead of sent (:meth:`LocalCalls.answer`, from the outbox). A call is made
only while this master may act; it is handled to the end even if its caller gives up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

from agora.sdk.messages import Message
from agora.sdk.transport import Received

__all__ = ["LOCAL_PEER", "LocalCalls", "NotActing"]

#: Peer names of calls made in-process: answers to them are handed back, not sent. ZeroMQ peers
#: are hex routing ids, so they never start with this.
LOCAL_PEER: Final = "local:"


class NotActing(RuntimeError):
    """This master cannot act on a call now: it stands by, or its leader lease lapsed."""


class LocalCalls:
    """The in-process callers waiting for the core's answer, by peer name."""

    def __init__(
        self,
        *,
        acting: Callable[[], bool],
        handle: Callable[[Received, Message], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        """``acting``: whether this master may act on a call now. ``handle``: the daemon's path
        for a client message (ACL, core, send). ``spawn``: runs a task the daemon cancels as it
        stops."""
        self._acting = acting
        self._handle = handle
        self._spawn = spawn
        self._waiting: dict[str, asyncio.Future[Message]] = {}
        self._made = 0

    async def call(self, message: Message, principal: str | None, timeout: float) -> Message:
        """Make a call as if ``principal`` had sent ``message`` over the socket; the core's first
        answer (OPERATOR_DONE, STATE or ERROR). NotActing when this master cannot act now;
        TimeoutError when no answer came in ``timeout`` (a registry change may still take
        effect)."""
        if not self._acting():
            raise NotActing("this master is not acting as the leader now")
        self._made += 1
        peer = f"{LOCAL_PEER}{self._made}"
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[peer] = answer
        # Handled to the end even if the caller gives up (timeout, client gone): a call cut off
        # half-way through sending its actions would leave the core's word half-spoken.
        handled = self._spawn(
            self._handle_local(Received(peer, message, 0, None, principal), answer),
            "master-operator-call",
        )
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(handled)
                return await answer
        finally:
            del self._waiting[peer]

    async def submit(
        self, peer: str, message: Message, principal: str | None, timeout: float
    ) -> None:
        """Hand ``message`` to the core as if ``peer`` had sent it (a long-lived in-process peer,
        such as an HTTP scheduler's stream, whose answers go elsewhere): returns once the core
        has taken it. NotActing and TimeoutError as for :meth:`call`."""
        if not self._acting():
            raise NotActing("this master is not acting as the leader now")
        handled = self._spawn(
            self._handle_local(Received(peer, message, 0, None, principal), None),
            "master-stream-call",
        )
        async with asyncio.timeout(timeout):
            await asyncio.shield(handled)

    def answer(self, peer: str, message: Message) -> None:
        """The core answered ``peer`` (a :data:`LOCAL_PEER` name): hand it to its caller, if it
        still waits."""
        answer = self._waiting.get(peer)
        if answer is not None and not answer.done():
            answer.set_result(message)

    async def _handle_local(
        self, received: Received, answer: asyncio.Future[Message] | None
    ) -> None:
        # Checked again as the task starts: the lead or the lease may have gone meanwhile, and
        # nothing may be acted on then (the socket path holds such messages instead).
        if not self._acting():
            not_acting = NotActing("this master is not acting as the leader now")
            if answer is None:
                raise not_acting
            if received.peer in self._waiting and not answer.done():  # (its caller still waits)
                answer.set_exception(not_acting)
            return
        assert received.message is not None
        await self._handle(received, received.message)
