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

How one executor is started (command line, environment, account; container, zygote or exec) is
:mod:`agora.agent.server.executor_start`; finding processes through ``/proc`` (children, by
sandbox) is :mod:`agora.agent.server.process_scan`. Their names used elsewhere are re-exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from agora.agent.server.executor_start import (
    BUILTIN_EXECUTOR_ARGV,
    Account,
    ExecutorStarter,
    LaunchError,
    account_for,
    executor_argv,
    executor_environment,
    resolve_sandbox,
    runs_default_executor,
    start_executor,
)
from agora.agent.server.process_scan import (
    become_subreaper,
    children,
    kill_sandbox_processes,
    sandbox_process_alive,
    started_in,
)
from agora.sdk.ids import ExecutorID, FrameworkID

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

#: (framework id, executor id, status); status None: unknown (an adopted executor).
ExitCallback = Callable[[FrameworkID, ExecutorID, int | None], None]


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
        pid, popen = start_executor(argv, sandbox, env, account, starter, fork_starter)
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
        return account_for(user, switch_user=self._switch_user)

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
            kill_sandbox_processes(proc.sandbox)
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
        return [pid for pid in children() if pid not in self._by_pid]

    def kill_adopted(self, sandbox: str | None = None) -> int:
        """SIGKILL adopted processes (only those of ``sandbox`` when given) and their groups."""
        if not self._subreaper:
            return 0
        killed = 0
        for pid in self.adopted():
            if sandbox is not None and not started_in(pid, sandbox):
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


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)
