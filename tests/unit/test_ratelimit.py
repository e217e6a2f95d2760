"""The per-key log limiter: a burst, then ``rate`` a second per key, bounded memory."""

from __future__ import annotations

import pytest
from agora.sdk.daemon.ratelimit import KeyedLogLimiter, Suppressed


def test_a_burst_is_allowed_then_suppressed_then_refilled() -> None:
    limiter = KeyedLogLimiter(rate=3.0, burst=3, summary_interval=1.0)
    allowed = [limiter.allow("peer-a", 10.0) for _ in range(500)]
    assert allowed.count(True) == 3
    assert allowed[:3] == [True] * 3
    # A third of a second later one token is back, and only one.
    assert limiter.allow("peer-a", 10.34)
    assert not limiter.allow("peer-a", 10.34)
    # Never more than the burst, however long the peer stayed quiet.
    assert [limiter.allow("peer-a", 1000.0) for _ in range(5)] == [True] * 3 + [False] * 2


def test_keys_are_limited_independently() -> None:
    limiter = KeyedLogLimiter(rate=1.0, burst=2)
    assert [limiter.allow("a", 0.0) for _ in range(3)] == [True, True, False]
    assert [limiter.allow("b", 0.0) for _ in range(3)] == [True, True, False]


def test_a_steady_flood_logs_at_most_rate_a_second() -> None:
    limiter = KeyedLogLimiter(rate=3.0, burst=3)
    # 1000 events a second for 10 seconds: the burst plus 3 a second.
    allowed = sum(limiter.allow("p", i / 1000) for i in range(10_000))
    assert 3 + 29 <= allowed <= 3 + 30


def test_summary_counts_what_was_suppressed_once_per_interval() -> None:
    limiter = KeyedLogLimiter(rate=3.0, burst=3, summary_interval=1.0)
    assert limiter.summary(0.0) is None  # nothing suppressed: nothing to say
    for _ in range(100):
        limiter.allow("a", 0.0)
    for _ in range(10):
        limiter.allow("b", 0.0)
    first = limiter.summary(0.0)
    assert first == Suppressed(total=97 + 7, keys=2, top=(("a", 97), ("b", 7)))
    assert first.log_fields() == {"count": 104, "peers": 2, "top": {"a": 97, "b": 7}}
    limiter.allow("a", 0.0)
    assert limiter.summary(0.5) is None  # within the interval
    assert limiter.summary(1.0) == Suppressed(total=1, keys=1, top=(("a", 1),))
    assert limiter.summary(5.0) is None  # counts started again from zero


def test_tracked_keys_are_bounded_and_evicted_ones_still_summarised() -> None:
    limiter = KeyedLogLimiter(rate=1.0, burst=1, max_keys=8)
    for i in range(10_000):
        key = f"peer-{i}"
        assert limiter.allow(key, 0.0)  # a new (or evicted) key starts with a full bucket
        assert not limiter.allow(key, 0.0)
        assert len(limiter) <= 8
    assert len(limiter) == 8
    summary = limiter.summary(0.0, top=3)
    assert summary is not None
    assert summary.total == 10_000
    assert summary.keys == 10_000
    assert len(summary.top) == 3


def test_least_recently_seen_key_is_evicted_first() -> None:
    limiter = KeyedLogLimiter(rate=1.0, burst=1, max_keys=2)
    assert limiter.allow("a", 0.0)
    assert limiter.allow("b", 0.0)
    assert not limiter.allow("a", 0.0)  # a is now the most recently seen
    assert limiter.allow("c", 0.0)  # evicts b
    assert not limiter.allow("a", 0.0)  # a kept its (empty) bucket
    assert limiter.allow("b", 0.0)  # b starts over


def test_counts_rank_the_noisiest_tracked_keys() -> None:
    limiter = KeyedLogLimiter(max_keys=3)
    for key, n in (("a", 5), ("b", 50), ("c", 1), ("d", 7)):
        for _ in range(n):
            limiter.allow(key, 0.0)
    assert limiter.counts(top=2) == [("b", 50), ("d", 7)]  # a was evicted
    assert limiter.counts(top=10) == [("b", 50), ("d", 7), ("c", 1)]


@pytest.mark.parametrize(
    "kwargs", [{"rate": 0.0}, {"burst": 0}, {"max_keys": 0}, {"summary_interval": -1.0}]
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        KeyedLogLimiter(**kwargs)  # type: ignore[arg-type]
