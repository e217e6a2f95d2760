"""The agent's ``disk/du`` isolator, the shell half: measure sandboxes, feed the core.

Every ``--container-disk-watermark-interval`` (Mesos's default: 15 s) the sandbox of every
container the core names (``Agent.disk_targets``) is measured in a worker thread, as ``du``
would: the blocks allocated to everything under it, symlinks not followed, other file systems
(mounts) not entered, hard links counted once, and at most ``max_entries`` entries per sandbox
(past that the size is a lower bound, which still catches a sandbox far over its limit). The
sizes go to the core (``Agent.disk_usage``), which kills what is over its ``disk``, unless
``--no-enforce-container-disk-quota``; the latest sizes ride on the heartbeat's container usage
(``disk_used_bytes``, ``disk_limit_bytes``: :meth:`DiskIsolator.annotate`).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import structlog
from agora.agent.core import Agent
from agora.agent.core.limits import DiskKey, DiskTarget
from agora.sdk.messages import ContainerUsage
from msgspec.structs import replace

__all__ = ["DEFAULT_MAX_ENTRIES", "DiskIsolator", "DiskUse", "sandbox_size"]

log = structlog.get_logger(__name__)

#: Entries visited per sandbox at most, per measurement.
DEFAULT_MAX_ENTRIES: Final = 200_000


def sandbox_size(path: str, max_entries: int = DEFAULT_MAX_ENTRIES) -> tuple[int, bool]:
    """(bytes allocated under ``path``, whether every entry was counted). A missing ``path``
    is (0, True); unreadable entries are skipped."""
    try:
        top = os.lstat(path)
    except OSError:
        return 0, True
    total = top.st_blocks * 512
    if not stat.S_ISDIR(top.st_mode):
        return total, True
    device = top.st_dev
    seen: set[tuple[int, int]] = set()
    stack = [path]
    visited = 0
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    visited += 1
                    if visited > max_entries:
                        return total, False
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_dev != device:
                        continue  # a mount point: not this sandbox's disk
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        inode = (info.st_dev, info.st_ino)
                        if inode in seen:
                            continue
                        seen.add(inode)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, True


@dataclass(frozen=True, slots=True)
class DiskUse:
    """One container's latest measurement (limit 0: none; complete False: a lower bound)."""

    used_bytes: int
    limit_bytes: int
    complete: bool
    when: float


def _measure(
    work_dir: str, targets: list[DiskTarget], max_entries: int
) -> dict[DiskKey, tuple[int, bool]]:
    return {
        target.key: sandbox_size(os.path.join(work_dir, target.sandbox), max_entries)
        for target in targets
    }


class DiskIsolator:
    """``core()`` is the daemon's current core; ``feed(sizes)`` hands sizes to
    ``Agent.disk_usage`` through the daemon (journal, then actions)."""

    def __init__(
        self,
        work_dir: str,
        interval: float,
        enforce: bool,
        core: Callable[[], Agent],
        feed: Callable[[Mapping[DiskKey, int]], None],
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._work_dir = work_dir
        self._interval = interval
        self._enforce = enforce
        self._core = core
        self._feed = feed
        self._max_entries = max_entries
        #: The latest measurement of every container measured last time.
        self.latest: dict[DiskKey, DiskUse] = {}

    def annotate(self, usage: tuple[ContainerUsage, ...]) -> tuple[ContainerUsage, ...]:
        """A heartbeat's container usage with the latest sandbox sizes: on the containers it
        has, and for measured containers it lacks (an agent without cgroups)."""
        if not self.latest:
            return usage
        out = []
        done = set()
        for u in usage:
            key = (u.framework_id, u.executor_id, u.task_id)
            disk = self.latest.get(key)
            if disk is not None:
                done.add(key)
                u = replace(u, disk_used_bytes=disk.used_bytes, disk_limit_bytes=disk.limit_bytes)
            out.append(u)
        for (fid, eid, tid), disk in self.latest.items():
            if (fid, eid, tid) not in done:
                out.append(
                    ContainerUsage(
                        framework_id=fid,
                        executor_id=eid,
                        task_id=tid,
                        disk_used_bytes=disk.used_bytes,
                        disk_limit_bytes=disk.limit_bytes,
                        timestamp=disk.when,
                    )
                )
        return tuple(out)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.measure_once()
            except Exception:
                log.exception("disk_measure_failed")

    async def measure_once(self) -> None:
        targets = self._core().disk_targets()
        if not targets:
            self.latest = {}
            return
        sizes = await asyncio.to_thread(_measure, self._work_dir, targets, self._max_entries)
        now = time.time()
        self.latest = {
            t.key: DiskUse(sizes[t.key][0], t.limit_bytes, sizes[t.key][1], now) for t in targets
        }
        for t in targets:
            used, complete = sizes[t.key]
            if 0 < t.limit_bytes < used:
                log.warning(
                    "container_disk_limit_exceeded",
                    framework_id=t.framework_id,
                    executor_id=t.executor_id,
                    task_id=t.task_id,
                    used_bytes=used,
                    limit_bytes=t.limit_bytes,
                    complete=complete,
                    enforced=self._enforce,
                )
        if self._enforce:
            self._feed({key: size for key, (size, _) in sizes.items()})
