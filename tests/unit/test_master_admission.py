"""Backpressure on agent registrations (master/server/admission.py): one queued per connection,
and beyond what the master answers in QUEUE_SECONDS, a delay to tell the agent."""

from __future__ import annotations

import pytest
from agora.master.server.admission import (
    INITIAL_RATE,
    MAX_DELAY,
    MIN_QUEUE,
    QUEUE_SECONDS,
    RegistrationGate,
)


def _fill(gate: RegistrationGate, n: int, prefix: str = "a") -> None:
    for i in range(n):
        assert gate.arrive(f"{prefix}{i}", 0.0) is None


def test_registrations_queue_until_the_bound_then_are_put_off() -> None:
    gate = RegistrationGate()
    bound = int(max(MIN_QUEUE, INITIAL_RATE * QUEUE_SECONDS))
    _fill(gate, bound)
    delays = [gate.arrive(f"late{i}", 10.0) for i in range(3)]
    # from when half the backlog is answered, one return time each, paced at the rate
    step, half = 1 / INITIAL_RATE, bound / 2 / INITIAL_RATE
    assert delays == pytest.approx([half + step, half + 2 * step, half + 3 * step])
    assert not {"late0", "late1", "late2"} & gate.queued and len(gate.queued) == bound
    # the backlog drains no sooner for being asked later: paced after that, or after the last
    assert gate.arrive("later", 11.0) == pytest.approx(half + step)
    assert gate.arrive("next", 11.0) == pytest.approx(half + 2 * step)


def test_a_resent_copy_of_a_queued_registration_is_dropped() -> None:
    gate = RegistrationGate()
    assert gate.arrive("agent-1", 0.0) is None
    assert gate.arrive("agent-1", 0.0) == 0.0  # the copy: dropped, the queued one is answered
    gate.handled("agent-1", 10.0)
    assert gate.arrive("agent-1", 10.0) is None  # answered: a new one queues again


def test_the_rate_is_measured_while_registrations_wait() -> None:
    gate = RegistrationGate(rate=1000.0, queue_seconds=2.0)
    _fill(gate, 2000)
    now = 100.0
    for i in range(1500):  # 4,000 answered per second, with more still waiting
        now += 0.00025
        gate.handled(f"a{i}", now)
    assert gate.rate > 2 * 1000.0
    # the bound follows the rate: thousands more wait without anyone being put off
    _fill(gate, 4000, prefix="b")


def test_a_trickle_in_a_quiet_cluster_does_not_lower_the_rate() -> None:
    gate = RegistrationGate()
    for i in range(100):  # one registration every 10 s, nothing else waiting
        assert gate.arrive(f"a{i}", 10.0 * i) is None
        gate.handled(f"a{i}", 10.0 * i)
    assert gate.rate == INITIAL_RATE


def test_the_delay_is_bounded() -> None:
    slow = RegistrationGate()
    _fill(slow, MIN_QUEUE)
    slow._rate = 10.0  # a master answering 10 a second: 100 s of waiting, told 30 s at most
    assert slow.arrive("late", 0.0) == MAX_DELAY


def test_an_agent_that_does_not_read_retry_registration_is_queued_anyway() -> None:
    gate = RegistrationGate()
    _fill(gate, MIN_QUEUE * 2)
    assert gate.arrive("old-agent", 0.0, may_put_off=False) is None
    assert "old-agent" in gate.queued
    assert gate.arrive("old-agent", 0.0, may_put_off=False) == 0.0  # its copies are still dropped
