"""cgroup v1: one hierarchy per controller (cpu and cpuacct possibly co-mounted), limits in
cpu.shares / cpu.cfs_* / memory.limit_in_bytes (+memsw) / pids.max, freezer for destroy."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

import structlog
from agora.agent.containers._cgroup_base import (
    CFS_PERIOD_US,
    Cgroup,
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

CONTROLLERS = ("cpu", "cpuacct", "memory", "pids", "freezer", "devices")
_UNLIMITED = 1 << 62  # limit_in_bytes reads back PAGE_COUNTER_MAX * page size when unset


def own_dirs(
    mounts: Iterable[tuple[str, str, frozenset[str]]], own: Mapping[str, str]
) -> dict[str, str]:
    """controller -> this process's cgroup directory in that controller's hierarchy.

    ``mounts`` holds (mountpoint, fstype, options); ``own`` maps controller -> path from
    /proc/self/cgroup. When mountpoint + path does not exist (the mount shows only our own
    subtree, as in a container without a cgroup namespace) the mountpoint itself is used."""
    out: dict[str, str] = {}
    for mountpoint, fstype, options in mounts:
        if fstype != "cgroup":
            continue
        for controller in CONTROLLERS:
            if controller not in options or controller in out or controller not in own:
                continue
            path = os.path.join(mountpoint, own[controller].lstrip("/"))
            if not os.path.isdir(path):
                log.info("cgroup path not under mount, using mount root", path=path)
                path = mountpoint
            out[controller] = path
    return out


class V1Cgroup(Cgroup):
    def apply(self, limits: Limits, *, fresh: bool) -> None:
        cpu = self._dirs.get("cpu")
        if cpu is not None:
            if limits.cpus is not None or not fresh:
                write(self._fs, os.path.join(cpu, "cpu.shares"), str(limits.cpu_shares()))
            if limits.cfs_quota or not fresh:
                quota = str(limits.cfs_quota_us()) if limits.cfs_quota else "-1"
                period = os.path.join(cpu, "cpu.cfs_period_us")
                if write_optional(self._fs, period, str(CFS_PERIOD_US)):
                    write(self._fs, os.path.join(cpu, "cpu.cfs_quota_us"), quota)
                elif limits.cfs_quota:
                    log.warning("no CFS bandwidth control, cpu quota not enforced", cgroup=cpu)
        memory = self._dirs.get("memory")
        if memory is not None and (limits.mem_bytes is not None or not fresh):
            self._set_memory(memory, limits.mem_bytes, fresh=fresh)
        pids = self._dirs.get("pids")
        if pids is not None and (limits.pids_max is not None or not fresh):
            write(self._fs, os.path.join(pids, "pids.max"), str(limits.pids_max or "max"))
        devices = self._dirs.get("devices")
        if devices is not None and fresh:
            for rule in limits.deny_devices:
                write(self._fs, os.path.join(devices, "devices.deny"), rule)

    def _set_memory(self, memory: str, mem_bytes: int | None, *, fresh: bool) -> None:
        # The kernel keeps limit_in_bytes <= memsw.limit_in_bytes at every step: shrink the
        # memory limit first, grow the memsw limit first. A fresh cgroup has both unlimited.
        limit = os.path.join(memory, "memory.limit_in_bytes")
        memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
        value = str(mem_bytes) if mem_bytes is not None else "-1"
        grow = not fresh and (mem_bytes is None or mem_bytes > (read_int(limit) or 0))
        if grow:
            write_optional(self._fs, memsw, value)
            write(self._fs, limit, value)
        else:
            write(self._fs, limit, value)
            write_optional(self._fs, memsw, value)

    def usage(self) -> Usage:
        cpu_seconds = 0.0
        cpuacct = self._dirs.get("cpuacct")
        if cpuacct is not None:
            cpu_seconds = (read_int(os.path.join(cpuacct, "cpuacct.usage")) or 0) / 1e9
        rss = limit = oom_kills = 0
        memory = self._dirs.get("memory")
        if memory is not None:
            stat = read_keyed(os.path.join(memory, "memory.stat"))
            rss = stat.get("total_rss", stat.get("rss", -1))
            if rss < 0:
                rss = read_int(os.path.join(memory, "memory.usage_in_bytes")) or 0
            limit = read_int(os.path.join(memory, "memory.limit_in_bytes")) or 0
            limit = 0 if limit >= _UNLIMITED else limit
            oom_kills = read_keyed(os.path.join(memory, "memory.oom_control")).get("oom_kill", 0)
        return Usage(
            cpu_seconds=cpu_seconds,
            rss_bytes=rss,
            mem_limit_bytes=limit,
            cpu_limit=self._cpu_limit(),
            oom_kills=oom_kills,
        )

    def totals(self) -> Totals:
        cpuacct = self._dirs.get("cpuacct")
        memory = self._dirs.get("memory")
        usage = read_int(os.path.join(cpuacct, "cpuacct.usage")) if cpuacct else None
        peak = read_int(os.path.join(memory, "memory.max_usage_in_bytes")) if memory else None
        return Totals(
            cpu_seconds=None if usage is None else max(0, usage) / 1e9,
            max_rss_bytes=None if peak is None else max(0, peak),
        )

    def _cpu_limit(self) -> float:
        cpu = self._dirs.get("cpu")
        if cpu is None:
            return 0.0
        quota = read_int(os.path.join(cpu, "cpu.cfs_quota_us")) or -1
        period = read_int(os.path.join(cpu, "cpu.cfs_period_us")) or 0
        if quota > 0 and period > 0:
            return quota / period
        return (read_int(os.path.join(cpu, "cpu.shares")) or 0) / 1024

    def oom_killed(self) -> bool:
        memory = self._dirs.get("memory")
        if memory is None:
            return False
        return read_keyed(os.path.join(memory, "memory.oom_control")).get("oom_kill", 0) > 0

    def _stop_all(self, tree: list[str], deadline: float) -> None:
        freezer = self._dirs.get("freezer")
        if freezer is None or not os.path.isdir(freezer):
            super()._stop_all(tree, deadline)
            return
        # Frozen processes cannot fork, so one pass of SIGKILL catches them all; they die on thaw.
        state = os.path.join(freezer, "freezer.state")
        write(self._fs, state, "FROZEN")
        try:
            give_up = min(deadline, time.monotonic() + 1.0)
            delay = 0.0002
            while (read_optional(state) or "").strip() != "FROZEN" and time.monotonic() < give_up:
                time.sleep(delay)
                delay = min(delay * 2, 0.02)
            self._kill(self._tree_pids(tree))
        finally:
            write(self._fs, state, "THAWED")
