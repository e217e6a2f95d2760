"""When ``agora local`` restarts a daemon that died, and when it gives up on one.

Pure logic: no processes, no clock. The caller says when each crash happened (``now``, any
monotonic time in seconds) and is told how long to wait before the next start, or to give up.
The wait doubles with each crash still inside the window (0.5 s, 1 s, 2 s, … up to a cap); a
daemon that crashes ``max_crashes`` times within ``window`` seconds is given up on. Crashes older
than the window are forgotten, so a daemon that ran for a while starts again from the first delay.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["GiveUp", "Restart", "RestartLimits", "RestartPolicy"]


@dataclass(frozen=True, slots=True)
class RestartLimits:
    """How fast the restarts back off, and how many crashes are too many."""

    first_delay: float = 0.5
    max_delay: float = 10.0
    factor: float = 2.0
    max_crashes: int = 5
    window: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.first_delay <= self.max_delay:
            raise ValueError("expected 0 <= first_delay <= max_delay")
        if self.factor < 1:
            raise ValueError("expected factor >= 1")
        if self.max_crashes < 1:
            raise ValueError("expected max_crashes >= 1")
        if self.window <= 0:
            raise ValueError("expected window > 0")


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the daemon again after ``delay`` seconds; ``attempt`` counts the crashes within
    the window, this one included (1 for the first)."""

    attempt: int
    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The daemon crashed ``crashes`` times within ``window`` seconds: stop trying."""

    crashes: int
    window: float


class RestartPolicy:
    """One daemon's crash history and what to do about its next crash."""

    def __init__(self, limits: RestartLimits | None = None) -> None:
        self.limits = limits or RestartLimits()
        self._crashes: deque[float] = deque()

    def crashed(self, now: float) -> Restart | GiveUp:
        """The daemon died (or could not be started) at ``now``: when to start it again."""
        limits = self.limits
        self._crashes.append(now)
        while self._crashes and self._crashes[0] <= now - limits.window:
            self._crashes.popleft()
        count = len(self._crashes)
        if count >= limits.max_crashes:
            return GiveUp(count, limits.window)
        delay = min(limits.first_delay * limits.factor ** (count - 1), limits.max_delay)
        return Restart(count, delay)
