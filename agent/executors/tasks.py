"""Task processes of the command executor: spawn, stream, signal and reap, all on one event loop.

Spawning is ``os.posix_spawn`` (vfork + exec in glibc, see task_spawn.py): the child gets its own
session (``setsid``), stdin from /dev/null and stdout/stderr either the task's sandbox files
directly or pipes the executor reads and tees into those files (streaming). A task that must run
as another user goes through ``subprocess.Popen`` (slower; root only); a task in a container
through a starter (see containment.py). Exits are watched with a pidfd per process registered
on the loop; when a task's process exits, whatever is left of its process group is SIGKILLed
(as a container's teardown would) before it is reaped with ``wait4``, whose rusage gives the
task's CPU time and peak RSS (its own and those of the descendants it waited for).

A kill is SIGTERM to the task's process group (to a container's init alone: it passes it on to
the whole container and waits for all of it), then SIGKILL to the group once the grace period
is over. If the leader exits within the grace while others of its group still run (a shell that
died on the SIGTERM while its child cleans up), the executor keeps the leader unreaped and waits
for the rest of the group until the grace ends; the task ends when all of it has exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, TypedDict

import structlog
from agora.agent.executors.pgroup import group_alive
from agora.agent.executors.shell import SHELL, shell_argv, with_exec
from agora.agent.executors.task_process import (
    AsyncStarter,
    OutputStream,
    RunAs,
    Started,
    Starter,
    TaskProcess,
)
from agora.agent.executors.task_spawn import (
    TaskFiles,
    open_task_files,
    popen_task,
    posix_spawn_task,
    which,
)
from agora.sdk.executor import MAX_OUTPUT_CHUNK
from agora.sdk.ids import TaskID

__all__ = ["DRAIN_TIMEOUT", "GROUP_POLL_INTERVAL", "SpawnArgs", "TaskProcesses"]

log = structlog.get_logger(__name__)

#: How long output pipes may stay open after the task's process exited (held by a process that
#: left the task's process group) before the executor stops reading them.
DRAIN_TIMEOUT: Final = 1.0
#: How often a killed task's process group is looked at while its leader has exited within the
#: grace period and the rest of the group has not.
GROUP_POLL_INTERVAL: Final = 0.05
_DRAIN_READS_MAX: Final = 64


class SpawnArgs(TypedDict):
    """What :meth:`TaskProcesses.spawn` and :meth:`TaskProcesses.spawn_async` take alike."""

    task_id: TaskID
    #: ``(command,)`` when ``shell``.
    argv: Sequence[str]
    env: Mapping[str, str]
    shell: bool
    #: Pipe the output through the executor (``on_output``) on its way to the sandbox files.
    stream: bool
    run_as: RunAs | None


class TaskProcesses:
    """The live task processes of one executor.

    ``on_output(process, stream, chunk)`` gets every chunk a streaming task writes (at most
    MAX_OUTPUT_CHUNK bytes); ``on_exit(process)`` runs once per process, after its exit and after
    the last of its output was handed to ``on_output``.
    """

    def __init__(
        self,
        tasks_dir: str,
        *,
        on_output: Callable[[TaskProcess, str, bytes], None],
        on_exit: Callable[[TaskProcess], None],
        drain_timeout: float = DRAIN_TIMEOUT,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks_dir = tasks_dir
        os.makedirs(tasks_dir, exist_ok=True)
        self._on_output = on_output
        self._on_exit = on_exit
        self._drain_timeout = drain_timeout
        self._live: dict[TaskID, TaskProcess] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._home = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._closed = False

    @property
    def live(self) -> Mapping[TaskID, TaskProcess]:
        """Processes not yet reported through ``on_exit``, by task id."""
        return self._live

    def sandbox_of(self, task_id: TaskID) -> str:
        return f"{self._tasks_dir}/{task_id}"

    # ------------------------------------------------------------------ spawn

    def spawn(
        self,
        task_id: TaskID,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        shell: bool,
        stream: bool,
        run_as: RunAs | None = None,
        starter: Starter | None = None,
    ) -> TaskProcess:
        """Start ``argv`` (``/bin/sh -c argv[0]`` when ``shell``) in the task's sandbox.

        Raises OSError when the sandbox, its files or the process cannot be created; nothing of
        the task is left behind then (except its sandbox directory and files).
        """
        files = self._open_files(task_id, stream, run_as)
        sandbox = files.sandbox
        try:
            popen = None
            init = False
            if starter is not None:
                args = shell_argv(argv[0]) if shell else list(argv)
                pid, init = starter(args, env, sandbox, self._devnull, files.out, files.err)
            else:
                if shell:
                    path, args = SHELL, ["sh", "-c", with_exec(argv[0])]
                else:
                    path = which(argv[0], env.get("PATH", os.defpath), sandbox)
                    args = list(argv)
                stdio = (self._devnull, files.out, files.err)
                if run_as is None:
                    pid = posix_spawn_task(path, args, env, sandbox, stdio, self._home)
                else:
                    popen = popen_task(path, args, env, sandbox, stdio, run_as)
                    pid = popen.pid
        except BaseException:
            files.close()
            raise
        return self._watch(task_id, files, Started(pid, init), popen)

    async def spawn_async(
        self,
        task_id: TaskID,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        shell: bool,
        stream: bool,
        starter: AsyncStarter,
        run_as: RunAs | None = None,
    ) -> TaskProcess:
        """:meth:`spawn` through a starter that does not block the event loop (a container set
        up by the fork server while other tasks' containers are). Same errors as spawn."""
        files = self._open_files(task_id, stream, run_as)
        try:
            args = shell_argv(argv[0]) if shell else list(argv)
            started = await starter(args, env, files.sandbox, self._devnull, files.out, files.err)
        except BaseException:
            files.close()
            raise
        if self._closed or task_id in self._live:
            files.close()
            self._abandon(TaskProcess(task_id, started.pid, files.sandbox, init=started.init))
            raise RuntimeError(f"task {task_id} cannot be watched: closed, or already running")
        return self._watch(task_id, files, started, None)

    def _open_files(self, task_id: TaskID, stream: bool, run_as: RunAs | None) -> TaskFiles:
        if self._closed:
            raise RuntimeError("TaskProcesses is closed")
        if task_id in self._live:
            raise ValueError(f"task {task_id} is already running")
        return open_task_files(self.sandbox_of(task_id), stream, run_as)

    def _watch(
        self,
        task_id: TaskID,
        files: TaskFiles,
        started: Started,
        popen: subprocess.Popen[bytes] | None,
    ) -> TaskProcess:
        # The child holds its ends now; keep only what the executor reads or tees into.
        for fd in files.kept:
            os.close(fd)
        streams = files.streams
        process = TaskProcess(
            task_id, started.pid, files.sandbox, streams=streams, popen=popen, init=started.init
        )
        try:
            process.pidfd = os.pidfd_open(started.pid)
        except OSError:
            self._abandon(process)
            raise
        self._live[task_id] = process
        self._idle.clear()
        self._loop.add_reader(process.pidfd, self._exited, process)
        for fd in streams:
            self._loop.add_reader(fd, self._readable, process, fd)
        return process

    def _abandon(self, process: TaskProcess) -> None:
        """SIGKILL and reap a process we cannot watch (e.g. no descriptor left for its pidfd)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(process.pid, 0)
        if process.popen is not None:
            process.popen.returncode = -signal.SIGKILL
        for stream in process.streams.values():
            os.close(stream.pipe)
        for fd in {s.file for s in process.streams.values()}:
            os.close(fd)
        process.streams.clear()

    # ------------------------------------------------------------------ signals

    def kill(self, task_id: TaskID, grace: float) -> bool:
        """SIGTERM the task's process group, SIGKILL it after ``grace`` seconds unless all of it
        has exited by then.

        False when there is no such live process, or it has exited already. A second kill only
        ever brings the SIGKILL forward.
        """
        process = self._live.get(task_id)
        if process is None or process.reaped:
            return False
        grace = max(0.0, grace)
        now = self._loop.time()
        if process.killed:
            if process.sigkill_at is not None and now + grace < process.sigkill_at:
                self._schedule_sigkill(process, grace, now)
            return True
        process.killed = True
        process.killed_at = now
        if process.init:  # it passes the SIGTERM on, with a SIGCONT
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGTERM)
        else:
            self._signal(process, signal.SIGTERM)
            self._signal(process, signal.SIGCONT)  # a stopped process must see its SIGTERM
        self._schedule_sigkill(process, grace, now)
        return True

    def kill_all(self, grace: float) -> None:
        for task_id in list(self._live):
            self.kill(task_id, grace)

    async def wait_idle(self) -> None:
        """Return once every process has been reported through ``on_exit``."""
        await self._idle.wait()

    def _schedule_sigkill(self, process: TaskProcess, grace: float, now: float) -> None:
        if process.sigkill is not None:
            process.sigkill.cancel()
            process.sigkill = None
        process.sigkill_at = now + max(0.0, grace)
        if grace <= 0:
            self._sigkill(process)
            return
        process.sigkill = self._loop.call_at(process.sigkill_at, self._sigkill, process)

    def _sigkill(self, process: TaskProcess) -> None:
        """The grace period is over: SIGKILL whatever is left of the task."""
        process.sigkill = None
        if process.reaped:
            return
        # The leader may have exited (a zombie until reaped): then only the rest counts.
        process.escalated = group_alive(process.pid)
        log.info("task_sigkill", task_id=process.task_id, pid=process.pid, alive=process.escalated)
        self._signal(process, signal.SIGKILL)
        if process.linger is not None:
            process.linger.cancel()
            process.linger = None
            self._settle(process)

    @staticmethod
    def _signal(process: TaskProcess, signum: int) -> None:
        if process.reaped:
            return  # its pid (and group id) may belong to someone else by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)

    # ------------------------------------------------------------------ exits and output

    def reap_strays(self, keep: Iterable[int] = ()) -> int:
        """Reap exited children that are not task processes (nor in ``keep``: children others
        wait for): container processes whose launch failed after they were re-parented to us,
        and a task's orphans (we are a child subreaper when tasks run in containers). Returns
        how many; the statuses of our own tasks' processes are left for their watchers."""
        known = {p.pid for p in self._live.values() if not p.reaped} | set(keep)
        reaped = 0
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped
            if info is None or info.si_pid == 0 or info.si_pid in known:
                return reaped
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)
                reaped += 1

    def _exited(self, process: TaskProcess) -> None:
        self._loop.remove_reader(process.pidfd)
        os.close(process.pidfd)
        process.pidfd = -1
        if process.sigkill is not None and group_alive(process.pid):
            # Killed, and within its grace: the rest of the group may still be cleaning up.
            log.info("task_leader_exited_in_grace", task_id=process.task_id, pid=process.pid)
            process.linger = self._loop.call_later(GROUP_POLL_INTERVAL, self._linger, process)
            return
        self._settle(process)

    def _linger(self, process: TaskProcess) -> None:
        process.linger = None
        if process.sigkill is not None and group_alive(process.pid):
            process.linger = self._loop.call_later(GROUP_POLL_INTERVAL, self._linger, process)
            return
        self._settle(process)

    def _settle(self, process: TaskProcess) -> None:
        """The task's process has exited (and, after a kill, its group within the grace): clear
        what is left of the group, reap the process, finish once its output is drained."""
        # The leader is a zombie until reaped, so its group id is still ours: clear the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            _, status, rusage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            process.cpu_seconds = rusage.ru_utime + rusage.ru_stime
            process.max_rss_bytes = rusage.ru_maxrss * 1024  # KiB on Linux
        except ChildProcessError:  # reaped by someone else: the status is lost
            log.warning("task_status_lost", task_id=process.task_id, pid=process.pid)
        process.reaped = True
        if process.popen is not None:
            process.popen.returncode = -1 if process.returncode is None else process.returncode
        if process.sigkill is not None:
            process.sigkill.cancel()
            process.sigkill = None
        if process.streams:
            process.drain = self._loop.call_later(self._drain_timeout, self._drain, process)
        else:
            self._finish(process)

    def _readable(self, process: TaskProcess, fd: int) -> None:
        stream = process.streams.get(fd)
        if stream is None:
            return
        try:
            chunk = os.read(fd, MAX_OUTPUT_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("task_output_read_failed", task_id=process.task_id, error=str(exc))
            chunk = b""
        if chunk:
            self._deliver(process, stream, chunk)
            return
        self._close_stream(process, stream)
        if not process.streams and process.reaped:
            self._finish(process)

    def _drain(self, process: TaskProcess) -> None:
        """The process is gone but something still holds its pipes: take what is there, stop."""
        process.drain = None
        for stream in list(process.streams.values()):
            for _ in range(_DRAIN_READS_MAX):
                try:
                    chunk = os.read(stream.pipe, MAX_OUTPUT_CHUNK)
                except OSError:
                    break
                if not chunk:
                    break
                self._deliver(process, stream, chunk)
            self._close_stream(process, stream)
        log.warning("task_output_abandoned", task_id=process.task_id)
        self._finish(process)

    def _deliver(self, process: TaskProcess, stream: OutputStream, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(stream.file, view) :]
        except OSError as exc:
            log.warning("task_output_write_failed", task_id=process.task_id, error=str(exc))
        try:
            self._on_output(process, stream.name, chunk)
        except Exception:
            log.exception("task_output_callback_failed", task_id=process.task_id)

    def _close_stream(self, process: TaskProcess, stream: OutputStream) -> None:
        self._loop.remove_reader(stream.pipe)
        os.close(stream.pipe)
        os.close(stream.file)
        del process.streams[stream.pipe]

    def _finish(self, process: TaskProcess) -> None:
        if self._live.get(process.task_id) is process:
            del self._live[process.task_id]
        if not self._live:
            self._idle.set()
        try:
            self._on_exit(process)
        except Exception:
            log.exception("task_exit_callback_failed", task_id=process.task_id)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """SIGKILL every live process group and reap it (no ``on_exit``); release descriptors."""
        if self._closed:
            return
        self._closed = True
        for process in list(self._live.values()):
            if process.drain is not None:
                process.drain.cancel()
            if process.sigkill is not None:
                process.sigkill.cancel()
            if process.linger is not None:
                process.linger.cancel()
            for fd in process.streams:
                self._loop.remove_reader(fd)
            if process.pidfd >= 0:
                self._loop.remove_reader(process.pidfd)
                os.close(process.pidfd)
            if not process.reaped:
                self._abandon(process)
            else:
                for stream in list(process.streams.values()):
                    self._close_stream(process, stream)
        self._live.clear()
        self._idle.set()
        os.close(self._devnull)
        os.close(self._home)
