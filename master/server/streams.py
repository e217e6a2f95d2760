"""Schedulers subscribed over HTTP (the Mesos v1 scheduler API): one event stream each.

Each stream is a peer of the master like a socket's, named :data:`STREAM_PEER` + its stream
id: the core addresses it as any other, and the outbox hands what it sends to :meth:`deliver`,
which queues it for the HTTP response writing the stream. A stream ends when its scheduler
hangs up, when the master stops acting for the term it was opened in (its scheduler subscribes
again, to the leader then), or when its scheduler lags :data:`MAX_QUEUED` messages behind (it
re-subscribes and reconciles, as after any disconnection). The core learns of each end through
:meth:`take_ended`.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Final

from agora.sdk.ids import FrameworkID
from agora.sdk.messages import Message

__all__ = ["MAX_QUEUED", "STREAM_PEER", "Stream", "Streams"]

#: Peer names of HTTP schedulers. ZeroMQ peers are hex routing ids and in-process calls start
#: with ``local:``, so none starts with this.
STREAM_PEER: Final = "mesos:"
#: Messages a stream may hold for a scheduler that does not read them; past that it is closed.
MAX_QUEUED: Final = 10_000


@dataclass(eq=False)
class Stream:
    """One subscribed scheduler's event stream."""

    stream_id: str
    principal: str | None
    #: What the core said to this scheduler, in order; None ends the stream.
    queue: asyncio.Queue[Message | None] = field(default_factory=asyncio.Queue)
    #: The framework this stream subscribed, once the core said SUBSCRIBED.
    framework_id: FrameworkID | None = None
    #: Why the master ended the stream (None: it is open, or its scheduler hung up).
    ended: str | None = None

    @property
    def peer(self) -> str:
        return STREAM_PEER + self.stream_id


class Streams:
    """The open streams, by stream id."""

    def __init__(self) -> None:
        self._open: dict[str, Stream] = {}
        self._ended: list[str] = []

    def __len__(self) -> int:
        return len(self._open)

    def open(self, principal: str | None) -> Stream:
        """A new stream for a scheduler subscribing as ``principal``."""
        stream = Stream(str(uuid.uuid4()), principal)
        self._open[stream.stream_id] = stream
        return stream

    def get(self, stream_id: str) -> Stream | None:
        return self._open.get(stream_id)

    def of_peer(self, peer: str) -> Stream | None:
        return self._open.get(peer.removeprefix(STREAM_PEER))

    def deliver(self, peer: str, message: Message) -> bool:
        """Queue what the core said to ``peer``; False when no such stream is open."""
        stream = self.of_peer(peer)
        if stream is None:
            return False
        if stream.queue.qsize() >= MAX_QUEUED:
            self.end(stream, f"the scheduler fell {MAX_QUEUED} events behind")
            return False
        stream.queue.put_nowait(message)
        return True

    def end(self, stream: Stream, why: str | None = None) -> None:
        """End ``stream`` (``why``: the master ended it; None: its scheduler hung up). The core
        hears of it through :meth:`take_ended`."""
        if self._open.pop(stream.stream_id, None) is None:
            return
        stream.ended = why
        stream.queue.put_nowait(None)
        self._ended.append(stream.peer)

    def end_all(self, why: str) -> None:
        for stream in list(self._open.values()):
            self.end(stream, why)

    def take_ended(self) -> list[str]:
        """The peers of streams ended since the last call (to report to the core)."""
        ended, self._ended = self._ended, []
        return ended
