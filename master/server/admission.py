"""Backpressure on agent registrations: how many wait in the daemon's backlog, and who is told
to come back later.

A registration storm (every agent of a cluster re-registering after a failover) puts thousands
of REGISTER_AGENT / REREGISTER_AGENT in the backlog at once, each far dearer to handle than to
queue. Agents re-send an unanswered registration after about a second, so without a bound the
backlog grows with copies of what it already holds and every agent waits for all the others.
The gate keeps at most one registration per connection in the backlog (a re-sent copy is
dropped: the one queued is answered), and beyond what the master answers in
``QUEUE_SECONDS`` it tells the agent when to try again (RETRY_REGISTRATION), from the rate at
which it has been answering them. Pure bookkeeping: the daemon does the sending.
"""

from __future__ import annotations

from typing import Final

__all__ = ["QUEUE_SECONDS", "RegistrationGate"]

#: Registrations queued beyond what the master answers in this long are put off.
QUEUE_SECONDS: Final = 2.0
#: Never put off a registration while fewer than this many wait.
MIN_QUEUE: Final = 1_000
#: Registrations answered per second, assumed before any was measured.
INITIAL_RATE: Final = 1_000.0
#: The longest delay told to an agent (seconds); the shortest is about ``QUEUE_SECONDS``.
MAX_DELAY: Final = 30.0
#: The rate is re-measured over windows of at least this long (seconds) of registrations handled.
_WINDOW: Final = 0.25


class RegistrationGate:
    """Registrations waiting in the backlog, by connection, and the rate they are answered."""

    __slots__ = ("_rate", "_window_n", "_window_start", "queued")

    def __init__(self) -> None:
        #: Connections with a registration in the backlog.
        self.queued: set[str] = set()
        self._rate = INITIAL_RATE
        self._window_start: float | None = None
        self._window_n = 0

    @property
    def rate(self) -> float:
        """Registrations handled per second, as last measured."""
        return self._rate

    def arrive(self, peer: str, *, may_put_off: bool = True) -> float | None:
        """A registration from ``peer`` came off the socket. None: queue it; 0.0: drop it (the
        same connection has one queued already); else the seconds to tell the agent to wait.
        ``may_put_off``: the agent reads RETRY_REGISTRATION (an older one is always queued)."""
        if peer in self.queued:
            return 0.0
        waiting = len(self.queued)
        if may_put_off and waiting >= max(MIN_QUEUE, self._rate * QUEUE_SECONDS):
            return min(MAX_DELAY, waiting / self._rate)
        self.queued.add(peer)
        return None

    def handled(self, peer: str, now: float) -> None:
        """The registration ``peer`` queued was taken off the backlog and handled (at ``now``).

        The rate is measured only while more wait (the master busy with them): a trickle of
        registrations in a quiet cluster says nothing of how fast a storm is answered."""
        self.queued.discard(peer)
        if not self.queued:
            self._window_start = None
            return
        if self._window_start is None:
            self._window_start, self._window_n = now, 0
            return
        self._window_n += 1
        elapsed = now - self._window_start
        if elapsed >= _WINDOW:
            self._rate = 0.5 * self._rate + 0.5 * max(self._window_n / elapsed, 1.0)
            self._window_start, self._window_n = now, 0
