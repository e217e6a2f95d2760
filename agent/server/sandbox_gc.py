"""Sandbox garbage collection, the shell half: list sandboxes, read the disk, delete.

Every ``--disk-watermark-interval`` (Mesos's default: 1 min) the collector lists the sandboxes
under ``<work-dir>/frameworks`` (in a worker thread), reads the used fraction of the work dir's
file system, and asks the pure :class:`agora.agent.core.sandbox_gc.SandboxGc` (``--gc-delay``,
``--gc-disk-headroom``) which to delete, against the core's live sandboxes at that moment. Each
is renamed at once into ``<work-dir>/sandbox-gc/trash`` (atomic, in the event loop, so that no
executor launched later with the same id can find half of it) and removed from there in a
worker thread; emptied framework directories go too.

The task sandboxes collected are appended to ``<work-dir>/sandbox-gc/collected`` (time, framework,
executor, task; the newest :data:`KEEP_COLLECTED` are kept), so that the HTTP API can say a
task's output was collected rather than unknown (:func:`find_collected`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import structlog
from agora.agent.core import Agent
from agora.agent.core.sandbox_gc import GcPlan, SandboxGc, task_of

__all__ = [
    "KEEP_COLLECTED",
    "SandboxCollector",
    "disk_usage_fraction",
    "find_collected",
    "list_sandboxes",
]

log = structlog.get_logger(__name__)

#: Collected task sandboxes remembered (for ``agora logs``), newest first.
KEEP_COLLECTED: Final = 20_000
_GC_DIR: Final = "sandbox-gc"
_COLLECTED: Final = "collected"


def disk_usage_fraction(path: str) -> float:
    """The used fraction of the file system holding ``path``, as Mesos reckons it."""
    vfs = os.statvfs(path)
    if vfs.f_blocks <= 0:
        return 0.0
    return (vfs.f_blocks - vfs.f_bfree) / vfs.f_blocks


def _newest_mtime(path: str) -> float:
    """The newest mtime of a directory and of what it holds directly (its output files are
    written long after the directory changed last)."""
    newest = os.lstat(path).st_mtime
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def list_sandboxes(work_dir: str, mtimes: bool) -> dict[str, float]:
    """Every executor and task sandbox under ``work_dir`` (relative paths), with its newest
    mtime when ``mtimes`` (else 0.0). Symlinks are not sandboxes."""
    found: dict[str, float] = {}
    root = os.path.join(work_dir, "frameworks")

    def dirs(path: str) -> list[str]:
        try:
            with os.scandir(path) as entries:
                return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def add(relative: str) -> None:
        if not mtimes:
            found[relative] = 0.0
            return
        with contextlib.suppress(OSError):
            found[relative] = _newest_mtime(os.path.join(work_dir, relative))

    for fid in dirs(root):
        for eid in dirs(os.path.join(root, fid, "executors")):
            executor = f"frameworks/{fid}/executors/{eid}"
            add(executor)
            for tid in dirs(os.path.join(work_dir, executor, "tasks")):
                add(f"{executor}/tasks/{tid}")
    return found


def find_collected(
    work_dir: str, task_id: str, framework_id: str | None = None
) -> tuple[float, str, str] | None:
    """(when, framework id, executor id) of the newest collection of the task's sandbox that
    the agent remembers, or None."""
    path = os.path.join(work_dir, _GC_DIR, _COLLECTED)
    newest: tuple[float, str, str] | None = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 4 or fields[3] != task_id:
                    continue
                if framework_id is not None and fields[1] != framework_id:
                    continue
                try:
                    when = float(fields[0])
                except ValueError:
                    continue
                if newest is None or when >= newest[0]:
                    newest = (when, fields[1], fields[2])
    except OSError:
        return None
    return newest


class SandboxCollector:
    """``core()`` is the daemon's current core; ``disk_usage`` reads the used fraction of the
    work dir's file system (a test gives its own)."""

    def __init__(
        self,
        work_dir: str,
        gc: SandboxGc,
        core: Callable[[], Agent],
        disk_usage: Callable[[str], float] = disk_usage_fraction,
    ) -> None:
        self._work_dir = work_dir
        self._gc = gc
        self._core = core
        self._disk_usage = disk_usage
        self._dir = os.path.join(work_dir, _GC_DIR)
        self._trash = os.path.join(self._dir, "trash")
        self._serial = 0
        self._collected: deque[str] = deque(maxlen=KEEP_COLLECTED)
        self._appended = 0
        self._first = True

    def open(self) -> None:
        """At start: what an earlier run left in the trash goes, the collected list is read."""
        os.makedirs(self._dir, exist_ok=True)
        shutil.rmtree(self._trash, ignore_errors=True)
        with contextlib.suppress(OSError), open(self._collected_path(), encoding="utf-8") as f:
            self._collected.extend(line.rstrip("\n") for line in f if line.strip())

    async def run(self, interval: float) -> None:
        while True:
            try:
                await self.collect_once()
            except Exception:
                log.exception("sandbox_gc_failed")
            await asyncio.sleep(interval)

    async def collect_once(self) -> GcPlan:
        """One pass: list, plan, move the due sandboxes to the trash, empty the trash."""
        first, self._first = self._first, False
        found = await asyncio.to_thread(list_sandboxes, self._work_dir, first)
        try:
            usage = self._disk_usage(self._work_dir)
        except OSError as exc:
            log.warning("disk_usage_unreadable", error=str(exc))
            usage = 0.0
        now = time.time()
        # From here to the renames nothing awaits: the live set cannot change under the plan.
        plan = self._gc.plan(found, self._core().live_sandboxes(), usage, now)
        if plan.delete:
            moved = [path for path in plan.delete if self._to_trash(path)]
            self._remember(moved, found, now)
            log.info(
                "sandboxes_collected",
                count=len(moved),
                disk_usage=round(usage, 4),
                max_age=round(plan.max_age, 3),
                scheduled=len(self._gc.scheduled),
            )
            await asyncio.to_thread(shutil.rmtree, self._trash, True)
        return plan

    def _to_trash(self, relative: str) -> bool:
        os.makedirs(self._trash, exist_ok=True)
        self._serial += 1
        target = os.path.join(self._trash, f"{self._serial}-{os.path.basename(relative)}")
        try:
            os.rename(os.path.join(self._work_dir, relative), target)
        except OSError as exc:
            log.warning("sandbox_gc_move_failed", sandbox=relative, error=str(exc))
            return False
        if task_of(relative) is None:
            # An executor's sandbox: its framework's directories go with their last one.
            parent = os.path.dirname(os.path.join(self._work_dir, relative))
            for directory in (parent, os.path.dirname(parent)):
                try:
                    os.rmdir(directory)
                except OSError:
                    break
        return True

    def _remember(self, moved: list[str], found: dict[str, float], now: float) -> None:
        """Record the task sandboxes that went (those inside a moved executor's too)."""
        prefixes = tuple(path + "/" for path in moved)
        lines = []
        for path in sorted(set(moved) | {p for p in found if p.startswith(prefixes)}):
            ids = task_of(path)
            if ids is not None:
                lines.append(f"{now!r}\t{ids[0]}\t{ids[1]}\t{ids[2]}")
        if not lines:
            return
        self._collected.extend(lines)
        self._appended += len(lines)
        try:
            if self._appended >= KEEP_COLLECTED:  # compact: keep the newest only
                self._appended = 0
                temporary = self._collected_path() + ".new"
                with open(temporary, "w", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in self._collected)
                os.replace(temporary, self._collected_path())
            else:
                with open(self._collected_path(), "a", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in lines)
        except OSError as exc:
            log.warning("sandbox_gc_record_failed", error=str(exc))

    def _collected_path(self) -> str:
        return os.path.join(self._dir, _COLLECTED)
