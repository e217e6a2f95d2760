"""Task processes of the command executor: spawn, stream, signal and reap, all on one event loop.

Spawning is ``os.posix_spawn`` (vfork + exec in glibc): the child gets its own session
(``setsid``), stdin from /dev/null and stdout/stderr either the task's sandbox files directly or
pipes the executor reads and tees into those files (streaming). ``posix_spawn`` cannot change the
child's directory, so the executor, which is single-threaded, changes its own directory to the
task sandbox around the call. A task that must run as another user goes through
``subprocess.Popen`` (slower; root only). Exits are watched with a pidfd per process registered
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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import structlog
from agora.agent.executors.pgroup import group_alive
from agora.agent.executors.shell import SHELL, shell_argv, with_exec
from agora.sdk.executor import MAX_OUTPUT_CHUNK
from agora.sdk.ids import TaskID

__all__ = [
    "DRAIN_TIMEOUT",
    "GROUP_POLL_INTERVAL",
    "AsyncStarter",
    "RunAs",
    "Started",
    "Starter",
    "TaskProcess",
    "TaskProcesses",
]

log = structlog.get_logger(__name__)

#: How long output pipes may stay open after the task's process exited (held by a process that
#: left the task's process group) before the executor stops reading them.
DRAIN_TIMEOUT: Final = 1.0
#: How often a killed task's process group is looked at while its leader has exited within the
#: grace period and the rest of the group has not.
GROUP_POLL_INTERVAL: Final = 0.05
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_DRAIN_READS_MAX: Final = 64
# Python ignores these at start-up; a child's command must see the default dispositions.
_DEFAULT_SIGNALS: Final = (signal.SIGPIPE, signal.SIGXFSZ)


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


@dataclass(slots=True)
class _Files:
    """A task's open files before its process starts: ``out``/``err`` are the child's ends,
    ``kept`` what the executor closes once the child holds them, ``opened`` everything."""

    sandbox: str
    out: int = -1
    err: int = -1
    kept: list[int] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    streams: dict[int, _Stream] = field(default_factory=dict)

    def close(self) -> None:
        for fd in self.opened:
            os.close(fd)
        self.opened.clear()


@dataclass(frozen=True, slots=True)
class RunAs:
    """Run the task as this user (only when the executor runs as root)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(slots=True, eq=False)
class _Stream:
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
    streams: dict[int, _Stream] = field(default_factory=dict)
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
                    path = _which(argv[0], env.get("PATH", os.defpath), sandbox)
                    args = list(argv)
                if run_as is None:
                    pid = self._posix_spawn(path, args, env, sandbox, files.out, files.err)
                else:
                    popen = self._popen(path, args, env, sandbox, files.out, files.err, run_as)
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

    def _open_files(self, task_id: TaskID, stream: bool, run_as: RunAs | None) -> _Files:
        """The task's sandbox, its stdout and stderr files and, with ``stream``, pipes in front
        of them. Raises OSError (nothing open is left then)."""
        if self._closed:
            raise RuntimeError("TaskProcesses is closed")
        if task_id in self._live:
            raise ValueError(f"task {task_id} is already running")
        sandbox = self.sandbox_of(task_id)
        with contextlib.suppress(FileExistsError):
            os.mkdir(sandbox)
        files = _Files(sandbox)
        try:
            out = os.open(f"{sandbox}/stdout", _FILE_FLAGS, 0o644)
            files.opened.append(out)
            err = os.open(f"{sandbox}/stderr", _FILE_FLAGS, 0o644)
            files.opened.append(err)
            if run_as is not None:
                os.chown(sandbox, run_as.uid, run_as.gid)
                os.fchown(out, run_as.uid, run_as.gid)
                os.fchown(err, run_as.uid, run_as.gid)
            files.out, files.err = out, err
            files.kept = [out, err]
            if stream:
                out_r, files.out = os.pipe()
                files.opened += (out_r, files.out)
                err_r, files.err = os.pipe()
                files.opened += (err_r, files.err)
                os.set_blocking(out_r, False)
                os.set_blocking(err_r, False)
                files.streams = {
                    out_r: _Stream("stdout", out_r, out),
                    err_r: _Stream("stderr", err_r, err),
                }
                files.kept = [files.out, files.err]
        except BaseException:
            files.close()
            raise
        return files

    def _watch(
        self,
        task_id: TaskID,
        files: _Files,
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

    def _posix_spawn(
        self,
        path: str,
        args: list[str],
        env: Mapping[str, str],
        cwd: str,
        stdout: int,
        stderr: int,
    ) -> int:
        actions = [
            (os.POSIX_SPAWN_DUP2, self._devnull, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, stderr, 2),
        ]
        os.chdir(cwd)
        try:
            return os.posix_spawn(
                path,
                args,
                env,
                file_actions=actions,
                setsid=True,
                setsigmask=(),
                setsigdef=_DEFAULT_SIGNALS,
            )
        finally:
            os.fchdir(self._home)

    def _popen(
        self,
        path: str,
        args: list[str],
        env: Mapping[str, str],
        cwd: str,
        stdout: int,
        stderr: int,
        run_as: RunAs,
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            executable=path,
            stdin=self._devnull,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            user=run_as.uid,
            group=run_as.gid,
            extra_groups=list(run_as.groups),
        )

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

    def _deliver(self, process: TaskProcess, stream: _Stream, chunk: bytes) -> None:
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

    def _close_stream(self, process: TaskProcess, stream: _Stream) -> None:
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


def _which(program: str, search_path: str, cwd: str) -> str:
    """``program`` resolved like execvp would, through the task's own PATH."""
    if "/" in program:
        return program if os.path.isabs(program) else os.path.join(cwd, program)
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if not os.path.isabs(candidate):
            candidate = os.path.join(cwd, candidate)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(2, f"{program!r} not found in PATH", program)
