"""Task health checks for the built-in executor, with Mesos semantics.

A :class:`HealthChecker` probes one task: the first probe ``delay`` seconds after :meth:`start`,
then ``interval`` seconds after each probe ends, each probe bounded by ``timeout``. COMMAND runs
``/bin/sh -c command`` in the sandbox (own session; the process group is SIGKILLed on timeout) and
is healthy on exit 0; HTTP GETs ``http://127.0.0.1:port/path`` and is healthy on 200-399; TCP is
healthy when a connection to ``127.0.0.1:port`` opens.

Failures in the first ``grace_period`` seconds after :meth:`start` are ignored until a probe has
succeeded. ``on_change(healthy)`` is called for the first counted result and whenever the state
flips; after ``consecutive_failures`` counted failures in a row ``on_unhealthy(message)`` is
called once and the checker stops itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import structlog
from agora.agent.containers.containerizer import User
from agora.sdk.messages.container import HealthCheck, HealthCheckKind

__all__ = ["HealthChecker", "health_check_problem"]

log = structlog.get_logger(__name__)

_HOST: Final = "127.0.0.1"
_OUTPUT_TAIL: Final = 1024  # bytes of a failing command's output kept for the message
_STATUS_LINE_MAX: Final = 8192


def health_check_problem(check: HealthCheck) -> str | None:
    """What is wrong with ``check``, or None if an executor can run it."""
    if check.kind is HealthCheckKind.COMMAND:
        if not check.command or not check.command.strip():
            return "a COMMAND health check needs a command"
    elif check.kind in (HealthCheckKind.HTTP, HealthCheckKind.TCP):
        if check.port is None:
            return f"a {check.kind.value} health check needs a port"
        if not 1 <= check.port <= 65_535:
            return f"health check port {check.port} is not in 1-65535"
        if check.kind is HealthCheckKind.HTTP:
            if not check.path.startswith("/"):
                return f"HTTP health check path {check.path!r} must start with '/'"
            if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in check.path):
                return f"HTTP health check path {check.path!r} has spaces or control characters"
    else:  # pragma: no cover - every kind is handled above
        return f"unknown health check kind {check.kind!r}"
    if not check.interval > 0:
        return f"health check interval must be positive, not {check.interval}"
    if not check.timeout > 0:
        return f"health check timeout must be positive, not {check.timeout}"
    if check.delay < 0 or check.grace_period < 0:
        return "health check delay and grace_period must not be negative"
    if check.consecutive_failures < 1:
        return "health check consecutive_failures must be at least 1"
    return None


class HealthChecker:
    """Runs one task's health check on the running asyncio loop. See the module docstring."""

    def __init__(
        self,
        check: HealthCheck,
        *,
        sandbox: str,
        env: Mapping[str, str],
        on_change: Callable[[bool], None],
        on_unhealthy: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        command_prefix: Sequence[str] = (),
        user: User | None = None,
    ) -> None:
        """``command_prefix`` wraps a COMMAND check (``nsenter`` into the task's container);
        ``user`` runs it as the task's user when there is no prefix."""
        problem = health_check_problem(check)
        if problem is not None:
            raise ValueError(problem)
        self._check = check
        self._prefix = tuple(command_prefix)
        self._user = user
        self._sandbox = sandbox
        self._env = dict(env)
        self._on_change = on_change
        self._on_unhealthy = on_unhealthy
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._started_at = 0.0
        self._succeeded_once = False
        self._healthy: bool | None = None
        self._failures = 0
        self._stopped = False

    @property
    def pids(self) -> frozenset[int]:
        """The probe processes running now (the executor must not reap them)."""
        return frozenset(proc.pid for proc in self._procs)

    @property
    def healthy(self) -> bool | None:
        """The last counted result; None before the first."""
        return self._healthy

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Begin checking; needs a running event loop. Call at most once."""
        if self._task is not None or self._stopped:
            raise RuntimeError("a HealthChecker starts only once")
        self._started_at = self._clock()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop checking: SIGKILL any probe's process group and cancel the checking task (the
        killed processes are reaped as the task unwinds). Idempotent."""
        self._stopped = True
        for proc in list(self._procs):
            _kill_group(proc)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _run(self) -> None:
        check = self._check
        try:
            await asyncio.sleep(check.delay)
            while not self._stopped:
                ok, why = await self._probe()
                if self._stopped:
                    return
                if self._record(ok, why):
                    return
                await asyncio.sleep(check.interval)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not kill the executor's loop silently
            log.exception("health_checker_crashed", kind=check.kind.value)

    def _record(self, ok: bool, why: str) -> bool:
        """Account one probe result; True when the checker is done (task declared unhealthy)."""
        check = self._check
        if ok:
            self._succeeded_once = True
            self._failures = 0
            self._set_healthy(True)
            return False
        in_grace = self._clock() - self._started_at < check.grace_period
        if in_grace and not self._succeeded_once:
            log.debug("health_check_failure_in_grace_period", kind=check.kind.value, why=why)
            return False
        self._failures += 1
        log.info(
            "health_check_failed",
            kind=check.kind.value,
            why=why,
            consecutive=self._failures,
            limit=check.consecutive_failures,
        )
        self._set_healthy(False)
        if self._failures < check.consecutive_failures:
            return False
        self._stopped = True
        message = (
            f"{check.kind.value} health check failed {self._failures} consecutive "
            f"time{'s' if self._failures != 1 else ''}; last: {why}"
        )
        try:
            self._on_unhealthy(message)
        except Exception:
            log.exception("health_check_callback_failed", callback="on_unhealthy")
        return True

    def _set_healthy(self, healthy: bool) -> None:
        if self._healthy is healthy:
            return
        self._healthy = healthy
        try:
            self._on_change(healthy)
        except Exception:
            log.exception("health_check_callback_failed", callback="on_change")

    async def _probe(self) -> tuple[bool, str]:
        check = self._check
        try:
            async with asyncio.timeout(check.timeout):
                if check.kind is HealthCheckKind.COMMAND:
                    return await self._probe_command()
                if check.kind is HealthCheckKind.HTTP:
                    return await self._probe_http()
                return await self._probe_tcp()
        except TimeoutError:
            return False, f"timed out after {check.timeout:g} s"
        except OSError as exc:
            return False, f"{type(exc).__name__}: {exc}"

    async def _probe_command(self) -> tuple[bool, str]:
        assert self._check.command is not None
        user = self._user if not self._prefix else None
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *self._prefix,
                "/bin/sh",
                "-c",
                self._check.command,
                cwd=self._sandbox,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                user=user.uid if user else None,
                group=user.gid if user else None,
                extra_groups=list(user.groups) if user else None,
            )
        )
        try:
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            # Cancelled (stop or timeout) while spawning: the shell may already run and have
            # started children. Let the spawn finish, then kill its whole group and reap it.
            while not spawn.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({spawn})
            if not spawn.cancelled() and spawn.exception() is None:
                orphan = spawn.result()
                _kill_group(orphan)
                with contextlib.suppress(asyncio.CancelledError):
                    await orphan.wait()
            raise
        self._procs.add(proc)
        try:
            assert proc.stdout is not None
            output = await _read_tail(proc.stdout, _OUTPUT_TAIL)
            code = await proc.wait()
        finally:
            if proc.returncode is None:  # timed out or cancelled: kill it and reap it
                _kill_group(proc)
                with contextlib.suppress(asyncio.CancelledError, ProcessLookupError):
                    await asyncio.shield(proc.wait())
            self._procs.discard(proc)
        if code == 0:
            return True, "exit 0"
        status = f"exited with status {code}" if code > 0 else f"killed by signal {-code}"
        text = output.decode("utf-8", "replace").strip()
        return False, f"command {status}" + (f": {text}" if text else "")

    async def _probe_http(self) -> tuple[bool, str]:
        port = self._check.port
        reader, writer = await asyncio.open_connection(_HOST, port)
        try:
            request = (
                f"GET {self._check.path} HTTP/1.1\r\nHost: {_HOST}:{port}\r\n"
                "User-Agent: agora-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            )
            writer.write(request.encode("ascii"))
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        parts = line[:_STATUS_LINE_MAX].decode("latin-1").split(maxsplit=2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            return False, f"bad HTTP response from port {port}: {line[:80]!r}"
        status = int(parts[1])
        return 200 <= status < 400, f"HTTP {status} from {_HOST}:{port}{self._check.path}"

    async def _probe_tcp(self) -> tuple[bool, str]:
        _, writer = await asyncio.open_connection(_HOST, self._check.port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True, f"connected to {_HOST}:{self._check.port}"


async def _read_tail(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Read ``stream`` to EOF, keeping only its last ``limit`` bytes."""
    tail = b""
    while chunk := await stream.read(65_536):
        tail = (tail + chunk)[-limit:]
    return tail


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group is gone and its id reused: kill just our child
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
