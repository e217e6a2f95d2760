"""The MPI member executor: ``python -m agora.frameworks.mpi.executor``, one per gang agent.

Its one task holds the agent's slots. On every member it runs the commands the scheduler relays
from a launcher (``exec``: ``/bin/sh -c`` in this container, output and exit code sent back)
and kills them with every descendant on ``kill``. On the rank-0 member it also writes the
hostfile, serves the launchers on a unix socket and runs ``mpirun``, streaming its (tagged)
output to the scheduler; the task ends FINISHED when ``mpirun`` exits 0, else FAILED with its
exit code. A kill or shutdown stops ``mpirun`` and everything under this executor, and a kill is
always answered (KILLED) within a bound, whatever is left behind.

``mpirun``'s output comes through pipes of our own, not asyncio's: Open MPI starts each launcher
(its ssh) in a process group of its own, so a launcher outlives a kill of mpirun's group and
holds mpirun's stdout and stderr; with asyncio pipes, ``Process.wait()`` (Python 3.11) would not
return until those pipes closed, and a launcher waiting for a lost member never closes them.

The task's ``data`` is a msgpack map: ``member`` (its name), ``rank0`` (bool), and for rank 0
``hostfile`` (text), ``argv`` (mpirun's) and ``env`` (added to mpirun's environment).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

import msgpack
from agora.sdk._lean import import_structlog_without_rich

# A member starts as a process on every gang agent for every job: what it imports is on the
# path of each `agora mpirun` (structlog without rich for tracebacks, see agora.sdk._lean).
import_structlog_without_rich()

import structlog  # noqa: E402
from agora.frameworks.mpi.launch_server import LaunchServer  # noqa: E402
from agora.frameworks.mpi.protocol import ProtocolError, decode, encode  # noqa: E402
from agora.frameworks.mpi.remote import RemoteCommands, become_subreaper  # noqa: E402
from agora.sdk.executor import Executor, ExecutorDriver, run_executor  # noqa: E402
from agora.sdk.ids import TaskID  # noqa: E402
from agora.sdk.messages import StatusSource, TaskInfo, TaskState, TaskStatus  # noqa: E402

__all__ = ["MemberExecutor", "main"]

log = structlog.get_logger(__name__)

CHUNK = 64 * 1024
KILL_GRACE = 3.0
#: After mpirun exits, how long its output may still drain.
RELAY_GRACE = 2.0
#: A kill is answered (KILLED) after at most this long, even if stopping everything is not done.
STOP_DEADLINE = 2 * KILL_GRACE + RELAY_GRACE + 5.0


class MemberExecutor(Executor):
    def __init__(self) -> None:
        self.driver: ExecutorDriver | None = None
        self.task_id: TaskID | None = None
        self.remote: RemoteCommands | None = None
        self.server: LaunchServer | None = None
        self.mpirun: asyncio.subprocess.Process | None = None
        self.ended = False
        self.killed = False

    # ------------------------------------------------------------------ callbacks

    async def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        self.driver = driver
        if self.task_id is not None:
            self._status(task.task_id, TaskState.FAILED, "this executor already holds a member")
            return
        self.task_id = task.task_id
        try:
            info = msgpack.unpackb(task.data, raw=False)
            if not isinstance(info, dict) or not isinstance(info.get("member"), str):
                raise ValueError("task data is not a member description")
        except ValueError as exc:
            self._end(TaskState.FAILED, f"bad task data: {exc}")
            return
        sandbox = driver.sandbox
        env = _environment(sandbox)
        self.remote = RemoteCommands(driver.send_framework_message, env, sandbox)
        self._status(task.task_id, TaskState.RUNNING, f"member {info['member']} holds its slots")
        if info.get("rank0"):
            try:
                await self._run_mpirun(driver, info, env, sandbox)
            except Exception as exc:  # whatever it is, the member must not hang RUNNING
                log.exception("mpi_rank0_failed")
                await self._stop_everything()
                self._end(TaskState.FAILED, f"cannot run mpirun: {exc}")

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        try:
            message = decode(data)
        except ProtocolError as exc:
            log.warning("mpi_bad_message", error=str(exc))
            return
        kind = message["t"]
        if kind == "exec" and self.remote is not None and not self.ended:
            self.remote.start(message["id"], message["cmd"])
        elif kind == "kill" and self.remote is not None:
            self.remote.kill(message["id"])
        elif kind in ("out", "exit") and self.server is not None:
            self.server.deliver(message["id"], data)

    async def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        if task_id != self.task_id or self.ended:
            return
        log.info("mpi_member_killing", task_id=task_id)
        self.killed = True
        await self._stop_bounded()
        self._end(TaskState.KILLED, "killed")

    async def shutdown(self, driver: ExecutorDriver) -> None:
        self.killed = True
        await self._stop_bounded()
        if self.task_id is not None and not self.ended:
            self._end(TaskState.KILLED, "executor shut down")

    # ------------------------------------------------------------------ rank 0

    async def _run_mpirun(
        self, driver: ExecutorDriver, info: dict[str, Any], env: dict[str, str], sandbox: str
    ) -> None:
        hostfile = os.path.join(sandbox, "hostfile")
        with open(hostfile, "w", encoding="utf-8") as fh:
            fh.write(str(info.get("hostfile", "")))
        socket_path = os.path.join(sandbox, "launch.sock")
        server = LaunchServer(on_launch=self._on_launch, on_cancel=self._on_cancel)
        await server.start(socket_path)
        self.server = server
        if self.killed:  # killed while the server started
            return
        argv = [str(a) for a in info.get("argv", [])]
        argv = [a.replace("{hostfile}", hostfile) for a in argv]
        extra = {str(k): str(v) for k, v in dict(info.get("env", {})).items()}
        extra["AGORA_MPI_LAUNCH_SOCKET"] = socket_path
        if os.geteuid() == 0:  # mpirun refuses root without these
            extra["OMPI_ALLOW_RUN_AS_ROOT"] = extra["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        # Our own pipes (see the module's docstring): wait() then waits for mpirun alone.
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.mpirun = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env={**env, **extra},
                cwd=sandbox,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            self._end(TaskState.FAILED, f"cannot start mpirun: {exc}")
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        proc = self.mpirun
        if self.killed:  # killed while it was being started: it must not outlive the task
            os.close(out_r)
            os.close(err_r)
            await self._stop_everything()
            return
        relays = asyncio.gather(self._relay(out_r, 1), self._relay(err_r, 2))
        code = await proc.wait()
        try:  # what it wrote last; a launcher still holding the pipes must not hold us
            await asyncio.wait_for(asyncio.shield(relays), RELAY_GRACE)
        except TimeoutError:
            relays.cancel()
        if code < 0:
            code = 128 - code
        await self._stop_everything()
        if self.killed:
            return
        if code == 0:
            self._end(TaskState.FINISHED, "mpirun exited 0", exit_code=0)
        else:
            self._end(TaskState.FAILED, f"mpirun exited {code}", exit_code=code)

    async def _relay(self, read_fd: int, fd: int) -> None:
        """Relay mpirun's ``fd`` (read from ``read_fd``) until EOF; closes ``read_fd`` anyway."""
        assert self.driver is not None
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        transport: asyncio.BaseTransport | None = None
        try:
            stream = asyncio.StreamReader(limit=CHUNK)
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stream), pipe
            )
            while chunk := await stream.read(CHUNK):
                self.driver.send_framework_message(encode("log", fd=fd, data=chunk))
        finally:
            if transport is not None:
                transport.close()
            else:
                pipe.close()

    def _on_launch(self, launch_id: str, host: str, cmd: str) -> None:
        assert self.driver is not None
        self.driver.send_framework_message(encode("launch", id=launch_id, host=host, cmd=cmd))

    def _on_cancel(self, launch_id: str) -> None:
        assert self.driver is not None
        self.driver.send_framework_message(encode("cancel", id=launch_id))

    # ------------------------------------------------------------------ endings

    async def _stop_bounded(self) -> None:
        """Stop everything, but give up after STOP_DEADLINE: the kill is answered regardless."""
        try:
            await asyncio.wait_for(self._stop_everything(), STOP_DEADLINE)
        except Exception as exc:  # TimeoutError, or whatever stopping ran into
            log.warning("mpi_member_stop_incomplete", task_id=self.task_id, error=repr(exc))

    async def _stop_everything(self) -> None:
        proc = self.mpirun
        if proc is not None and proc.returncode is None:
            log.info("mpi_mpirun_stopping", pid=proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), KILL_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                try:
                    await asyncio.wait_for(proc.wait(), KILL_GRACE)
                except TimeoutError:
                    log.warning("mpi_mpirun_unkillable", pid=proc.pid)
        if self.remote is not None:
            log.info("mpi_remote_stopping")
            await self.remote.kill_all()
        if self.server is not None:
            await self.server.close()
            self.server = None

    def _end(self, state: TaskState, message: str, exit_code: int | None = None) -> None:
        if self.ended or self.task_id is None:
            return
        self.ended = True
        self._status(self.task_id, state, message, exit_code)
        if self.driver is not None:
            self.driver.stop()

    def _status(
        self, task_id: TaskID, state: TaskState, message: str, exit_code: int | None = None
    ) -> None:
        assert self.driver is not None
        self.driver.send_status_update(
            TaskStatus(
                task_id=task_id,
                state=state,
                source=StatusSource.EXECUTOR,
                message=message,
                exit_code=exit_code,
            )
        )


def _environment(sandbox: str) -> dict[str, str]:
    """The environment of mpirun, of relayed commands (orted) and so of the ranks: this
    executor's, without Agora's executor variables, with this Python's bin dir first on PATH
    (so ``python`` is the one that has Agora, and mpi4py where it was installed with it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    env["AGORA_SANDBOX"] = sandbox
    return env


def main() -> None:
    become_subreaper()
    run_executor(MemberExecutor())


if __name__ == "__main__":
    main()
