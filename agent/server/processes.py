"""Executor processes: launch, signal, reap, and leave nothing behind.

Every executor runs in its own session (``start_new_session=True``, so its process group id is its
pid) with its sandbox as cwd, ``executor.stdout``/``executor.stderr`` there, and ``executor.pid``
written beside them. Exits are watched without a thread per child: ``os.pidfd_open`` plus
``loop.add_reader``.

The agent makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``), so processes an
executor leaves behind (tasks run in sessions of their own) are re-parented to the agent instead of
init. When an executor exits, its process group and every adopted process whose ``AGORA_SANDBOX``
lies inside its sandbox are killed (the role a container's destruction plays in Mesos); adopted
processes that exit are reaped by :meth:`ExecutorProcesses.sweep`, which the daemon calls on its
tick. At agent shutdown every executor gets SIGTERM, then SIGKILL after the grace period, and
everything still adopted is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

import structlog
from agora.agent.server.zygote import Declined
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import ExecutorInfo

__all__ = [
    "BUILTIN_EXECUTOR_ARGV",
    "Account",
    "ExecutorProcess",
    "ExecutorProcesses",
    "ExecutorStarter",
    "LaunchError",
    "become_subreaper",
    "executor_argv",
    "executor_environment",
    "resolve_sandbox",
    "runs_default_executor",
    "sandbox_process_alive",
]

log = structlog.get_logger(__name__)

BUILTIN_EXECUTOR_ARGV: tuple[str, ...] = (sys.executable, "-m", "agora.agent.executors.command")
_PR_SET_CHILD_SUBREAPER = 36
_SANDBOX_VAR = b"AGORA_SANDBOX="

#: (framework id, executor id, status); status None: unknown (an adopted executor).
ExitCallback = Callable[[FrameworkID, ExecutorID, int | None], None]
#: Starts an executor in a container: (argv, env, sandbox, stdin, stdout, stderr, account) ->
#: the pid to watch (a child of the agent, which is a subreaper). Raises on failure.
ExecutorStarter = Callable[
    [list[str], Mapping[str, str], str, int, int, int, "Account | None"], int
]


class LaunchError(Exception):
    """An executor could not be started; ``str(error)`` says why (goes to the core)."""


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def resolve_sandbox(work_dir: str, relative: str) -> str:
    """The absolute sandbox ``relative`` names inside ``work_dir``; raises LaunchError if it
    would escape it (absolute paths, ``..``, symlinks pointing out)."""
    root = os.path.realpath(work_dir)
    if not relative or os.path.isabs(relative) or "\x00" in relative:
        raise LaunchError(f"bad sandbox path {relative!r}: must be relative to the work dir")
    path = os.path.realpath(os.path.join(root, relative))
    if path == root or os.path.commonpath([root, path]) != root:
        raise LaunchError(f"bad sandbox path {relative!r}: escapes the work dir")
    return path


def runs_default_executor(info: ExecutorInfo) -> bool:
    """An ExecutorInfo that names no command runs the built-in executor (Mesos's DEFAULT
    executor): task groups that need no executor of their own."""
    return not info.command.value and not info.command.argv


def executor_argv(info: ExecutorInfo, builtin: bool) -> list[str]:
    """The command line of an executor: ours for the built-in and default ones, else its
    CommandInfo."""
    if builtin or runs_default_executor(info):
        return list(BUILTIN_EXECUTOR_ARGV)
    command = info.command
    if command.shell and command.value:
        return ["/bin/sh", "-c", command.value]
    return list(command.argv) if command.argv else [str(command.value)]


def executor_environment(
    inherited: Mapping[str, str],
    *,
    drop: frozenset[str],
    info: ExecutorInfo,
    given: Mapping[str, str],
    required: Mapping[str, str],
) -> dict[str, str]:
    """``inherited`` minus ``drop``, then the executor command's environment, then what the core
    ``given``, then the ``required`` variables the daemon alone knows (endpoint, sandbox...)."""
    env = {k: v for k, v in inherited.items() if k not in drop}
    env.update(info.command.environment)
    env.update(given)
    env.update(required)
    return env


@dataclass(eq=False)
class ExecutorProcess:
    framework_id: FrameworkID
    executor_id: ExecutorID
    sandbox: str
    #: None for an executor adopted after an agent restart (not our child: no exit status).
    popen: subprocess.Popen[bytes] | None
    pidfd: int | None
    started: float = field(default_factory=time.monotonic)
    returncode: int | None = None
    adopted_pid: int = 0
    #: Started through a starter (a container's, or the zygote's fork): no Popen, but our child
    #: all the same (re-parented to the agent, a subreaper), so its status can be reaped.
    contained: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else self.adopted_pid


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


class ExecutorProcesses:
    """The executors of one agent, keyed by (framework id, executor id)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        work_dir: str,
        on_exit: ExitCallback,
        *,
        switch_user: bool = True,
        subreaper: bool = True,
    ) -> None:
        self._loop = loop
        self._work_dir = work_dir
        self._on_exit = on_exit
        self._switch_user = switch_user
        self._by_key: dict[tuple[FrameworkID, ExecutorID], ExecutorProcess] = {}
        self._by_pid: dict[int, ExecutorProcess] = {}
        self._all_gone = asyncio.Event()
        self._all_gone.set()
        # ``subreaper=False`` (tests running in a shared process) gives up orphan adoption.
        self._subreaper = become_subreaper() if subreaper else False

    @property
    def subreaper(self) -> bool:
        return self._subreaper

    def __len__(self) -> int:
        return len(self._by_pid)

    def get(self, framework_id: FrameworkID, executor_id: ExecutorID) -> ExecutorProcess | None:
        return self._by_key.get((framework_id, executor_id))

    def processes(self) -> list[ExecutorProcess]:
        return list(self._by_pid.values())

    # ---- launch ----------------------------------------------------------------------------

    def launch(
        self,
        framework_id: FrameworkID,
        executor_id: ExecutorID,
        argv: Sequence[str],
        sandbox: str,
        env: Mapping[str, str],
        user: str | None = None,
        starter: ExecutorStarter | None = None,
        fork_starter: ExecutorStarter | None = None,
    ) -> ExecutorProcess:
        """Start one executor in ``sandbox`` (absolute, created here), through ``starter`` (a
        container) when given, else through ``fork_starter`` (the zygote: a fork of a warm
        process) when given and able, else by exec. Raises LaunchError."""
        key = (framework_id, executor_id)
        old = self._by_key.get(key)
        if old is not None and old.returncode is None:
            # A relaunch while the previous run is still terminating: that run keeps being
            # watched (and killed), but its exit is no longer reported for this id.
            log.warning(
                "executor_relaunched_before_exit",
                framework_id=framework_id,
                executor_id=executor_id,
                previous_pid=old.pid,
            )
            self._kill_group(old.pid, signal.SIGKILL)
        account = self.account(user)
        pid = 0
        popen: subprocess.Popen[bytes] | None = None
        try:
            os.makedirs(sandbox, exist_ok=True)
            if os.path.realpath(sandbox) != sandbox:
                raise LaunchError(f"sandbox {sandbox} is behind a symlink")
            if account is not None:
                os.chown(sandbox, account.uid, account.gid)
            with (
                open(os.path.join(sandbox, "executor.stdout"), "ab") as out,
                open(os.path.join(sandbox, "executor.stderr"), "ab") as err,
                open(os.devnull, "rb") as null,
            ):
                if starter is None and fork_starter is not None:
                    pid = _try_fork_starter(
                        fork_starter, argv, env, sandbox, (null, out, err), account
                    )
                if starter is not None:
                    pid = starter(
                        list(argv), env, sandbox, null.fileno(), out.fileno(), err.fileno(), account
                    )
                elif not pid:
                    popen = subprocess.Popen(
                        list(argv),
                        cwd=sandbox,
                        env=dict(env),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        close_fds=True,
                        start_new_session=True,
                        user=account.uid if account else None,
                        group=account.gid if account else None,
                        extra_groups=list(account.groups) if account else None,
                    )
        except LaunchError:
            raise
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise LaunchError(f"cannot start executor {argv[0] if argv else ''!r}: {exc}") from exc
        except Exception as exc:  # the container launcher's own error
            raise LaunchError(f"cannot start executor {argv[0] if argv else ''!r}: {exc}") from exc
        if popen is not None:
            pid = popen.pid
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):  # pragma: no cover - kernels before 5.3
            pidfd = None
        proc = ExecutorProcess(
            framework_id,
            executor_id,
            sandbox,
            popen,
            pidfd,
            adopted_pid=pid,
            contained=popen is None,
        )
        self._by_key[key] = proc
        self._by_pid[pid] = proc
        self._all_gone.clear()
        if pidfd is not None:
            self._loop.add_reader(pidfd, self._exited, proc)
        try:
            _write_atomic(os.path.join(sandbox, "executor.pid"), f"{pid}\n")
        except OSError as exc:
            log.warning("executor_pid_file_failed", sandbox=sandbox, error=str(exc))
        log.info(
            "executor_launched",
            framework_id=framework_id,
            executor_id=executor_id,
            pid=pid,
            sandbox=sandbox,
            started_by="container" if starter else "exec" if popen else "zygote",
        )
        return proc

    def adopt(
        self, framework_id: FrameworkID, executor_id: ExecutorID, pid: int, sandbox: str
    ) -> ExecutorProcess | None:
        """Watch an executor an earlier agent process started (found alive at recovery). Its
        exit is reported with status None. None if it is already gone."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        proc = ExecutorProcess(framework_id, executor_id, sandbox, None, pidfd, adopted_pid=pid)
        self._by_key[(framework_id, executor_id)] = proc
        self._by_pid[pid] = proc
        self._all_gone.clear()
        self._loop.add_reader(pidfd, self._adopted_exited, proc)
        log.info("executor_adopted", framework_id=framework_id, executor_id=executor_id, pid=pid)
        return proc

    def _adopted_exited(self, proc: ExecutorProcess) -> None:
        if proc.returncode is None:
            self._finish(proc)

    def account(self, user: str | None) -> Account | None:
        """The account to switch to, None to run as the agent's own user."""
        if not user:
            return None
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise LaunchError(f"unknown user {user!r}") from None
        if entry.pw_uid == os.geteuid():
            return None
        if not self._switch_user:
            return None
        if os.geteuid() != 0:
            raise LaunchError(
                f"cannot run as user {user!r}: the agent is not root (see --no-switch-user)"
            )
        try:
            groups = tuple(os.getgrouplist(user, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return Account(user, entry.pw_uid, entry.pw_gid, groups)

    # ---- signals ---------------------------------------------------------------------------

    def signal(self, framework_id: FrameworkID, executor_id: ExecutorID, kill: bool) -> bool:
        """SIGTERM (or SIGKILL) to the executor's process group; False if it is not running."""
        proc = self._by_key.get((framework_id, executor_id))
        if proc is None or proc.returncode is not None:
            return False
        sig = signal.SIGKILL if kill else signal.SIGTERM
        log.info(
            "executor_signalled",
            framework_id=framework_id,
            executor_id=executor_id,
            pid=proc.pid,
            signal=sig.name,
        )
        return self._kill_group(proc.pid, sig)

    @staticmethod
    def _kill_group(pgid: int, sig: int) -> bool:
        if pgid <= 1 or pgid == os.getpgrp():
            return False
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    # ---- exits -----------------------------------------------------------------------------

    def _exited(self, proc: ExecutorProcess) -> None:
        """The pidfd of ``proc`` is readable: it has exited."""
        if proc.returncode is not None:
            return
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return  # spurious wake-up; the reader stays armed
        except ChildProcessError:  # pragma: no cover - reaped behind our back
            pass
        self._finish(proc)

    def _finish(self, proc: ExecutorProcess) -> None:
        """Clean up after an exited (not yet reaped) executor, reap it, report its exit."""
        # While it is an unreaped zombie its pid cannot be reused, so its group is still its own:
        # destroy what it leaves behind, that group (it may outlive its leader) and the adopted
        # processes of its sandbox (its tasks run in sessions of their own).
        if proc.popen is not None or proc.contained:
            self._kill_group(proc.pid, signal.SIGKILL)
            self.kill_adopted(proc.sandbox)
        else:
            # Not our child: its pid may be reused by now, and what it left behind was re-parented
            # to init, not to us. Find those by the sandbox they were started in.
            _kill_sandbox_processes(proc.sandbox)
        status: int | None = None
        if proc.popen is not None:
            status = proc.popen.poll()
            if status is None:  # pragma: no cover - poll reaps a zombie at once
                status = proc.popen.wait()
        elif proc.contained:
            with contextlib.suppress(ChildProcessError):
                status = os.waitstatus_to_exitcode(os.waitpid(proc.pid, 0)[1])
        proc.returncode = -1 if status is None else status
        if proc.pidfd is not None:
            self._loop.remove_reader(proc.pidfd)
            os.close(proc.pidfd)
            proc.pidfd = None
        self._by_pid.pop(proc.pid, None)
        key = (proc.framework_id, proc.executor_id)
        current = self._by_key.get(key) is proc
        if current:
            del self._by_key[key]
        if not self._by_pid:
            self._all_gone.set()
        log.info(
            "executor_exited",
            framework_id=proc.framework_id,
            executor_id=proc.executor_id,
            pid=proc.pid,
            status=status,
        )
        if current:
            self._on_exit(proc.framework_id, proc.executor_id, status)

    def sweep(self) -> None:
        """Reap exited children: adopted orphans, and executors whose exit is not yet handled."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            except OSError:  # pragma: no cover - EINTR and the like
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            proc = self._by_pid.get(pid)
            if proc is not None:
                self._finish(proc)
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # pragma: no cover
                return

    # ---- adopted orphans -------------------------------------------------------------------

    def adopted(self) -> list[int]:
        """Live children of the agent that are not executors (orphans re-parented to us)."""
        return [pid for pid in _children() if pid not in self._by_pid]

    def kill_adopted(self, sandbox: str | None = None) -> int:
        """SIGKILL adopted processes (only those of ``sandbox`` when given) and their groups."""
        if not self._subreaper:
            return 0
        killed = 0
        for pid in self.adopted():
            if sandbox is not None and not _started_in(pid, sandbox):
                continue
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                continue
            if pgid == pid and self._kill_group(pgid, signal.SIGKILL):
                killed += 1
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if killed:
            log.info("orphans_killed", count=killed, sandbox=sandbox)
        return killed

    # ---- shutdown --------------------------------------------------------------------------

    def kill_all(self) -> None:
        """SIGKILL every executor's process group now."""
        for proc in self.processes():
            if proc.returncode is None:
                self._kill_group(proc.pid, signal.SIGKILL)

    async def terminate_all(self, grace: float) -> None:
        """SIGTERM every executor, SIGKILL after ``grace`` s, then kill every adopted process.

        Exits are reported through the exit callback as they happen."""
        procs = self.processes()
        for proc in procs:
            if proc.returncode is None:
                self._kill_group(proc.pid, signal.SIGTERM)
        if procs:
            log.info("executors_terminating", count=len(procs), grace=grace)
            await self._wait_all_gone(grace)
        for proc in self.processes():
            if proc.returncode is None:
                log.warning("executor_killed_after_grace", pid=proc.pid)
                self._kill_group(proc.pid, signal.SIGKILL)
        await self._wait_all_gone(5.0)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            self.sweep()
            if not self.adopted():
                break
            self.kill_adopted()
            await asyncio.sleep(0.02)
        self.sweep()

    async def _wait_all_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._by_pid and time.monotonic() < deadline:
            # pidfd readers report exits; the sweep also catches any it would miss.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._all_gone.wait(), timeout=min(0.05, deadline - time.monotonic())
                )
            self.sweep()

    def close(self) -> None:
        """Stop watching (the processes are not touched)."""
        for proc in self._by_pid.values():
            if proc.pidfd is not None:
                self._loop.remove_reader(proc.pidfd)
                os.close(proc.pidfd)
                proc.pidfd = None


def _try_fork_starter(
    starter: ExecutorStarter,
    argv: Sequence[str],
    env: Mapping[str, str],
    sandbox: str,
    stdio: tuple[IO[bytes], IO[bytes], IO[bytes]],
    account: Account | None,
) -> int:
    """The pid ``starter`` forked, or 0 when it declined or failed (then exec starts it)."""
    null, out, err = stdio
    try:
        return starter(list(argv), env, sandbox, null.fileno(), out.fileno(), err.fileno(), account)
    except Declined as exc:
        log.info("executor_zygote_declined", sandbox=sandbox, why=str(exc))
    except OSError as exc:
        log.warning("executor_zygote_failed", sandbox=sandbox, error=str(exc))
    return 0


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)


def _children() -> Iterator[int]:
    """Pids of this process's children (all threads), from /proc."""
    pid = os.getpid()
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return
    readable = False
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/children", encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue
        readable = True
        for item in text.split():
            with contextlib.suppress(ValueError):
                yield int(item)
    if not readable:  # kernels without CONFIG_PROC_CHILDREN: scan every process's parent
        yield from _children_by_scan(pid)


def _children_by_scan(parent: int) -> Iterator[int]:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(parent):
            yield int(entry)


def _kill_sandbox_processes(sandbox: str) -> int:
    """SIGKILL every process on the host started in ``sandbox`` (by AGORA_SANDBOX)."""
    killed = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if not _started_in(int(entry), sandbox):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
    if killed:
        log.info("sandbox_processes_killed", count=killed, sandbox=sandbox)
    return killed


def _started_in(pid: int, sandbox: str) -> bool:
    """``pid`` was started in ``sandbox`` or below it (by its AGORA_SANDBOX)."""
    where = _sandbox_of(pid)
    return where is not None and (where + os.sep).startswith(sandbox.rstrip(os.sep) + os.sep)


def sandbox_process_alive(pid: int, sandbox: str) -> bool:
    """``pid`` is alive and was started in ``sandbox`` (guards against a reused pid)."""
    where = _sandbox_of(pid)
    return where is not None and where == sandbox.rstrip(os.sep)


def _sandbox_of(pid: int) -> str | None:
    """The AGORA_SANDBOX a process started with, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for entry in data.split(b"\x00"):
        if entry.startswith(_SANDBOX_VAR):
            return os.fsdecode(entry[len(_SANDBOX_VAR) :]).rstrip(os.sep)
    return None
