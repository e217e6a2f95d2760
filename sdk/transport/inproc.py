"""In-process transport for tests: no sockets, but every message is really encoded and decoded.

``hub.server(name)`` binds a name, ``hub.client(name)`` connects to it (also before the server
exists: like ZeroMQ, the client waits and its sends queue). ``hub.disconnect(client)`` cuts a link
(the client's ``on_disconnected`` fires, the server forgets its peer id) and
``hub.reconnect(client)`` restores it under a new peer id, as a ZeroMQ reconnect would. Closing a
server disconnects its clients; a new server of the same name picks them up again. Connection
callbacks run from the event loop (``call_soon``) when one is running, else right away.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable

from agora.sdk.codec import encode
from agora.sdk.messages import Message
from agora.sdk.transport.base import Received, TransportClosed, decode_received

__all__ = ["InprocClient", "InprocHub", "InprocServer"]

Callback = Callable[[], None]


class _Inbox:
    """A FIFO of (peer, frame) with one async waiter; no task or future per message."""

    def __init__(self, what: str) -> None:
        self._items: deque[tuple[str, bytes, str | None]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._what = what
        self.closed = False

    def put(self, peer: str, frame: bytes, principal: str | None = None) -> None:
        self._items.append((peer, frame, principal))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> Received | None:
        if self.closed:
            raise TransportClosed(f"{self._what} is closed")
        if not self._items:
            return None
        return decode_received(*self._items.popleft())

    async def get(self) -> Received:
        while (received := self.get_nowait()) is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return received

    def close(self) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TransportClosed(f"{self._what} is closed"))


class InprocServer:
    """The ROUTER side of an :class:`InprocHub` name."""

    def __init__(self, hub: InprocHub, name: str) -> None:
        self._hub = hub
        self.name = name
        self.endpoint = f"inproc-hub://{name}"
        self._inbox = _Inbox(f"server {self.endpoint}")
        self._peers: dict[str, InprocClient] = {}

    @property
    def peers(self) -> frozenset[str]:
        """The peer ids currently connected."""
        return frozenset(self._peers)

    @property
    def closed(self) -> bool:
        return self._inbox.closed

    async def recv(self) -> Received:
        return await self._inbox.get()

    def recv_nowait(self) -> Received | None:
        return self._inbox.get_nowait()

    async def send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        return self.send_raw(peer, encode(message, epoch=epoch))

    def try_send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        return self.send_raw(peer, encode(message, epoch=epoch))

    def send_raw(self, peer: str, frame: bytes) -> bool:
        """Deliver an already-encoded (or deliberately broken) frame to ``peer``."""
        if self.closed:
            raise TransportClosed(f"server {self.endpoint} is closed")
        client = self._peers.get(peer)
        if client is None:
            return False
        client._inbox.put("", frame)
        return True

    def close(self) -> None:
        if self.closed:
            return
        self._inbox.close()
        self._hub._server_closed(self)


class InprocClient:
    """The DEALER side: a link to one :class:`InprocHub` name."""

    def __init__(
        self,
        hub: InprocHub,
        name: str,
        on_connected: Callback | None,
        on_disconnected: Callback | None,
        principal: str | None,
    ) -> None:
        self._hub = hub
        self.name = name
        self.endpoint = f"inproc-hub://{name}"
        self.principal = principal
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._inbox = _Inbox(f"client of {self.endpoint}")
        self._pending: deque[bytes] = deque()
        self.peer: str | None = None  # our id on the server while connected
        self.link_down = False  # cut by hub.disconnect(), until hub.reconnect()

    @property
    def connected(self) -> bool:
        return self.peer is not None

    @property
    def closed(self) -> bool:
        return self._inbox.closed

    async def recv(self) -> Received:
        return await self._inbox.get()

    def recv_nowait(self) -> Received | None:
        return self._inbox.get_nowait()

    async def send(self, message: Message, epoch: int = 0) -> None:
        self.send_raw(encode(message, epoch=epoch))

    def try_send(self, message: Message, epoch: int = 0) -> bool:
        """Send without waiting, as ``ZmqClient.try_send``; an in-process link never backs up."""
        self.send_raw(encode(message, epoch=epoch))
        return True

    def send_raw(self, frame: bytes) -> None:
        """Send an already-encoded (or deliberately broken) frame; queued while disconnected."""
        if self.closed:
            raise TransportClosed(f"client of {self.endpoint} is closed")
        server = self._hub._servers.get(self.name)
        if self.peer is None or server is None:
            self._pending.append(frame)
        else:
            server._inbox.put(self.peer, frame, self.principal)

    def close(self) -> None:
        if self.closed:
            return
        self._hub._detach(self, notify=False)
        self._inbox.close()
        self._hub._clients.discard(self)


class InprocHub:
    """A namespace of in-process servers and the clients linked to them."""

    def __init__(self) -> None:
        self._servers: dict[str, InprocServer] = {}
        self._clients: set[InprocClient] = set()
        self._ids = itertools.count(1)

    def server(self, name: str) -> InprocServer:
        if name in self._servers:
            raise ValueError(f"an inproc server named {name!r} is already bound")
        server = InprocServer(self, name)
        self._servers[name] = server
        for client in list(self._clients):
            if client.name == name and not client.link_down:
                self._attach(client)
        return server

    def client(
        self,
        name: str,
        *,
        on_connected: Callback | None = None,
        on_disconnected: Callback | None = None,
        principal: str | None = None,
    ) -> InprocClient:
        """A client of ``name``; ``principal`` is what the server sees as Received.principal."""
        client = InprocClient(self, name, on_connected, on_disconnected, principal)
        self._clients.add(client)
        if name in self._servers:
            self._attach(client)
        return client

    def disconnect(self, client: InprocClient) -> None:
        """Cut ``client``'s link until :meth:`reconnect` (a lost network link)."""
        client.link_down = True
        self._detach(client, notify=True)

    def reconnect(self, client: InprocClient) -> None:
        """Restore a link cut by :meth:`disconnect`; the server sees a new peer id."""
        client.link_down = False
        if not client.closed and client.peer is None and client.name in self._servers:
            self._attach(client)

    def _attach(self, client: InprocClient) -> None:
        server = self._servers[client.name]
        peer = f"{next(self._ids):010x}"
        client.peer = peer
        server._peers[peer] = client
        while client._pending:
            server._inbox.put(peer, client._pending.popleft(), client.principal)
        _notify(client._on_connected)

    def _detach(self, client: InprocClient, *, notify: bool) -> None:
        if client.peer is None:
            return
        server = self._servers.get(client.name)
        if server is not None:
            server._peers.pop(client.peer, None)
        client.peer = None
        if notify:
            _notify(client._on_disconnected)

    def _server_closed(self, server: InprocServer) -> None:
        if self._servers.get(server.name) is server:
            del self._servers[server.name]
        for client in list(server._peers.values()):
            client.peer = None
            _notify(client._on_disconnected)
        server._peers.clear()


def _notify(callback: Callback | None) -> None:
    if callback is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        callback()
    else:
        loop.call_soon(callback)
