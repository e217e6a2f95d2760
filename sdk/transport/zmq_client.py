"""The DEALER side over ZeroMQ: one link to a server, ZMQ's own reconnect, a socket monitor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import structlog
import zmq
import zmq.asyncio
from agora.sdk.codec import encode
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Message
from agora.sdk.transport._zmq_io import DEFAULT_HWM, SocketIO, make_context, new_socket
from agora.sdk.transport.base import Received, decode_received
from zmq.utils.monitor import parse_monitor_message

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["ZmqClient"]

log = structlog.get_logger(__name__)

RECONNECT_IVL_MS: Final = 100
RECONNECT_IVL_MAX_MS: Final = 5_000
_FAILED: Final[dict[int, str]] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "authentication failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol error",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
}
_MONITORED: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
Callback = Callable[[], None]


class ZmqClient:
    """A DEALER connected to one server. Create with :meth:`connect` from a coroutine.

    ``connected`` turns True on a completed ZMTP (and CURVE) handshake and False when the link
    drops; ``on_connected`` / ``on_disconnected`` run on those transitions, from the event loop.
    Sends queue while the link is down (IMMEDIATE off) and go out once ZMQ has reconnected; a
    send waits only when the queue is at its high-water mark. ``handshake_error`` says why the
    last handshake failed (e.g. "authentication failed": the server rejected our key).
    """

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        endpoint: str,
        context: zmq.asyncio.Context,
        owns_context: bool,
        on_connected: Callback | None,
        on_disconnected: Callback | None,
    ) -> None:
        self.endpoint = endpoint
        self._io = SocketIO(sock, f"client of {endpoint}")
        self._context = context
        self._owns_context = owns_context
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._connected = False
        self.handshake_error: str | None = None
        address = f"inproc://agora-monitor-{id(self):x}"
        sock.monitor(address, _MONITORED)
        self._monitor = context.socket(zmq.PAIR)
        self._monitor.connect(address)
        self._monitor_task = asyncio.get_running_loop().create_task(self._watch())

    @classmethod
    def connect(
        cls,
        endpoint: str,
        *,
        curve: CurveClient | None = None,
        context: zmq.asyncio.Context | None = None,
        on_connected: Callback | None = None,
        on_disconnected: Callback | None = None,
        hwm: int = DEFAULT_HWM,
        reconnect_max: float = RECONNECT_IVL_MAX_MS / 1000,
        immediate: bool = False,
    ) -> ZmqClient:
        """Connect a DEALER to ``endpoint``; must be called with a running event loop.

        While the server is unreachable ZeroMQ retries the connection after 0.1 s, doubling the
        wait up to ``reconnect_max`` seconds. With ``immediate``, nothing queues while the link
        is down: a send then fails as at the high-water mark (for senders that resend anyway, to
        whom a backlog of stale messages would arrive late)."""
        asyncio.get_running_loop()  # fail fast, before any socket exists
        ctx, owned = make_context(context)
        sock = None
        try:
            sock = new_socket(ctx, zmq.DEALER, hwm)
            sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(RECONNECT_IVL_MS, int(reconnect_max * 1000)))
            sock.setsockopt(zmq.IMMEDIATE, 1 if immediate else 0)
            if curve is not None:
                curve.configure_socket(sock)
            client = cls(sock, endpoint, ctx, owned, on_connected, on_disconnected)
            sock.connect(endpoint)
        except BaseException:
            if sock is not None:
                sock.close(linger=0)
            if owned:
                ctx.destroy(linger=0)
            raise
        return client

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def closed(self) -> bool:
        return self._io.closed

    def recv_nowait(self) -> Received | None:
        parts = self._io.recv_nowait()
        return None if parts is None else _received(parts)

    async def recv(self) -> Received:
        return _received(await self._io.recv())

    async def send(self, message: Message, epoch: int = 0) -> None:
        await self._io.send(encode(message, epoch=epoch))

    def try_send(self, message: Message, epoch: int = 0) -> bool:
        """Queue ``message`` without waiting; False (the message is dropped) when the queue is at
        its high-water mark. For senders that must never block and retry on their own (Raft).
        Raises :class:`ProtocolError` when ``message`` breaks its schema, :class:`TransportClosed`
        once closed."""
        return self._io.send_nowait(encode(message, epoch=epoch))

    async def _watch(self) -> None:
        while True:
            try:
                event = parse_monitor_message(await self._monitor.recv_multipart())
            except (asyncio.CancelledError, zmq.ZMQError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshake_error = None
                if not self._connected:
                    self._connected = True
                    log.debug("transport_connected", endpoint=self.endpoint)
                    self._call(self._on_connected)
            elif kind == zmq.EVENT_DISCONNECTED:
                if self._connected:
                    self._connected = False
                    log.debug("transport_disconnected", endpoint=self.endpoint)
                    self._call(self._on_disconnected)
            elif kind in _FAILED:
                self.handshake_error = _FAILED[kind]
                log.warning("transport_handshake_failed", endpoint=self.endpoint, why=_FAILED[kind])

    def _call(self, callback: Callback | None) -> None:
        if callback is None:
            return
        try:
            callback()
        except Exception:
            log.exception("transport_callback_failed", endpoint=self.endpoint)

    def close(self) -> None:
        if self._io.closed:
            return
        self._monitor_task.cancel()
        self._io.sock.disable_monitor()
        self._monitor.close(linger=0)
        self._io.close()
        if self._owns_context:
            self._context.destroy(linger=0)


def _received(parts: list[bytes]) -> Received:
    if len(parts) != 1:
        error = ProtocolError(f"expected a single-frame message, got {len(parts)} frames")
        return Received("", None, 0, error)
    return decode_received("", parts[0])
