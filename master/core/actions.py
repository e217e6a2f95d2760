"""What the master core asks its shell to do. The core never performs I/O itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from agora.master.registry import Operation
from agora.sdk.messages import Message

__all__ = ["Action", "Notice", "Peer", "Propose", "Send"]

#: An opaque name for one connected client (a ZeroMQ routing identity, an in-memory
#: endpoint in tests). The core only compares and stores peers.
Peer = str


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver ``message`` to ``to``, stamped with the master's ``epoch``."""

    to: Peer
    message: Message
    epoch: int


@dataclass(frozen=True, slots=True)
class Propose:
    """Replicate ``op`` in the registry; when it commits call ``Master.committed(seq)``, and if it
    cannot (leadership lost, no quorum in time) ``Master.abandoned(seq)``."""

    seq: int
    op: Operation


Action: TypeAlias = Send | Propose


@dataclass(frozen=True, slots=True)
class Notice:
    """Something an operator should read in the master's log (a framework removed, and why).
    Not an action: the shell collects notices with ``Master.notices()`` and logs them."""

    event: str
    fields: tuple[tuple[str, str], ...]
    #: ``warning`` for what changed a framework's fate (its removal), else ``info``.
    level: str = "info"
