"""Which peers the master has heard from lately, and which of them are other masters.

The daemon notes every frame's sender with the monotonic time; peers silent for the peer timeout
are taken out (the daemon reports them to the core as disconnected, or on a standby just forgets
them). Peers that sent election traffic are other masters' links: they are never told where the
leader is. No I/O here; times are arguments.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["PeerTable"]


class PeerTable:
    def __init__(self) -> None:
        #: peer -> time of its last frame; insertion order = least recently heard first.
        self._last_seen: dict[str, float] = {}
        #: Peers that sent election traffic (other masters' links to us).
        self._electing: set[str] = set()

    def heard(self, peer: str, now: float) -> None:
        """A frame from ``peer`` arrived at ``now``."""
        seen = self._last_seen
        seen.pop(peer, None)
        seen[peer] = now

    def electing(self, peer: str) -> None:
        """``peer`` sent election traffic that counts."""
        self._electing.add(peer)

    def clients(self) -> Iterator[str]:
        """The peers heard from so far that are not other masters, least recently heard first
        (each checked as it is reached)."""
        for peer in list(self._last_seen):
            if peer not in self._electing:
                yield peer

    def expire(self, cutoff: float) -> Iterator[str]:
        """Take out, and yield, the peers last heard at or before ``cutoff``, least recently
        heard first (each is gone before it is yielded)."""
        seen = self._last_seen
        while seen:
            peer, at = next(iter(seen.items()))
            if at > cutoff:
                return
            del seen[peer]
            self._electing.discard(peer)
            yield peer
