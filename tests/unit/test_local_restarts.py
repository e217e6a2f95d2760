"""The restart policy of `agora local`'s daemons: backoff, forgetting old crashes, giving up.

Pure: time is an argument, no process is started.
"""

from __future__ import annotations

import pytest
from agora.sdk.cli.restarts import GiveUp, Restart, RestartLimits, RestartPolicy


def test_the_delay_doubles_from_half_a_second_to_a_cap() -> None:
    policy = RestartPolicy(RestartLimits(max_crashes=100, window=1000.0))
    decisions = [policy.crashed(now=float(t)) for t in range(8)]
    assert decisions == [
        Restart(1, 0.5),
        Restart(2, 1.0),
        Restart(3, 2.0),
        Restart(4, 4.0),
        Restart(5, 8.0),
        Restart(6, 10.0),
        Restart(7, 10.0),
        Restart(8, 10.0),
    ]


def test_the_fifth_crash_within_a_minute_gives_up() -> None:
    policy = RestartPolicy()  # the defaults: 5 crashes within 60 s
    assert [policy.crashed(now) for now in (0.0, 5.0, 10.0, 20.0)] == [
        Restart(1, 0.5),
        Restart(2, 1.0),
        Restart(3, 2.0),
        Restart(4, 4.0),
    ]
    assert policy.crashed(59.0) == GiveUp(crashes=5, window=60.0)


def test_crashes_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy()
    for now in (0.0, 10.0, 20.0, 30.0):
        assert isinstance(policy.crashed(now), Restart)
    # At 65 s the crash at 0 s is out of the window: three remain, this is the 4th.
    assert policy.crashed(65.0) == Restart(4, 4.0)
    # A daemon that then runs for a good while starts again from the first delay.
    assert policy.crashed(1000.0) == Restart(1, 0.5)


def test_a_daemon_that_keeps_crashing_slowly_is_never_given_up() -> None:
    policy = RestartPolicy()
    decisions = [policy.crashed(now=i * 20.0) for i in range(50)]  # every 20 s, 3 per minute
    assert decisions[:2] == [Restart(1, 0.5), Restart(2, 1.0)]
    assert set(decisions[2:]) == {Restart(3, 2.0)}


def test_custom_limits() -> None:
    policy = RestartPolicy(RestartLimits(first_delay=0.1, max_delay=0.3, factor=3.0, max_crashes=3))
    assert policy.crashed(0.0) == Restart(1, 0.1)
    assert policy.crashed(0.1) == Restart(2, pytest.approx(0.3))
    assert policy.crashed(0.2) == GiveUp(3, 60.0)


@pytest.mark.parametrize(
    "limits",
    [
        {"first_delay": -1.0},
        {"first_delay": 5.0, "max_delay": 1.0},
        {"factor": 0.5},
        {"max_crashes": 0},
        {"window": 0.0},
    ],
)
def test_nonsense_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartLimits(**limits)  # type: ignore[arg-type]
