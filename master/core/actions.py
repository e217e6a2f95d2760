"""What the master core asks its shell to do. The core never performs I/O itself."""

from __future__ import annotations

from dataclasses import dataclass

from agora.sdk.messages import Message

__all__ = ["Action", "Peer", "Send"]

#: An opaque name for one connected client (a ZeroMQ routing identity, an in-memory
#: endpoint in tests). The core only compares and stores peers.
Peer = str


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``message`` to ``to``, stamped with the master's ``epoch``."""

    to: Peer
    message: Message
    epoch: int


Action = Send
