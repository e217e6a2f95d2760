"""Sandbox garbage collection: which sandboxes of finished executors and tasks to delete, when.

In the manner of Mesos's agent garbage collector (``--gc_delay``, ``--disk_watermark_interval``,
``--gc_disk_headroom``). A sandbox is scheduled for deletion once nothing live uses it, and
deleted when it has been scheduled for ``gc_delay``, a delay that shrinks as the disk fills:

    max_allowed_age = gc_delay * max(0.0, 1.0 - gc_disk_headroom - disk_usage)

(``disk_usage`` the used fraction of the work dir's file system). Every disk watermark interval
the shell lists the sandboxes on disk (with their mtimes), reads the disk usage, and asks
:meth:`SandboxGc.plan` which to delete; it deletes them before the core hears of anything else.

The sandboxes, relative to the agent's work dir, are an executor's
``frameworks/<fid>/executors/<eid>`` and a task's ``.../<eid>/tasks/<tid>`` (command tasks run
in one long-lived executor per framework, so a finished task's sandbox is collected on its own).
Live, never collected: the sandbox of every executor the core holds (whatever its state: it may
be launching or about to relaunch with the same id) and of every task that is not final. A
sandbox becomes scheduled when it is first seen not live, at that time, except on the first plan
after the agent started, when its mtime is the start (sandboxes left by an earlier agent run, in
the manner of Mesos's recovery). A sandbox that becomes live again is unscheduled.

Pure: the clock, the disk usage and the listing are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from agora.agent.core.state import AgentState, is_final

__all__ = [
    "DEFAULT_DISK_HEADROOM",
    "DEFAULT_GC_DELAY",
    "GcPlan",
    "SandboxGc",
    "live_sandboxes",
    "max_allowed_age",
    "task_of",
]

#: Mesos's defaults: one week, 10 % of the disk kept free.
DEFAULT_GC_DELAY = 7 * 24 * 3600.0
DEFAULT_DISK_HEADROOM = 0.1


def max_allowed_age(gc_delay: float, disk_usage: float, headroom: float) -> float:
    """How old a scheduled sandbox may get before it is deleted, at this disk usage."""
    return gc_delay * max(0.0, 1.0 - headroom - disk_usage)


def live_sandboxes(st: AgentState) -> frozenset[str]:
    """The sandboxes (relative to the work dir) that must not be collected now."""
    live = {ex.sandbox for ex in st.executors.values()}
    for task in st.tasks.values():
        if not is_final(task.state):
            live.add(
                f"frameworks/{task.framework_id}/executors/{task.executor_id}"
                f"/tasks/{task.info.task_id}"
            )
    return frozenset(live)


def task_of(sandbox: str) -> tuple[str, str, str] | None:
    """(framework id, executor id, task id) of a task sandbox path, None for another path."""
    parts = sandbox.split("/")
    if len(parts) == 6 and (parts[0], parts[2], parts[4]) == ("frameworks", "executors", "tasks"):
        return parts[1], parts[3], parts[5]
    return None


def _with_ancestors(paths: Set[str]) -> set[str]:
    out: set[str] = set()
    for path in paths:
        while path and path not in out:
            out.add(path)
            path = path.rpartition("/")[0]
    return out


def _inside(path: str, parents: Set[str]) -> bool:
    """Whether ``path`` lies strictly inside one of ``parents``."""
    path = path.rpartition("/")[0]
    while path:
        if path in parents:
            return True
        path = path.rpartition("/")[0]
    return False


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What one plan decided: the sandboxes to delete now (no one inside another), and the
    age limit that applied."""

    delete: tuple[str, ...]
    max_age: float


@dataclass(slots=True)
class SandboxGc:
    gc_delay: float = DEFAULT_GC_DELAY
    disk_headroom: float = DEFAULT_DISK_HEADROOM
    #: Sandbox -> since when it is scheduled for deletion.
    scheduled: dict[str, float] = field(default_factory=dict)
    _planned: bool = False

    def plan(
        self, found: Mapping[str, float], live: Set[str], disk_usage: float, now: float
    ) -> GcPlan:
        """``found``: every sandbox on disk now, with its mtime; ``live``: live_sandboxes();
        ``disk_usage``: the used fraction (0..1) of the work dir's file system. The sandboxes
        returned are forgotten here: the caller deletes them."""
        # Live ones include every ancestor of a live path (an executor's, for its live task).
        held = _with_ancestors(live)
        live_now = {path for path in found if path in held}
        for path in list(self.scheduled):
            if path not in found or path in live_now:
                del self.scheduled[path]
        for path, mtime in found.items():
            if path in live_now or path in self.scheduled:
                continue
            self.scheduled[path] = min(mtime, now) if not self._planned else now
        self._planned = True
        max_age = min(self.gc_delay, max_allowed_age(self.gc_delay, disk_usage, self.disk_headroom))
        due = {path for path, start in self.scheduled.items() if now - start >= max_age}
        delete = sorted(path for path in due if not _inside(path, due))
        gone = set(delete)
        # What the deleted sandboxes hold goes with them.
        for path in list(self.scheduled):
            if path in gone or _inside(path, gone):
                del self.scheduled[path]
        return GcPlan(delete=tuple(delete), max_age=max_age)
