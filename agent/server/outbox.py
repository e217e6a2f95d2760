"""The agent's outbox: messages to the master and to executors, sent in order by one sender.

The daemon queues what the core said (``None`` for the master, else an executor's peer id) and a
single task, :meth:`AgentOutbox.run`, drains the queue: it is the only writer of both sockets. When
the master said it reads batches (STATUS_UPDATES) and several messages are waiting, the status
updates among them reach the master as one message
(:func:`agora.sdk.messages.batching.coalesce`). A send that fails is logged and the next goes
on; a closed transport ends the sender.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

import structlog
from agora.sdk.messages import Message
from agora.sdk.messages.batching import coalesce
from agora.sdk.transport import MasterLink, Server, TransportClosed

__all__ = ["AgentOutbox"]

log = structlog.get_logger(__name__)

_SETTLE: Final = 0.1  # seconds, see AgentOutbox.flush


class AgentOutbox:
    """Queued (peer, message) pairs, peer None for the master, and the task that sends them."""

    def __init__(self) -> None:
        self._queue: deque[tuple[str | None, Message]] = deque()
        self._ready = asyncio.Event()
        #: The master said it reads batches (STATUS_UPDATES) when it last accepted this agent.
        self.master_reads_batches = False

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, peer: str | None, message: Message) -> None:
        """Queue ``message`` for the master (``peer`` None) or an executor; sent in order."""
        self._queue.append((peer, message))
        self._ready.set()

    async def run(self, client: MasterLink, server: Server) -> None:
        """Send the outbox in order: the single writer of both sockets."""
        outbox, ready = self._queue, self._ready
        while True:
            await ready.wait()
            ready.clear()
            while outbox:
                if self.master_reads_batches and len(outbox) > 1:
                    # Status updates queued together reach the master as one message.
                    queued = list(outbox)
                    outbox.clear()
                    to_master = coalesce(m for peer, m in queued if peer is None)
                    sends: list[tuple[str | None, Message]] = [(None, m) for m in to_master]
                    sends += [(peer, m) for peer, m in queued if peer is not None]
                else:
                    sends = [outbox.popleft()]
                for peer, message in sends:
                    try:
                        if peer is None:
                            await client.send(message)
                        elif not await server.send(peer, message):
                            log.info("executor_unreachable", peer=peer, message=message.NAME)
                    except TransportClosed:
                        return
                    except Exception:
                        log.exception("send_failed", peer=peer, message=type(message).__name__)

    async def flush(self, timeout: float, client: MasterLink | None) -> None:
        """Wait up to ``timeout`` s for the queue to empty (at shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if client is not None and client.connected:
            # The sockets close without linger: give ZeroMQ's I/O thread a moment to write.
            await asyncio.sleep(_SETTLE)
