"""Per-key rate limiting of log lines, pure: time is an argument.

A daemon that logs every bad frame lets any peer fill its log (and its disk) at line rate.
:class:`KeyedLogLimiter` decides, per key (a peer), whether this event may be logged: a token
bucket per key lets a short burst through, then at most ``rate`` lines a second. Events it
refuses are counted, and :meth:`KeyedLogLimiter.summary` hands them back at most once per
``summary_interval`` so the daemon can log one line saying how many it kept quiet.

Memory is bounded: at most ``max_keys`` keys are tracked, the least recently seen evicted first,
so a flood from ever new peers cannot grow it. An evicted key starts again with a full bucket;
its suppressed events still count in the next summary.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["KeyedLogLimiter", "Suppressed"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    #: Events seen for this key while tracked (allowed or not).
    events: int = 0
    #: Events refused since the last summary.
    suppressed: int = 0


@dataclass(frozen=True, slots=True)
class Suppressed:
    """What was kept quiet since the previous summary."""

    #: Events refused, over all keys (evicted ones included).
    total: int
    #: How many keys had some refused.
    keys: int
    #: The keys with the most refused events, most first (at most ``top`` of them).
    top: tuple[tuple[str, int], ...] = field(default=())

    def log_fields(self) -> dict[str, object]:
        """The summary as key-value log fields: ``count``, ``peers`` and the ``top`` peers."""
        return {"count": self.total, "peers": self.keys, "top": dict(self.top)}


class KeyedLogLimiter:
    """A token bucket per key: ``burst`` events at once, then ``rate`` a second."""

    def __init__(
        self,
        rate: float = 3.0,
        burst: int = 3,
        max_keys: int = 256,
        summary_interval: float = 1.0,
    ) -> None:
        if rate <= 0 or burst < 1 or max_keys < 1 or summary_interval < 0:
            raise ValueError("rate must be > 0, burst and max_keys >= 1, summary_interval >= 0")
        self._rate = rate
        self._burst = float(burst)
        self._max_keys = max_keys
        self._summary_interval = summary_interval
        #: key -> its bucket; order = least recently seen first.
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        #: Events refused for keys since evicted, not yet summarised.
        self._evicted_suppressed = 0
        self._evicted_keys = 0
        self._last_summary: float | None = None

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: str, now: float) -> bool:
        """Count one event for ``key`` at ``now``; True when it may be logged."""
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = _Bucket(self._burst, now)
            if len(buckets) > self._max_keys:
                _, evicted = buckets.popitem(last=False)
                if evicted.suppressed:
                    self._evicted_suppressed += evicted.suppressed
                    self._evicted_keys += 1
        else:
            buckets.move_to_end(key)
            elapsed = max(0.0, now - bucket.at)
            bucket.tokens = min(self._burst, bucket.tokens + elapsed * self._rate)
            bucket.at = now
        bucket.events += 1
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return True
        bucket.suppressed += 1
        return False

    def counts(self, top: int) -> list[tuple[str, int]]:
        """The ``top`` tracked keys with the most events, most first (ties: most recent)."""
        ranked = sorted(
            ((key, b.events) for key, b in reversed(self._buckets.items())),
            key=lambda item: item[1],
            reverse=True,
        )
        return ranked[:top]

    def summary(self, now: float, top: int = 5) -> Suppressed | None:
        """What was refused since the last summary, if anything was and ``summary_interval``
        has passed since then; the counts start again from zero."""
        last = self._last_summary
        if last is not None and now - last < self._summary_interval:
            return None
        refused = [(key, b.suppressed) for key, b in self._buckets.items() if b.suppressed]
        total = self._evicted_suppressed + sum(n for _, n in refused)
        if total == 0:
            return None
        for key, _ in refused:
            self._buckets[key].suppressed = 0
        keys = len(refused) + self._evicted_keys
        self._evicted_suppressed = self._evicted_keys = 0
        self._last_summary = now
        refused.sort(key=lambda item: item[1], reverse=True)
        return Suppressed(total=total, keys=keys, top=tuple(refused[:top]))
