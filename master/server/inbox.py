"""Client messages the master daemon took off its socket and has not handled yet.

Two queues, both in arrival order: the backlog (taken off the socket, handled a few milliseconds
at a time) and the held (arrived while the leader's lease had lapsed, or before its term became
active: acted on once it may act, dropped if it loses the lead). A batch message is taken apart
as it is queued, so each message it carries is checked and handled on its own. No I/O here.
"""

from __future__ import annotations

import collections
from typing import Final

from agora.master.server.stats import DaemonStats
from agora.sdk.messages.batching import unbatch
from agora.sdk.transport import Received

__all__ = ["MAX_BACKLOG", "MAX_HELD", "Inbox"]

#: Client messages taken off the socket but not handled yet, beyond which the socket is left to
#: queue (and push back on the clients).
MAX_BACKLOG: Final = 20_000
#: Client messages held while a leader's lease lapses (beyond this, the oldest are dropped:
#: clients retry what matters).
MAX_HELD: Final = 100_000


class Inbox:
    def __init__(self, stats: DaemonStats) -> None:
        self._stats = stats
        #: Client frames taken off the socket, in arrival order, not handled yet.
        self.backlog: collections.deque[Received] = collections.deque()
        #: Client messages that arrived while the lease had lapsed, in arrival order.
        self.held: collections.deque[Received] = collections.deque(maxlen=MAX_HELD)

    def __len__(self) -> int:
        return len(self.backlog) + len(self.held)

    def full(self) -> bool:
        """Whether the backlog is as long as it may be (leave the rest on the socket)."""
        return len(self.backlog) >= MAX_BACKLOG

    def queue(self, received: Received) -> None:
        """Queue a client frame in the backlog (each message of a batch on its own)."""
        message = received.message
        parts = unbatch(message) if message is not None else (None,)
        if len(parts) == 1:
            self.backlog.append(received)
        else:
            peer, epoch, principal = received.peer, received.epoch, received.principal
            self.backlog.extend(Received(peer, part, epoch, None, principal) for part in parts)

    def hold(self, received: Received) -> None:
        """Hold a client message until this master may act (the oldest goes when full)."""
        if len(self.held) == self.held.maxlen:
            self._stats.messages_dropped += 1
        self.held.append(received)
