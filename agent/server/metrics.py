"""The agent's Prometheus metrics, read from the core and the daemon's counters at scrape time.

:class:`AgentCollector` counts the core's tasks, executors and held resources and reads the plain
counters the daemon bumps as it runs (:class:`AgentCounters`). It goes in a registry of the app's
own (:func:`make_registry`), never the process-global one. Imported only by the HTTP API, so an
agent without ``--http-port`` never loads prometheus_client.

Reported (all gauges unless marked counter):

- ``agora_agent_registered``: 1 while the master has accepted this agent's (re-)registration.
- ``agora_agent_uptime_seconds``: since the daemon started.
- ``agora_agent_tasks{state}``: tasks the agent holds (live, or final and not yet acknowledged),
  every task state listed, 0s included.
- ``agora_agent_executors{state}``: executors by state (LAUNCHING, RUNNING, TERMINATING,
  RECOVERING), 0s included.
- ``agora_agent_resources_total{resource}``, ``agora_agent_resources_used{resource}``: cpus, mem,
  disk, gpus the agent offers, and what its live tasks and custom executors hold.
- ``agora_agent_status_updates_pending``: status updates not yet acknowledged by the master.
- ``agora_agent_container_cpu_seconds``, ``agora_agent_container_memory_rss_bytes``,
  ``agora_agent_container_disk_used_bytes``,
  ``agora_agent_containers_sampled``: sums over the containers in the latest usage sample (taken
  at the master's last PING); absent while there is none.
- ``agora_agent_messages_received`` and ``agora_agent_bad_frames_received`` (counters, exposed
  with ``_total``): frames from the master and executors that decoded, and that did not.
- ``agora_agent_bad_frames_by_peer{peer}``: undecodable frames from each of the (at most 10)
  peers with the most, among the few hundred that sent one most recently; ``peer`` is
  ``master`` or an executor connection's id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from agora.agent.core import Agent, ExecutorState, is_final
from agora.sdk.messages import ContainerUsage, TaskState
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["SCALARS", "AgentCollector", "AgentCounters", "make_registry"]

#: The scalar resources reported in totals.
SCALARS = ("cpus", "mem", "disk", "gpus")


class AgentCounters(Protocol):
    """What the daemon counts as it runs: plain values, read at scrape time."""

    @property
    def messages_received(self) -> int: ...

    @property
    def bad_frames_received(self) -> int: ...

    @property
    def latest_usage(self) -> tuple[ContainerUsage, ...]: ...

    def bad_frames_by_peer(self) -> list[tuple[str, int]]: ...

    def uptime(self) -> float: ...


class AgentCollector(Collector):
    """Reads ``core()`` (None: no core yet) and ``counters`` (None: no daemon) at each scrape."""

    def __init__(
        self, core: Callable[[], Agent | None], counters: AgentCounters | None = None
    ) -> None:
        self._core = core
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        core = self._core()
        registered = core is not None and core.registered
        yield _gauge("agora_agent_registered", "1 if registered with a master", registered)
        counters = self._counters
        if counters is not None:
            yield _gauge(
                "agora_agent_uptime_seconds", "seconds since the daemon started", counters.uptime()
            )
        if core is not None:
            yield from _core_metrics(core)
        if counters is not None:
            yield from _usage_metrics(counters.latest_usage)
            yield CounterMetricFamily(
                "agora_agent_messages_received",
                "frames received from the master and executors",
                counters.messages_received,
            )
            yield CounterMetricFamily(
                "agora_agent_bad_frames_received",
                "undecodable frames received from the master and executors",
                counters.bad_frames_received,
            )
            by_peer = GaugeMetricFamily(
                "agora_agent_bad_frames_by_peer",
                "undecodable frames from each of the (at most 10) peers with the most, among the"
                " few hundred that sent one most recently (bounded: a peer may drop out)",
                labels=["peer"],
            )
            for peer, frames in counters.bad_frames_by_peer():
                by_peer.add_metric([peer], frames)
            yield by_peer


def _core_metrics(core: Agent) -> Iterator[Metric]:
    tasks = dict.fromkeys((s.value for s in TaskState), 0)
    used_milli = dict.fromkeys(SCALARS, 0)
    for task in core.tasks().values():
        tasks[task.state.value] += 1
        if not is_final(task.state):
            _add(used_milli, task.info.resources.scalar_totals_milli())
    executors = dict.fromkeys((s.value for s in ExecutorState), 0)
    for ex in core.executors().values():
        executors[ex.state.value] += 1
        if not ex.builtin:  # the built-in executor holds nothing of its own
            _add(used_milli, ex.info.resources.scalar_totals_milli())
    total_milli = dict.fromkeys(SCALARS, 0)
    _add(total_milli, core.config.resources.scalar_totals_milli())
    yield _labelled("agora_agent_tasks", "tasks on this agent, by state", "state", tasks)
    yield _labelled(
        "agora_agent_executors", "executors on this agent, by state", "state", executors
    )
    yield _labelled(
        "agora_agent_resources_total",
        "scalar resources this agent offers",
        "resource",
        {name: milli / 1000 for name, milli in total_milli.items()},
    )
    yield _labelled(
        "agora_agent_resources_used",
        "scalar resources held by live tasks and custom executors",
        "resource",
        {name: milli / 1000 for name, milli in used_milli.items()},
    )
    yield _gauge(
        "agora_agent_status_updates_pending",
        "status updates not yet acknowledged by the master",
        core.unacknowledged_updates(),
    )


def _usage_metrics(usage: tuple[ContainerUsage, ...]) -> Iterator[Metric]:
    if not usage:
        return
    yield _gauge(
        "agora_agent_containers_sampled", "containers in the latest usage sample", len(usage)
    )
    yield _gauge(
        "agora_agent_container_cpu_seconds",
        "CPU time of the containers in the latest usage sample, summed",
        sum(u.cpu_seconds for u in usage),
    )
    yield _gauge(
        "agora_agent_container_memory_rss_bytes",
        "resident memory of the containers in the latest usage sample, summed",
        sum(u.rss_bytes for u in usage),
    )
    yield _gauge(
        "agora_agent_container_disk_used_bytes",
        "sandbox size of the containers in the latest usage sample (disk/du isolator), summed",
        sum(u.disk_used_bytes for u in usage),
    )


def _add(into: dict[str, int], amounts: dict[str, int]) -> None:
    for name in into:
        into[name] += amounts.get(name, 0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _labelled(name: str, doc: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def make_registry(
    core: Callable[[], Agent | None], counters: AgentCounters | None = None
) -> CollectorRegistry:
    """A registry of the app's own, holding only the agent's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(core, counters))
    return registry
