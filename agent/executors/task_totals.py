"""A finished task's CPU time and peak memory: its container cgroup's totals, read before the
container is destroyed, completed by the rusage of its process where the cgroup does not tell."""

from __future__ import annotations

import structlog
from agora.agent.containers.cgroups import CgroupError, Cgroups, Totals
from agora.agent.containers.containerizer import container_name
from agora.agent.containers.isolation import ContainerConfig
from agora.sdk.ids import FrameworkID, TaskID

__all__ = ["ContainerTotals"]

log = structlog.get_logger(__name__)


class ContainerTotals:
    """Reads the totals of a framework's task containers, which ``config`` makes (their cgroup
    hierarchy is found on first use; without cgroup isolators, or the hierarchy, there are none)."""

    def __init__(self, config: ContainerConfig, framework_id: FrameworkID) -> None:
        self._config = config
        self._framework_id = framework_id
        self._cgroups: Cgroups | None = None
        self._detected = False

    def final(self, task_id: TaskID, measured: Totals) -> Totals:
        """The totals of the task's container cgroup, if it has one; what the cgroup does not
        tell is taken from ``measured`` (rusage)."""
        if not self._config.cgroup_controllers:
            return measured
        if not self._detected:
            self._detected = True
            try:
                self._cgroups = Cgroups.detect(self._config.cgroups_root)
            except CgroupError as exc:
                log.warning("task_totals_unavailable", error=str(exc))
        if self._cgroups is None:
            return measured
        try:
            cgroup = self._cgroups.open(container_name(self._framework_id, task_id))
            totals = cgroup.totals() if cgroup is not None else None
        except (OSError, CgroupError) as exc:
            log.warning("task_totals_unreadable", task_id=task_id, error=str(exc))
            totals = None
        if totals is None:
            return measured
        return Totals(
            measured.cpu_seconds if totals.cpu_seconds is None else totals.cpu_seconds,
            measured.max_rss_bytes if totals.max_rss_bytes is None else totals.max_rss_bytes,
        )
