"""Container usage for the agent's heartbeat: each live command task's cgroup, sampled when the
master pings (PONG carries it; the master shows it per task)."""

from __future__ import annotations

from collections.abc import Iterable

from agora.agent.containers.cgroups import CgroupError, Cgroups
from agora.agent.containers.containerizer import container_name
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import ContainerUsage

__all__ = ["sample_usage"]


def sample_usage(
    cgroups: Cgroups,
    tasks: Iterable[tuple[FrameworkID, ExecutorID, TaskID]],
    now: float,
) -> tuple[ContainerUsage, ...]:
    """The usage of every task container of ``tasks`` that exists (tasks run by the built-in
    executor each have one, named by :func:`container_name`)."""
    found = []
    for framework_id, executor_id, task_id in tasks:
        cgroup = cgroups.open(container_name(framework_id, task_id))
        if cgroup is None:
            continue
        try:
            usage = cgroup.usage()
        except (OSError, CgroupError):
            continue
        found.append(
            ContainerUsage(
                framework_id=framework_id,
                executor_id=executor_id,
                task_id=task_id,
                cpu_seconds=max(0.0, usage.cpu_seconds),
                rss_bytes=max(0, usage.rss_bytes),
                mem_limit_bytes=max(0, usage.mem_limit_bytes),
                cpu_limit=max(0.0, usage.cpu_limit),
                timestamp=now,
            )
        )
    return tuple(found)
