"""Backpressure on agent registrations: how many wait in the daemon's backlog, and who is told
to come back later.

A registration storm (every agent of a cluster re-registering after a failover) puts thousands
of REGISTER_AGENT / REREGISTER_AGENT in the backlog at once, each far dearer to handle than to
queue. Agents re-send an unanswered registration after about a second, so without a bound the
backlog grows with copies of what it already holds and every agent waits for all the others.
The gate keeps at most one registration per connection in the backlog (a re-sent copy is
dropped: the one queued is answered), and beyond what the master answers in
``QUEUE_SECONDS`` it tells the agent when to try again (RETRY_REGISTRATION): one return time
each, paced at the rate at which it has been answering registrations, from when the backlog is
down to half that. Pure bookkeeping: the
daemon does the sending.
"""

from __future__ import annotations

from typing import Final

__all__ = ["QUEUE_SECONDS", "RegistrationGate"]

#: Registrations queued beyond what the master answers in this long are put off. Long enough
#: that a 10,000-agent failover on a small machine is not slowed (every agent put off returns
#: to a master that could have answered it), short enough that an agent's copies are few.
QUEUE_SECONDS: Final = 5.0
#: Never put off a registration while fewer than this many wait.
MIN_QUEUE: Final = 1_000
#: Registrations answered per second, assumed before any was measured.
INITIAL_RATE: Final = 2_500.0
#: The longest delay told to an agent (seconds).
MAX_DELAY: Final = 30.0
#: The rate is re-measured over windows of at least this long (seconds) of registrations handled.
_WINDOW: Final = 0.25


class RegistrationGate:
    """Registrations waiting in the backlog, by connection, the rate they are answered, and
    the times the agents put off were told to come back."""

    __slots__ = (
        "_min_queue",
        "_queue_seconds",
        "_rate",
        "_returns_until",
        "_window_n",
        "_window_start",
        "queued",
    )

    def __init__(
        self,
        *,
        queue_seconds: float = QUEUE_SECONDS,
        min_queue: int = MIN_QUEUE,
        rate: float = INITIAL_RATE,
    ) -> None:
        #: Connections with a registration in the backlog.
        self.queued: set[str] = set()
        self._queue_seconds = queue_seconds
        self._min_queue = min_queue
        self._rate = rate
        self._window_start: float | None = None
        self._window_n = 0
        #: When the last agent put off was told to come back: the next comes after it.
        self._returns_until = 0.0

    @property
    def rate(self) -> float:
        """Registrations handled per second, as last measured."""
        return self._rate

    def arrive(self, peer: str, now: float, *, may_put_off: bool = True) -> float | None:
        """A registration from ``peer`` came off the socket at ``now``. None: queue it; 0.0:
        drop it (the same connection has one queued already); else the seconds to tell the
        agent to wait. ``may_put_off``: the agent reads RETRY_REGISTRATION (an older one is
        always queued).

        The agents put off are given one return time each, paced at the measured rate from
        when the backlog is down to half its bound: they come back about as fast as they can
        be answered, neither all at once nor after the master has run out of work."""
        if peer in self.queued:
            return 0.0
        waiting = len(self.queued)
        bound = max(self._min_queue, self._rate * self._queue_seconds)
        if may_put_off and waiting >= bound:
            room_at = now + (waiting - bound / 2) / self._rate
            back = max(room_at, self._returns_until) + 1.0 / self._rate
            self._returns_until = back
            return min(MAX_DELAY, back - now)
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
