"""What every transport shares: the :class:`Received` record and the Server/Client protocols."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from agora.sdk.codec import decode
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Message

__all__ = [
    "RELAY_SEP",
    "Client",
    "Dial",
    "Received",
    "Server",
    "TransportClosed",
    "decode_received",
]

#: Between the relay's routing id and the agent's in the peer name of a relayed agent.
RELAY_SEP = "/"


class TransportClosed(ConnectionError):
    """``recv``/``send`` on a transport after its ``close()``."""


@dataclass(frozen=True, slots=True)
class Received:
    """One frame as it arrived: the decoded message, or why it could not be decoded.

    ``peer`` is the sender's routing id as hex on the server side and ``""`` on the client side.
    ``message`` is None exactly when ``error`` is set (``epoch`` is then 0). ``principal`` is the
    sender's CURVE principal (the stem of its authorized key file), None when CURVE is off.

    ``relay`` is set when the frame came through a relay (``agora-relay``): the principal of the
    relay's own connection ("" when CURVE is off). ``peer`` then names the agent behind the relay
    (:data:`RELAY_SEP` between the two routing ids) and ``principal`` is the agent's, as the
    relay reports it: trust it only from a relay allowed to vouch (``Acl.relays``).
    """

    peer: str
    message: Message | None
    epoch: int
    error: ProtocolError | None
    principal: str | None = None
    relay: str | None = None


def decode_received(
    peer: str, frame: bytes | memoryview, principal: str | None = None, relay: str | None = None
) -> Received:
    """``Received`` for one frame; a bad frame becomes ``Received(message=None, error=...)``."""
    try:
        envelope = decode(frame)
    except ProtocolError as exc:
        return Received(peer, None, 0, exc, principal, relay)
    return Received(peer, envelope.message, envelope.epoch, None, principal, relay)


@runtime_checkable
class Server(Protocol):
    """ROUTER side: many peers, each named by a hex routing id (master, agent executor socket)."""

    @property
    def endpoint(self) -> str:
        """The actual bound endpoint, e.g. ``tcp://127.0.0.1:40213``."""
        ...

    async def recv(self) -> Received:
        """The next frame; raises :class:`TransportClosed` once closed."""
        ...

    def recv_nowait(self) -> Received | None:
        """The next queued frame, or None when nothing is queued (for draining bursts)."""
        ...

    async def send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        """Queue ``message`` to ``peer``; False when the peer is unknown, gone or backed up.

        Raises :class:`ProtocolError` when ``message`` breaks its schema.
        """
        ...

    def try_send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        """:meth:`send` for callers outside a coroutine: it never waits."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Client(Protocol):
    """DEALER side: one server (agents, drivers, executors, the CLI)."""

    @property
    def endpoint(self) -> str: ...

    @property
    def connected(self) -> bool:
        """Transport-level link state (a completed handshake with the server)."""
        ...

    async def recv(self) -> Received: ...

    def recv_nowait(self) -> Received | None: ...

    async def send(self, message: Message, epoch: int = 0) -> None:
        """Queue ``message`` (also while the link is down); raises ProtocolError on a bad one."""
        ...

    def close(self) -> None: ...


#: How a process makes its link to one server instead of a ZeroMQ DEALER: called with the
#: server's endpoint and the link-up and link-down callbacks, it returns the connected client
#: (over the in-process transport: ``lambda e, up, down: hub.client(name_of(e),
#: on_connected=up, on_disconnected=down)``). ``MasterLink``, the agent daemon and the executor
#: driver take one.
Dial: TypeAlias = Callable[[str, Callable[[], None], Callable[[], None]], Client]
