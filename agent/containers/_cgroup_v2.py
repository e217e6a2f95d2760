"""cgroup v2: one directory per cgroup, controllers delegated down through
cgroup.subtree_control, limits in cpu.weight / cpu.max / memory.max (+swap.max) / pids.max,
cgroup.kill (or cgroup.freeze) for destroy."""

from __future__ import annotations

import os
import time

import structlog
from agora.agent.containers._cgroup_base import (
    CFS_PERIOD_US,
    Cgroup,
    CgroupError,
    CgroupFs,
    Limits,
    Totals,
    Usage,
    read_int,
    read_keyed,
    read_optional,
    write,
    write_optional,
)

log = structlog.get_logger(__name__)

WANTED = frozenset({"cpu", "memory", "pids"})


def delegate(fs: CgroupFs, path: str, wanted: frozenset[str] = WANTED) -> frozenset[str]:
    """Enable the wanted controllers for the children of ``path``; return those enabled.

    Fails soft (logs): a non-root cgroup holding processes cannot delegate ("no internal
    processes"), and a controller the parent does not pass down is not available."""
    available = frozenset((read_optional(os.path.join(path, "cgroup.controllers")) or "").split())
    subtree = os.path.join(path, "cgroup.subtree_control")
    enabled = frozenset((read_optional(subtree) or "").split())
    missing = (wanted & available) - enabled
    if missing:
        try:
            write(fs, subtree, " ".join(f"+{c}" for c in sorted(missing)))
        except CgroupError as e:
            log.warning("cannot enable cgroup controllers", path=subtree, error=str(e))
        enabled = frozenset((read_optional(subtree) or "").split())
    return wanted & enabled


def cpu_weight(limits: Limits) -> int:
    """cpus -> cpu.weight, 1 cpu = 100 (the default weight), as 1 cpu = 1024 shares on v1."""
    return min(10_000, max(1, round((limits.cpus or 1.0) * 100)))


class V2Cgroup(Cgroup):
    @property
    def _dir(self) -> str:
        return self._unique[0]

    def _file(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def apply(self, limits: Limits, *, fresh: bool) -> None:
        if "cpu" in self._dirs:
            if limits.cpus is not None or not fresh:
                write(self._fs, self._file("cpu.weight"), str(cpu_weight(limits)))
            if limits.cfs_quota or not fresh:
                quota = str(limits.cfs_quota_us()) if limits.cfs_quota else "max"
                write(self._fs, self._file("cpu.max"), f"{quota} {CFS_PERIOD_US}")
        if "memory" in self._dirs and (limits.mem_bytes is not None or not fresh):
            write(self._fs, self._file("memory.max"), str(limits.mem_bytes or "max"))
            swap = "0" if limits.mem_bytes else "max"
            write_optional(self._fs, self._file("memory.swap.max"), swap)
        if "pids" in self._dirs and (limits.pids_max is not None or not fresh):
            write(self._fs, self._file("pids.max"), str(limits.pids_max or "max"))

    def usage(self) -> Usage:
        cpu_seconds = read_keyed(self._file("cpu.stat")).get("usage_usec", 0) / 1e6
        rss = limit = oom_kills = 0
        if "memory" in self._dirs:
            stat = read_keyed(self._file("memory.stat"))
            rss = stat.get("anon", -1)
            if rss < 0:
                rss = read_int(self._file("memory.current")) or 0
            limit = read_int(self._file("memory.max")) or 0  # "max" reads as None
            oom_kills = read_keyed(self._file("memory.events")).get("oom_kill", 0)
        return Usage(
            cpu_seconds=cpu_seconds,
            rss_bytes=rss,
            mem_limit_bytes=limit,
            cpu_limit=self._cpu_limit(),
            oom_kills=oom_kills,
        )

    def totals(self) -> Totals:
        # cpu.stat's usage_usec is kept by every cgroup, with or without the cpu controller;
        # memory.peak needs the memory controller and Linux >= 5.19.
        usec = read_keyed(self._file("cpu.stat")).get("usage_usec")
        peak = read_int(self._file("memory.peak")) if "memory" in self._dirs else None
        return Totals(
            cpu_seconds=None if usec is None else max(0, usec) / 1e6,
            max_rss_bytes=None if peak is None else max(0, peak),
        )

    def _cpu_limit(self) -> float:
        if "cpu" not in self._dirs:
            return 0.0
        quota, _, period = (read_optional(self._file("cpu.max")) or "max").partition(" ")
        if quota.isdigit() and period.strip().isdigit() and int(period) > 0:
            return int(quota) / int(period)
        return (read_int(self._file("cpu.weight")) or 0) / 100

    def oom_killed(self) -> bool:
        if "memory" not in self._dirs:
            return False
        return read_keyed(self._file("memory.events")).get("oom_kill", 0) > 0

    def _stop_all(self, tree: list[str], deadline: float) -> None:
        # Linux >= 5.14: cgroup.kill SIGKILLs the whole subtree, forks included.
        if write_optional(self._fs, self._file("cgroup.kill"), "1"):
            return
        freeze = self._file("cgroup.freeze")
        if not write_optional(self._fs, freeze, "1"):
            super()._stop_all(tree, deadline)
            return
        try:
            give_up = min(deadline, time.monotonic() + 1.0)
            delay = 0.0002
            events = self._file("cgroup.events")
            while read_keyed(events).get("frozen") != 1 and time.monotonic() < give_up:
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
            self._kill(self._tree_pids(tree))
        finally:
            write(self._fs, freeze, "0")
