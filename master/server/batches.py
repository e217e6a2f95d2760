"""Which peers read batch messages, and the updates and acknowledgements held for them.

The daemon hands each ``Send`` to :meth:`Batcher.hold`. An UPDATE or STATUS_UPDATE_ACK for a
peer that announced the "batches" feature is held; anything else goes at once, after whatever is
held for its peer (order per peer is kept). At the end of a burst of handled messages the daemon
sends what :meth:`Batcher.release` gives: each peer's held messages merged into as few batch
messages as ``agora.sdk.messages.batching.coalesce`` makes. No I/O here.
"""

from __future__ import annotations

from typing import Final

from agora.master.core import Send
from agora.sdk.messages import (
    Message,
    RegisterAgent,
    ReregisterAgent,
    StatusUpdateAck,
    Subscribe,
    Update,
)
from agora.sdk.messages.batching import BATCHES, coalesce

__all__ = ["Batcher"]

_HELD: Final = (Update, StatusUpdateAck)
_ANNOUNCING: Final = (Subscribe, RegisterAgent, ReregisterAgent)


class Batcher:
    def __init__(self) -> None:
        #: Peers whose latest registration or subscription said they read batches.
        self.readers: set[str] = set()
        #: peer -> messages held for it, in the order the core produced them.
        self._held: dict[str, list[Send]] = {}

    def heard(self, peer: str, message: Message) -> None:
        """Note what a registration or subscription from ``peer`` says it reads."""
        if isinstance(message, _ANNOUNCING):
            if BATCHES in message.features:
                self.readers.add(peer)
            else:
                self.readers.discard(peer)

    def forget(self, peer: str) -> None:
        self.readers.discard(peer)

    def hold(self, action: Send) -> bool:
        """True if ``action`` is held for the end of the burst (the caller sends nothing)."""
        if type(action.message) in _HELD and action.to in self.readers:
            self._held.setdefault(action.to, []).append(action)
            return True
        return False

    def release_for(self, peer: str) -> list[tuple[Message, int]]:
        """What is held for ``peer``, merged, to go before anything else sent to it now."""
        held = self._held.pop(peer, None)
        return _merged(held) if held else []

    def release(self) -> list[tuple[str, Message, int]]:
        """Everything held, merged per peer."""
        out: list[tuple[str, Message, int]] = []
        held, self._held = self._held, {}
        for peer, actions in held.items():
            out.extend((peer, message, epoch) for message, epoch in _merged(actions))
        return out

    @property
    def holding(self) -> bool:
        return bool(self._held)


def _merged(actions: list[Send]) -> list[tuple[Message, int]]:
    """``actions`` merged, never across a change of epoch (each batch keeps its term's)."""
    out: list[tuple[Message, int]] = []
    start = 0
    for end in range(1, len(actions) + 1):
        if end == len(actions) or actions[end].epoch != actions[start].epoch:
            epoch = actions[start].epoch
            out.extend((m, epoch) for m in coalesce(a.message for a in actions[start:end]))
            start = end
    return out
