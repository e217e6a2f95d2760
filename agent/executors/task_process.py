"""The records of the command executor's task processes: whom a task runs as, how a starter
reports what it started (and the starters' signatures), and one task process as the executor
watches it (its pid, output streams, kill and exit state)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from agora.sdk.ids import TaskID

__all__ = ["AsyncStarter", "OutputStream", "RunAs", "Started", "Starter", "TaskProcess"]


class Started(NamedTuple):
    """What a :data:`Starter` started."""

    #: The pid to watch: a child of this process, leader of its own process group.
    pid: int
    #: ``pid`` is a container's init (pid 1 of its own pid namespace): it passes a SIGTERM on to
    #: every process of the container and exits once all have exited, so a kill's SIGTERM goes
    #: to it alone (sent to its process group too, the task's processes would get two).
    init: bool = False


#: Starts a task's process another way than posix_spawn (in a container): called with the argv
#: (``["/bin/sh", "-c", cmd]`` for shell commands, else unresolved), the environment, the sandbox,
#: and the stdin/stdout/stderr descriptors; returns what it started. Raises OSError or the
#: launcher's error to fail the launch.
Starter = Callable[[list[str], Mapping[str, str], str, int, int, int], Started]


#: A :data:`Starter` that awaits its process's start (the event loop goes on meanwhile).
AsyncStarter = Callable[[list[str], Mapping[str, str], str, int, int, int], Awaitable[Started]]


@dataclass(frozen=True, slots=True)
class RunAs:
    """Run the task as this user (only when the executor runs as root)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(slots=True, eq=False)
class OutputStream:
    """A streamed output of a task: the pipe the executor reads and the file it tees into."""

    name: str  # "stdout" | "stderr"
    pipe: int  # read end, non-blocking
    file: int  # the sandbox file the output is teed into


@dataclass(slots=True, eq=False)
class TaskProcess:
    """One spawned task command (its process is the leader of its own session and group)."""

    task_id: TaskID
    pid: int
    sandbox: str
    pidfd: int = -1
    streams: dict[int, OutputStream] = field(default_factory=dict)
    killed: bool = False  # a kill was requested: the task ends KILLED whatever its status
    #: When the kill came (the loop's clock), and whether the grace period ran out with some of
    #: the task still alive, so that it was SIGKILLed.
    killed_at: float | None = None
    escalated: bool = False
    #: The pid is a container's init (see :class:`Started`).
    init: bool = False
    returncode: int | None = None  # as subprocess: negative = terminated by that signal
    #: From the rusage of the reaped process (None until then, or when someone else reaped it).
    cpu_seconds: float | None = None  # user + system
    max_rss_bytes: int | None = None
    reaped: bool = False
    sigkill: asyncio.TimerHandle | None = None
    sigkill_at: float | None = None
    drain: asyncio.TimerHandle | None = None
    #: Looks again at the process group of a killed task whose leader has exited (see module).
    linger: asyncio.TimerHandle | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def exit_code(self) -> int | None:
        """The exit status as a shell gives it: the exit code, or 128+N if killed by signal N."""
        code = self.returncode
        return None if code is None else (128 - code if code < 0 else code)

    @property
    def grace(self) -> float | None:
        """The grace period the kill gave (the last kill's, if one brought the SIGKILL forward)."""
        if self.killed_at is None or self.sigkill_at is None:
            return None
        return max(0.0, self.sigkill_at - self.killed_at)
