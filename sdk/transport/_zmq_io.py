"""asyncio plumbing for a plain zmq socket: no Future or Task per message.

A message is sent or received with a non-blocking call straight away; only when that would block
does the caller wait, on a future woken from the socket's FD (``loop.add_reader``). ZeroMQ's FD is
edge-like: any operation on the socket may consume the signal, so after each one we re-check
``ZMQ_EVENTS`` on behalf of whoever waits (as pyzmq's own asyncio layer does).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, cast

import zmq
import zmq.asyncio
from agora.sdk.codec import MAX_FRAME_BYTES
from agora.sdk.transport.base import TransportClosed

DEFAULT_HWM: Final = 100_000
# libzmq drops the connection of a peer that sends a frame larger than this. It is a little above
# MAX_FRAME_BYTES so that a frame just too large still arrives and is reported as a bad frame
# (Received.error), which lets the daemon answer ERROR; anything bigger is cut off by libzmq.
ZMQ_MAX_MSG_SIZE: Final = MAX_FRAME_BYTES + 64 * 1024
HEARTBEAT_IVL_MS: Final = 2_000
HEARTBEAT_TIMEOUT_MS: Final = 10_000
HEARTBEAT_TTL_MS: Final = 10_000

_NOBLOCK: Final = int(zmq.NOBLOCK)
_MORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)
_EVENTS: Final = int(zmq.EVENTS)

Parts = list[bytes] | list[zmq.Frame]


def make_context(
    context: zmq.asyncio.Context | None, io_threads: int = 1
) -> tuple[zmq.asyncio.Context, bool]:
    """The context to use and whether the transport owns (and must terminate) it; a context made
    here has ``io_threads`` libzmq I/O threads."""
    if context is None:
        return zmq.asyncio.Context(io_threads=io_threads), True
    if not isinstance(context, zmq.asyncio.Context):
        raise TypeError(f"context must be a zmq.asyncio.Context, not {type(context).__name__}")
    return context, False


def new_socket(context: zmq.asyncio.Context, kind: int, hwm: int) -> zmq.Socket[bytes]:
    """A plain (non-asyncio) socket with the options both sides share."""
    factory = cast(Any, context)  # the stubs only know asyncio sockets for this context
    sock: zmq.Socket[bytes] = factory.socket(kind, socket_class=zmq.Socket)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, ZMQ_MAX_MSG_SIZE)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TTL_MS)
    return sock


class SocketIO:
    """Non-blocking send/recv on ``sock`` plus awaitable waits for readiness."""

    def __init__(self, sock: zmq.Socket[bytes], what: str) -> None:
        self.sock = sock
        self._what = what
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._readers: list[asyncio.Future[None]] = []
        self._writers: list[asyncio.Future[None]] = []
        self.closed: bool = False

    def _check(self) -> None:
        if self.closed:
            raise TransportClosed(f"{self._what} is closed")

    def _on_fd(self) -> None:
        if self.closed:
            return
        events = cast(int, self.sock.getsockopt(_EVENTS))  # also re-arms the FD
        if events & _POLLIN:
            _release(self._readers)
        if events & _POLLOUT:
            _release(self._writers)

    async def _wait(self, waiters: list[asyncio.Future[None]]) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._on_fd)
        future = self._loop.create_future()
        waiters.append(future)
        try:
            await future
        finally:
            if future in waiters:
                waiters.remove(future)

    def recv_nowait(self, copy: bool = True) -> Any:
        self._check()
        try:
            parts = self.sock.recv_multipart(_NOBLOCK, copy=copy)
        except zmq.Again:
            return None
        finally:
            if self._writers:
                self._on_fd()
        return parts

    async def recv(self, copy: bool = True) -> Any:
        while (parts := self.recv_nowait(copy)) is None:
            await self._wait(self._readers)
        return parts

    def send_nowait(
        self, head: bytes, body: bytes | None = None, tail: bytes | None = None
    ) -> bool:
        """Send one, two or three frames; False when it would block (high-water mark)."""
        self._check()
        try:
            if body is None:
                self.sock.send(head, _NOBLOCK)
            elif tail is None:
                self.sock.send(head, _MORE)
                self.sock.send(body, _NOBLOCK)
            else:  # a ROUTER's first frame decides: the others then cannot block
                self.sock.send(head, _MORE)
                self.sock.send(body, _MORE)
                self.sock.send(tail, _NOBLOCK)
        except zmq.Again:
            return False
        finally:
            if self._readers:
                self._on_fd()
        return True

    async def send(self, head: bytes) -> None:
        """Send one frame, waiting while the queue is at its high-water mark."""
        while not self.send_nowait(head):
            await self._wait(self._writers)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        error = TransportClosed(f"{self._what} is closed")
        for future in (*self._readers, *self._writers):
            if not future.done():
                future.set_exception(error)
        self.sock.close(linger=0)


def _release(waiters: list[asyncio.Future[None]]) -> None:
    for future in waiters:
        if not future.done():
            future.set_result(None)
