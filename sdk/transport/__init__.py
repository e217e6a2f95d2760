"""Messages in, messages out: the transports every Agora process talks through.

``ZmqServer``/``ZmqClient`` (ROUTER/DEALER over ZeroMQ, optionally CURVE) for real links and
``InprocHub`` for tests that want real encoding without sockets. All of them encode and decode
through :mod:`agora.sdk.codec` and deliver :class:`Received` records.
"""

from __future__ import annotations

from agora.sdk.transport.base import Client, Dial, Received, Server, TransportClosed
from agora.sdk.transport.curve import (
    Acl,
    AclError,
    CurveClient,
    CurveServer,
    discover_client,
    generate_keypair,
)
from agora.sdk.transport.inproc import InprocClient, InprocHub, InprocServer
from agora.sdk.transport.master_link import MasterLink
from agora.sdk.transport.zmq_client import ZmqClient
from agora.sdk.transport.zmq_server import ZmqServer

__all__ = [
    "Acl",
    "AclError",
    "Client",
    "CurveClient",
    "CurveServer",
    "Dial",
    "InprocClient",
    "InprocHub",
    "InprocServer",
    "MasterLink",
    "Received",
    "Server",
    "TransportClosed",
    "ZmqClient",
    "ZmqServer",
    "discover_client",
    "generate_keypair",
]
