"""The ROUTER side over ZeroMQ: one socket, many peers, single-frame messages.

A relay (``agora-relay``) carries many agents over one connection: its frames come as
``[agent's routing id, agent's principal, frame]`` and go back as ``[agent's routing id, frame]``;
each agent behind it is a peer of its own (``Received.relay`` says by which relay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import structlog
import zmq
import zmq.asyncio
from agora.sdk.codec import encode
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Message
from agora.sdk.transport._zmq_io import (
    DEFAULT_HWM,
    ZMQ_MAX_MSG_SIZE,
    SocketIO,
    make_context,
    new_socket,
)
from agora.sdk.transport.base import RELAY_SEP, Received, TransportClosed, decode_received

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveServer
    from zmq.auth.asyncio import AsyncioAuthenticator

__all__ = ["DEFAULT_HWM", "ZMQ_MAX_MSG_SIZE", "ZmqServer"]

log = structlog.get_logger(__name__)

#: Connections the kernel queues for the ROUTER to accept (capped by net.core.somaxconn).
LISTEN_BACKLOG: Final = 4096
#: The longest routing id ZeroMQ makes or accepts, and the longest principal a relay may report.
MAX_ROUTING_ID: Final = 255


class ZmqServer:
    """A bound ROUTER socket (ROUTER_MANDATORY: a send to a gone peer returns False).

    Create with :meth:`bind`. With CURVE it must be created from a coroutine (the ZAP handler
    runs on the event loop); every call must come from that same loop.
    """

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        context: zmq.asyncio.Context,
        owns_context: bool,
        authenticator: AsyncioAuthenticator | None,
    ) -> None:
        self.endpoint: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._io = SocketIO(sock, f"server {self.endpoint}")
        self._context = context
        self._owns_context = owns_context
        self._auth = authenticator
        self._curve = authenticator is not None

    @classmethod
    def bind(
        cls,
        endpoint: str,
        *,
        curve: CurveServer | None = None,
        context: zmq.asyncio.Context | None = None,
        hwm: int = DEFAULT_HWM,
        io_threads: int = 1,
    ) -> ZmqServer:
        """Bind a ROUTER to ``endpoint`` (``tcp://127.0.0.1:0`` picks a free port; read the real
        one from :attr:`endpoint`). With ``curve``, a ZAP handler admits only authorized keys.
        ``io_threads``: libzmq I/O threads of the context made here (not of ``context``)."""
        ctx, owned = make_context(context, io_threads)
        auth = None
        sock = None
        try:
            if curve is not None:
                auth = curve.start_authenticator(ctx)
            sock = new_socket(ctx, zmq.ROUTER, hwm)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            # Thousands of agents reconnect at once when a new leader is elected: libzmq's
            # default of 100 pending connections would drop their SYNs (back in 1 s, then 3 s).
            sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
            if curve is not None:
                curve.configure_socket(sock)
            sock.bind(endpoint)
            server = cls(sock, ctx, owned, auth)
        except BaseException:
            if sock is not None:
                sock.close(linger=0)
            if auth is not None:
                auth.stop()
            if owned:
                ctx.destroy(linger=0)
            raise
        log.debug("transport_bound", endpoint=server.endpoint, curve=curve is not None)
        return server

    @property
    def closed(self) -> bool:
        return self._io.closed

    def recv_nowait(self) -> Received | None:
        parts = self._io.recv_nowait(copy=not self._curve)
        return None if parts is None else self._received(parts)

    async def recv(self) -> Received:
        return self._received(await self._io.recv(copy=not self._curve))

    def _received(self, parts: list[bytes] | list[zmq.Frame]) -> Received:
        principal: str | None = None
        head, body = parts[0], parts[-1]
        if isinstance(head, zmq.Frame):
            peer = head.bytes.hex()
            principal = _user_id(body)
        else:
            peer = head.hex()
        if len(parts) == 4:
            return self._relayed(peer, parts, principal)
        if len(parts) != 2:
            error = ProtocolError(f"expected a single-frame message, got {len(parts) - 1} frames")
            return Received(peer, None, 0, error, principal)
        data = body.buffer if isinstance(body, zmq.Frame) else body
        return decode_received(peer, data, principal)

    def _relayed(
        self, relay_peer: str, parts: list[bytes] | list[zmq.Frame], relay: str | None
    ) -> Received:
        """A relay's frame: [relay's routing id, agent's routing id, agent's principal, frame].
        CURVE off: the principal frame is ignored (every principal is None then)."""
        agent, said = (p.bytes if isinstance(p, zmq.Frame) else p for p in parts[1:3])
        body = parts[3]
        relay = (relay or "") if self._curve else ""  # never None: that would mean "direct"
        if not 0 < len(agent) <= MAX_ROUTING_ID or len(said) > MAX_ROUTING_ID:
            error = ProtocolError("a relayed frame needs a routing id and a principal of <= 255 B")
            return Received(relay_peer, None, 0, error, relay, relay)
        principal: str | None = None
        if self._curve and said:
            try:
                principal = said.decode()
            except UnicodeDecodeError:
                error = ProtocolError("a relayed frame's principal is not UTF-8")
                return Received(relay_peer, None, 0, error, relay, relay)
        peer = f"{relay_peer}{RELAY_SEP}{agent.hex()}"
        data = body.buffer if isinstance(body, zmq.Frame) else body
        return decode_received(peer, data, principal, relay)

    async def send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        """Queue ``message`` to ``peer``; False when the peer is unknown or gone, or when its
        queue is at the high-water mark (the message is dropped: never blocks on one peer)."""
        return self.try_send(peer, message, epoch)

    def try_send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        """:meth:`send`, callable outside a coroutine (it never waits anyway)."""
        frame = encode(message, epoch=epoch)
        relay, _, agent = peer.partition(RELAY_SEP)
        try:
            routing_id = bytes.fromhex(relay)
            behind = bytes.fromhex(agent) if agent else None
        except ValueError:
            if self._io.closed:
                raise TransportClosed(f"server {self.endpoint} is closed") from None
            return False
        try:
            sent = (
                self._io.send_nowait(routing_id, frame)
                if behind is None
                else self._io.send_nowait(routing_id, behind, frame)
            )
            if sent:
                return True
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise
        log.warning("transport_peer_backlogged", peer=peer, endpoint=self.endpoint)
        return False

    def close(self) -> None:
        if self._io.closed:
            return
        self._io.close()
        if self._auth is not None:
            self._auth.stop()
        if self._owns_context:
            self._context.destroy(linger=0)


def _user_id(frame: bytes | zmq.Frame) -> str | None:
    if not isinstance(frame, zmq.Frame):
        return None
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return user_id if isinstance(user_id, str) and user_id else None
