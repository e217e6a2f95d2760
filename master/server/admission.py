"""Backpressure on agent registrations: how many wait in the daemon's backlog, and who is told
to come back later.

A registration storm (every agent of a cluster re-registering after a failover) puts thousands
of REGISTER_AGENT / REREGISTER_AGENT in the backlog at once, each far dearer to handle than to
queue. Agents re-send an unanswered registration after about a second, so without a bound the
backlog grows with copies of what it already holds and every agent waits for all the others.
The gate keeps at most one registration per connection in the backlog (a re-sent copy is
dropped: the one queued is answered), and at most ``MAX_QUEUED`` in all. An agent beyond that
is told when to try again (RETRY_REGISTRATION): one return time each, paced at the rate at
which the master has been answering registrations, from when the backlog is down to half the
bound. Pure bookkeeping: the daemon does the sending.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_QUEUED", "RegistrationGate"]

#: Registrations that may wait in the backlog; beyond, agents are put off. A few seconds of work
#: for a master here (2,000-3,000 re-registrations with 10 tasks answered a second on 2 cores):
#: a 10,000-agent failover is not slowed by it, and an agent's copies stay few.
MAX_QUEUED: Final = 10_000
#: Registrations answered per second, assumed before any was measured, and the least assumed:
#: a low estimate would pace the agents put off slower than they can be answered.
INITIAL_RATE: Final = 2_500.0
MIN_RATE: Final = 1_000.0
#: The rate is measured only while at least this many wait (the master busy with a storm, not
#: a trickle beside other work), over windows of at least ``_WINDOW`` seconds.
_MEASURE_FROM: Final = 1_000
_WINDOW: Final = 0.25
#: The longest delay told to an agent (seconds).
MAX_DELAY: Final = 30.0


class RegistrationGate:
    """Registrations waiting in the backlog, by connection, the rate they are answered, and
    the times the agents put off were told to come back."""

    __slots__ = ("_max_queued", "_rate", "_returns_until", "_window_n", "_window_start", "queued")

    def __init__(self, *, max_queued: int = MAX_QUEUED, rate: float = INITIAL_RATE) -> None:
        #: Connections with a registration in the backlog.
        self.queued: set[str] = set()
        self._max_queued = max_queued
        self._rate = max(MIN_RATE, rate)
        self._window_start: float | None = None
        self._window_n = 0
        #: When the last agent put off was told to come back: the next comes after it.
        self._returns_until = 0.0

    @property
    def rate(self) -> float:
        """Registrations handled per second, as last measured (at least ``MIN_RATE``)."""
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
        if may_put_off and waiting >= self._max_queued:
            room_at = now + (waiting - self._max_queued / 2) / self._rate
            back = max(room_at, self._returns_until) + 1.0 / self._rate
            self._returns_until = back
            return min(MAX_DELAY, back - now)
        self.queued.add(peer)
        return None

    def handled(self, peer: str, now: float) -> None:
        """The registration ``peer`` queued was taken off the backlog and handled (at ``now``)."""
        self.queued.discard(peer)
        if len(self.queued) < _MEASURE_FROM:
            self._window_start = None
            return
        if self._window_start is None:
            self._window_start, self._window_n = now, 0
            return
        self._window_n += 1
        elapsed = now - self._window_start
        if elapsed >= _WINDOW:
            measured = self._window_n / elapsed
            self._rate = max(MIN_RATE, 0.5 * self._rate + 0.5 * measured)
            self._window_start, self._window_n = now, 0
