"""A retry wait for tenacity whose schedule starts over when the awaited peer comes back.

A client that has failed for a while waits long between attempts; once a master confirms that it
leads, the next attempt should go out at once and the waits after it start again from the floor,
whatever the schedule had reached. :class:`RestartableWait` is that wait: jittered exponential
between ``floor`` and ``cap`` (``wait_fixed(floor) + wait_random_exponential``), counted from the
last :meth:`RestartableWait.restart`.
"""

from __future__ import annotations

import copy

from tenacity import RetryCallState
from tenacity.wait import wait_base, wait_fixed, wait_random_exponential

__all__ = ["RestartableWait"]


class RestartableWait(wait_base):
    """``floor + random(0, min(cap - floor, floor * 2**(n - 1)))`` seconds after the n-th attempt
    since the last :meth:`restart` (or since the first attempt)."""

    def __init__(self, floor: float, cap: float) -> None:
        if not 0 < floor <= cap:
            raise ValueError("a wait needs 0 < floor <= cap")
        self._wait = wait_fixed(floor) + wait_random_exponential(multiplier=floor, max=cap - floor)
        self._before = 0  # attempts made before the current schedule began
        self._restart = False

    def restart(self) -> None:
        """The next wait computed is the schedule's first: the attempt it follows (the one a
        caller makes at once after restarting) counts as the first of a new schedule."""
        self._restart = True

    def __call__(self, retry_state: RetryCallState) -> float:
        if self._restart:
            self._restart = False
            self._before = retry_state.attempt_number - 1
        shifted = copy.copy(retry_state)
        shifted.attempt_number = max(1, retry_state.attempt_number - self._before)
        return self._wait(shifted)
