"""The master's numbers: the counts of its state view, daemon counters, and a Prometheus registry.

The daemon's receive path only bumps plain ints on :class:`DaemonStats`; everything is read at
scrape time by :class:`MasterCollector`, registered in a registry of the daemon's own (never the
process-global one), so two masters in one process do not mix their metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from agora.master.core import Master
from agora.master.core.view import SCALARS, Counts
from agora.master.server.stats import ALLOCATION_BUCKETS, DaemonStats
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["SCALARS", "Counts", "DaemonStats", "MasterCollector", "count", "make_registry"]


def count(core: Master) -> Counts:
    """Count the core's state (see :meth:`StateView.counts`): what ``/state/summary`` and the
    metrics report."""
    return core.view().counts()


class MasterCollector(Collector):
    """Reads the core and the daemon's counters at each scrape."""

    def __init__(self, core: Callable[[], Master | None], stats: DaemonStats) -> None:
        self._core = core
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        core = self._core()
        yield _gauge(
            "agora_master_elected",
            "1 while this master leads: elected, active in its term and holding its lease",
            core is not None,
        )
        yield _gauge(
            "agora_master_uptime_seconds", "seconds since the daemon started", stats.uptime()
        )
        yield CounterMetricFamily(
            "agora_master_messages_received", "messages received", stats.messages_received
        )
        yield CounterMetricFamily(
            "agora_master_bad_frames_received",
            "undecodable frames received",
            stats.bad_frames_received,
        )
        by_peer = GaugeMetricFamily(
            "agora_master_bad_frames_by_peer",
            "undecodable frames from each of the (at most 10) peers with the most, among the few"
            " hundred that sent one most recently (bounded: a peer may drop out)",
            labels=["peer"],
        )
        for peer, frames in stats.bad_frames_by_peer():
            by_peer.add_metric([peer], frames)
        yield by_peer
        yield CounterMetricFamily(
            "agora_master_messages_dropped",
            "messages not delivered (peer gone, send failed) or dropped unhandled",
            stats.messages_dropped,
        )
        yield CounterMetricFamily(
            "agora_master_registrations_put_off",
            "agent registrations answered RETRY_REGISTRATION: more were waiting than the master"
            " answers promptly",
            stats.registrations_put_off,
        )
        yield CounterMetricFamily(
            "agora_master_registrations_coalesced",
            "re-sent copies of an agent registration still waiting, dropped",
            stats.registrations_coalesced,
        )
        yield _gauge(
            "agora_master_event_queue_size",
            "messages received and not handled yet",
            stats.queue_size(),
        )
        if core is not None:  # a standby has no cluster state to count
            yield from self._leader_metrics(core, stats)

    def _leader_metrics(self, core: Master, stats: DaemonStats) -> Iterator[Metric]:
        counts = count(core)
        yield _gauge("agora_master_epoch", "the master's epoch (election term)", core.epoch)
        yield _gauge(
            "agora_master_agents_active", "registered, reachable agents", counts.agents["ACTIVE"]
        )
        yield _gauge(
            "agora_master_agents_unreachable",
            "agents marked unreachable",
            counts.agents["UNREACHABLE"],
        )
        yield _gauge(
            "agora_master_agents_disconnected",
            "active agents that missed the last health-check ping (not yet unreachable)",
            counts.agents["DISCONNECTED"],
        )
        yield _gauge(
            "agora_master_agents_draining",
            "agents an operator drained (no new offers)",
            counts.agents["DRAINING"],
        )
        yield _gauge(
            "agora_master_agents_drained",
            "draining agents with no task or executor left (ready for maintenance)",
            counts.agents["DRAINED"],
        )
        fws = counts.frameworks
        yield _gauge("agora_master_frameworks_active", "subscribed frameworks", fws["active"])
        yield _gauge(
            "agora_master_frameworks_inactive",
            "completed frameworks still remembered",
            fws["inactive"],
        )
        yield _gauge(
            "agora_master_frameworks_connected", "active frameworks connected", fws["connected"]
        )
        tasks = GaugeMetricFamily(
            "agora_master_tasks", "tasks the master knows, by state", labels=["state"]
        )
        for state, n in counts.tasks.items():
            tasks.add_metric([state], n)
        yield tasks
        yield _gauge(
            "agora_master_offers_outstanding", "offers sent and not yet answered", counts.offers
        )
        for kind, amounts in (("total", counts.total), ("allocated", counts.allocated)):
            family = GaugeMetricFamily(
                f"agora_master_resources_{kind}",
                f"{kind} scalar resources over registered agents",
                labels=["resource"],
            )
            for name, value in amounts.items():
                family.add_metric([name], value)
            yield family
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*ALLOCATION_BUCKETS, None), stats.allocation_buckets, strict=True):
            running += n
            cumulative.append(("+Inf" if bound is None else repr(bound), running))
        yield HistogramMetricFamily(
            "agora_master_allocation_run_seconds",
            "time spent in Master.tick / end_burst",
            buckets=cumulative,
            sum_value=stats.allocation_sum,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def make_registry(core: Callable[[], Master | None], stats: DaemonStats) -> CollectorRegistry:
    """A registry of the daemon's own, holding only the master's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MasterCollector(core, stats))
    return registry
