"""Counters the master daemon keeps as it runs; the operator API reads them (metrics.py).

Kept apart from the Prometheus code so that a master without ``--http-port`` never imports it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ALLOCATION_BUCKETS", "BAD_FRAME_TOP_PEERS", "DaemonStats"]

#: How many peers the per-peer bad-frame metric names (those with the most, among the recent).
BAD_FRAME_TOP_PEERS = 10

#: Upper bounds (seconds) of the allocation run-time histogram's buckets.
ALLOCATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class DaemonStats:
    """Counters the daemon bumps as it goes: plain ints, read at scrape time."""

    started: float = field(default_factory=time.monotonic)
    messages_received: int = 0
    bad_frames_received: int = 0
    #: (peer, bad frames) of the peers with the most, among the most recent few hundred.
    bad_frames_by_peer: Callable[[], list[tuple[str, int]]] = lambda: []
    #: Messages that could not be delivered (peer gone, send failed) or were dropped unhandled
    #: (held past the bound while the lease lapsed).
    messages_dropped: int = 0
    #: Agent registrations answered RETRY_REGISTRATION (too many waiting), and re-sent copies
    #: of one still waiting, dropped (see admission.py).
    registrations_put_off: int = 0
    registrations_coalesced: int = 0
    #: Messages received and not handled yet (the daemon's backlog and what it holds).
    queue_size: Callable[[], int] = lambda: 0
    #: Allocation (``Master.tick`` / ``end_burst``) run times: per-bucket counts (the last
    #: bucket is +Inf), their sum and how many.
    allocation_buckets: list[int] = field(
        default_factory=lambda: [0] * (len(ALLOCATION_BUCKETS) + 1)
    )
    allocation_sum: float = 0.0
    allocation_count: int = 0

    def observe_allocation(self, seconds: float) -> None:
        self.allocation_buckets[bisect.bisect_left(ALLOCATION_BUCKETS, seconds)] += 1
        self.allocation_sum += seconds
        self.allocation_count += 1

    def uptime(self) -> float:
        return time.monotonic() - self.started
