"""Backpressure on agent registrations (master/server/admission.py): one queued per connection,
at most MAX_QUEUED in all, and for the agents beyond, a return time each, paced at the rate."""

from __future__ import annotations

import pytest
from agora.master.server.admission import (
    INITIAL_RATE,
    MAX_DELAY,
    MAX_QUEUED,
    MIN_RATE,
    RegistrationGate,
)


def _fill(gate: RegistrationGate, n: int, prefix: str = "a", now: float = 0.0) -> None:
    for i in range(n):
        assert gate.arrive(f"{prefix}{i}", now) is None


def test_registrations_queue_until_the_bound_then_are_put_off() -> None:
    gate = RegistrationGate()
    _fill(gate, MAX_QUEUED)
    delays = [gate.arrive(f"late{i}", 10.0) for i in range(3)]
    # from when half the backlog is answered, one return time each, paced at the rate
    step, half = 1 / INITIAL_RATE, MAX_QUEUED / 2 / INITIAL_RATE
    assert delays == pytest.approx([half + step, half + 2 * step, half + 3 * step])
    assert not {"late0", "late1", "late2"} & gate.queued and len(gate.queued) == MAX_QUEUED
    # the backlog drains no sooner for being asked later: paced after that, or after the last
    assert gate.arrive("later", 11.0) == pytest.approx(half + step)
    assert gate.arrive("next", 11.0) == pytest.approx(half + 2 * step)


def test_a_resent_copy_of_a_queued_registration_is_dropped() -> None:
    gate = RegistrationGate()
    assert gate.arrive("agent-1", 0.0) is None
    assert gate.arrive("agent-1", 0.0) == 0.0  # the copy: dropped, the queued one is answered
    gate.handled("agent-1", 10.0)
    assert gate.arrive("agent-1", 10.0) is None  # answered: a new one queues again


def test_the_rate_is_measured_while_a_storm_waits() -> None:
    gate = RegistrationGate(max_queued=5_000)
    _fill(gate, 5_000)
    now = 100.0
    for i in range(3_000):  # 4,000 answered per second, with more than 1,000 still waiting
        now += 0.00025
        gate.handled(f"a{i}", now)
    assert gate.rate > 3_000.0
    _fill(gate, 3_000, prefix="b")  # room again, as they were answered
    delay = gate.arrive("late", now)
    assert delay is not None and delay < 2_500 / 3_000.0 + 0.01  # half the bound at that rate


def test_a_trickle_does_not_lower_the_rate_and_it_never_falls_below_the_floor() -> None:
    gate = RegistrationGate()
    for i in range(100):  # one registration every 10 s, beside other work
        assert gate.arrive(f"a{i}", 10.0 * i) is None
        gate.handled(f"a{i}", 10.0 * i)
    assert gate.rate == INITIAL_RATE
    slow = RegistrationGate(max_queued=3_000)
    _fill(slow, 3_000)
    now = 0.0
    for i in range(1_900):  # 100 answered per second
        now += 0.01
        slow.handled(f"a{i}", now)
    assert slow.rate == MIN_RATE


def test_the_delay_is_bounded() -> None:
    gate = RegistrationGate(max_queued=1_000, rate=MIN_RATE)  # 40,000 more: 40 s of returns
    _fill(gate, 1_000)
    delays = [gate.arrive(f"late{i}", 0.0) for i in range(40_000)]
    assert max(d for d in delays if d is not None) == MAX_DELAY


def test_an_agent_that_does_not_read_retry_registration_is_queued_anyway() -> None:
    gate = RegistrationGate(max_queued=1_000)
    _fill(gate, 1_000)
    assert gate.arrive("old-agent", 0.0, may_put_off=False) is None
    assert "old-agent" in gate.queued
    assert gate.arrive("old-agent", 0.0, may_put_off=False) == 0.0  # its copies are still dropped
