"""RestartableWait: the SUBSCRIBE backoff grows while nothing answers and starts over on restart."""

from __future__ import annotations

import pytest
from agora.sdk.scheduler._backoff import RestartableWait
from tenacity import AsyncRetrying, RetryCallState


def state(attempt: int) -> RetryCallState:
    call = RetryCallState(AsyncRetrying(), fn=None, args=(), kwargs={})
    call.attempt_number = attempt
    return call


def test_the_wait_grows_to_its_cap_and_never_drops_below_its_floor() -> None:
    wait = RestartableWait(1.0, 30.0)
    firsts = [wait(state(1)) for _ in range(200)]
    assert all(1.0 <= w <= 2.0 for w in firsts)
    late = [wait(state(12)) for _ in range(200)]
    assert all(1.0 <= w <= 30.0 for w in late)
    assert max(late) > 10.0  # 200 draws of U(1, 30): the schedule did grow


def test_restart_makes_the_next_wait_the_first_of_a_new_schedule() -> None:
    wait = RestartableWait(1.0, 30.0)
    for attempt in range(1, 12):
        wait(state(attempt))
    after_restart = []
    for _ in range(100):
        wait.restart()
        after_restart.append(wait(state(12)))  # the attempt made at once after the restart
    assert all(1.0 <= w <= 2.0 for w in after_restart)
    # ...and the schedule grows again from there: attempt 13 is the 2nd of the new schedule.
    assert all(1.0 <= wait(state(13)) <= 3.0 for _ in range(100))


def test_floor_equal_to_cap_is_a_fixed_wait_and_a_bad_range_is_refused() -> None:
    assert RestartableWait(4.0, 4.0)(state(9)) == 4.0
    with pytest.raises(ValueError):
        RestartableWait(2.0, 1.0)
    with pytest.raises(ValueError):
        RestartableWait(0.0, 1.0)
