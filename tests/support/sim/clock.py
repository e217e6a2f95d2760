"""Simulated time: a float clock and a queue of timed callbacks.

Nothing here reads the wall clock or sleeps. Events run in (time, insertion order), so a
run is a pure function of the seed that produced its random choices.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["EventQueue", "SimClock", "Timer"]


@dataclass(slots=True)
class SimClock:
    """Seconds since the start of the run."""

    now: float = 0.0


@dataclass(slots=True)
class Timer:
    """A handle on one scheduled callback; ``cancel`` makes it a no-op when it comes due."""

    at: float
    label: str
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


#: (time, sequence number, timer, action): tuples compare in C, and the sequence number breaks
#: every tie before the timer would be compared.
_Entry = tuple[float, int, Timer, Callable[[], None]]


class EventQueue:
    """Callbacks due at simulated times; ties run in the order they were scheduled."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._heap: list[_Entry] = []
        self._seq = 0

    def at(self, when: float, action: Callable[[], None], label: str = "") -> Timer:
        if when < self.clock.now:
            raise ValueError(f"cannot schedule {label!r} in the past ({when} < {self.clock.now})")
        timer = Timer(when, label)
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, timer, action))
        return timer

    def later(self, delay: float, action: Callable[[], None], label: str = "") -> Timer:
        return self.at(self.clock.now + max(0.0, delay), action, label)

    def __len__(self) -> int:
        return len(self._heap)

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        """Run every event due up to ``until`` (then set the clock to it), or until ``stop()``."""
        while self._heap and self._heap[0][0] <= until:
            at, _seq, timer, action = heapq.heappop(self._heap)
            self.clock.now = at
            if not timer.cancelled:
                action()
                if stop is not None and stop():
                    return
        self.clock.now = max(self.clock.now, until)
