"""Run the scheduler's ``exec`` commands in a member executor, as sshd would, and kill whole trees.

Every member executor serves ``exec {id, cmd}`` by running ``/bin/sh -c cmd`` (stdin on
/dev/null, a session of its own) and relays its output as ``out`` messages, then one ``exit``
once the shell has exited *and* its pipes are drained (a background job still writing keeps the
command open, as with ssh). ``kill {id}`` kills the command and every process it started,
including those that left its process group and session (Open MPI puts ranks in their own).

Finding them: a walk of ``/proc/*/stat`` parent links from the shell and from every process
seen under the command before; and, for orphans re-parented away from the tree (to the executor,
which is a child subreaper, see :func:`become_subreaper`), a marker variable
:data:`MARKER_VAR` with a value unique to the command, which its descendants inherit. Processes
are named by (pid, start time), so a recycled pid is never killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import structlog
from agora.frameworks.mpi.protocol import encode

__all__ = ["CHUNK", "KILL_DEADLINE", "MARKER_VAR", "RemoteCommands", "become_subreaper"]

log = structlog.get_logger(__name__)

#: Largest ``out`` payload.
CHUNK: Final = 64 * 1024
#: How long a kill keeps looking for survivors.
KILL_DEADLINE: Final = 5.0
#: Set in each command's environment to a value unique to that command.
MARKER_VAR: Final = "AGORA_MPI_REMOTE"
#: Exit status when ``/bin/sh`` cannot be started at all (the shell's "command not found").
CANNOT_START: Final = 127

_PR_SET_CHILD_SUBREAPER: Final = 36
_KILL_POLL: Final = 0.02
#: How long after a kill the pipes may stay open before they are abandoned (at least).
_PIPE_GRACE: Final = 1.0


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphaned descendants are re-parented to it
    rather than to init, so a kill can still find them. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class _Stat(NamedTuple):
    ppid: int
    state: str
    start: int  # clock ticks since boot: with the pid, names a process for good


#: (pid, start time)
_Identity = tuple[int, int]


def _read_stat(pid: int) -> _Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:  # fields[0] is field 3 (state) of proc(5)
        return _Stat(int(fields[1]), fields[0].decode("ascii", "replace"), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _snapshot() -> dict[int, _Stat]:
    """Every process visible in /proc."""
    out: dict[int, _Stat] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit():
            stat = _read_stat(int(entry))
            if stat is not None:
                out[int(entry)] = stat
    return out


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


@dataclass(eq=False)
class _Command:
    id: str
    cmd: str
    marker: str
    proc: asyncio.subprocess.Process | None = None
    root: _Identity = (0, -1)
    kill_requested: bool = False
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    #: every process ever found under the command
    seen: set[_Identity] = field(default_factory=set)
    #: processes checked and found without the marker (cannot gain it later)
    clean: set[_Identity] = field(default_factory=set)


class RemoteCommands:
    """The commands one member executor runs for the scheduler, by id.

    ``send`` gets each encoded ``out``/``exit`` message. ``env`` (plus :data:`MARKER_VAR`) and
    ``cwd`` are the commands' environment and working directory. Call from the event loop.
    """

    def __init__(self, send: Callable[[bytes], None], env: Mapping[str, str], cwd: str) -> None:
        self._send_cb = send
        self._env = dict(env)
        self._cwd = cwd
        self._commands: dict[str, _Command] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def running(self) -> set[str]:
        """Ids started whose ``exit`` has not been sent yet."""
        return set(self._commands)

    def start(self, id: str, cmd: str) -> None:
        """Run ``/bin/sh -c cmd`` as ``id``; nothing if ``id`` is already running."""
        if id in self._commands:
            log.warning("remote_duplicate_id", id=id)
            return
        command = _Command(id, cmd, marker=f"{os.getpid()}.{secrets.token_hex(8)}")
        self._commands[id] = command
        self._spawn_task(self._run(command))

    def kill(self, id: str) -> None:
        """Kill command ``id`` and all its descendants (in the background; its ``exit`` follows).
        Nothing if ``id`` is unknown or already being killed."""
        command = self._commands.get(id)
        if command is None or command.kill_requested:
            return
        command.kill_requested = True
        log.info("remote_kill", id=id)
        if command.proc is not None:  # else _run kills it once it has started
            self._spawn_task(self._kill_tree(command))

    async def kill_all(self) -> None:
        """Kill every command and wait until each has been dealt with (at most about
        :data:`KILL_DEADLINE` seconds)."""
        while self._commands or self._tasks:
            for id in list(self._commands):  # also any started meanwhile
                self.kill(id)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- running ----------------------------------------------------------------------------

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, message: bytes) -> None:
        try:
            self._send_cb(message)
        except Exception:
            log.exception("remote_send_failed")

    async def _run(self, command: _Command) -> None:
        try:
            await self._run_command(command)
        finally:
            if self._commands.get(command.id) is command:  # failed unexpectedly
                self._finish(command, CANNOT_START)

    async def _run_command(self, command: _Command) -> None:
        env = {**self._env, MARKER_VAR: command.marker}
        # Our own pipes (not asyncio's PIPE): their read ends can be closed even while some
        # escaped process still holds the write ends.
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                command.cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=env,
                cwd=self._cwd,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            log.warning("remote_start_failed", id=command.id, error=str(exc))
            note = f"agora: cannot run /bin/sh in {self._cwd}: {exc}\n".encode()
            self._send(encode("out", id=command.id, fd=2, data=note))
            self._finish(command, CANNOT_START)
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        command.proc = proc
        stat = _read_stat(proc.pid)
        command.root = (proc.pid, stat.start if stat is not None else -1)
        log.info("remote_started", id=command.id, pid=proc.pid)
        loop = asyncio.get_running_loop()
        command.readers = [
            loop.create_task(self._pump(command.id, out_r, 1)),
            loop.create_task(self._pump(command.id, err_r, 2)),
        ]
        if command.kill_requested:
            self._spawn_task(self._kill_tree(command))
        # Cancelled readers (pipes held past a kill's deadline) end up as results here.
        await asyncio.gather(*command.readers, return_exceptions=True)
        status = await proc.wait()
        self._finish(command, status if status >= 0 else 128 - status)

    async def _pump(self, id: str, read_fd: int, fd: int) -> None:
        """Relay ``read_fd`` as ``out`` messages for ``fd`` until EOF; closes it in any case."""
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        transport: asyncio.BaseTransport | None = None
        try:
            stream = asyncio.StreamReader(limit=CHUNK)
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stream), pipe
            )
            while chunk := await stream.read(CHUNK):
                self._send(encode("out", id=id, fd=fd, data=chunk))
        finally:
            if transport is not None:
                transport.close()
            else:
                pipe.close()

    def _finish(self, command: _Command, code: int) -> None:
        self._commands.pop(command.id, None)
        log.info("remote_exited", id=command.id, code=code)
        self._send(encode("exit", id=command.id, code=code))

    # -- killing ----------------------------------------------------------------------------

    async def _kill_tree(self, command: _Command) -> None:
        deadline = time.monotonic() + KILL_DEADLINE
        while True:
            snapshot = _snapshot()
            found = self._tree(command, snapshot)
            command.seen |= found
            alive = [(pid, start) for pid, start in found if snapshot[pid].state != "Z"]
            for pid, _ in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            self._reap_orphans(command, snapshot)
            if not alive:
                break
            if time.monotonic() > deadline:
                log.warning(
                    "remote_kill_incomplete", id=command.id, left=sorted(p for p, _ in alive)
                )
                break
            await asyncio.sleep(_KILL_POLL)
        log.info("remote_killed", id=command.id, processes=len(command.seen))
        # Whatever still holds the pipes was not found or would not die: stop reading them,
        # so the exit is still sent.
        pending = [reader for reader in command.readers if not reader.done()]
        if pending:
            grace = max(deadline - time.monotonic(), _PIPE_GRACE)
            _, pending_set = await asyncio.wait(pending, timeout=grace)
            for reader in pending_set:
                log.warning("remote_pipe_abandoned", id=command.id)
                reader.cancel()

    def _tree(self, command: _Command, snapshot: dict[int, _Stat]) -> set[_Identity]:
        """The command's processes now: descendants (by parent links) of the shell, of every
        process seen under it before, and of every process carrying its marker."""
        me = os.getpid()
        children: dict[int, list[int]] = {}
        for pid, stat in snapshot.items():
            children.setdefault(stat.ppid, []).append(pid)

        def current(identity: _Identity) -> bool:
            stat = snapshot.get(identity[0])
            return stat is not None and stat.start == identity[1]

        todo = [pid for pid, start in command.seen | {command.root} if current((pid, start))]
        marker = f"{MARKER_VAR}={command.marker}".encode()
        for pid, stat in snapshot.items():
            identity = (pid, stat.start)
            if identity in command.seen or identity in command.clean or pid in (1, me):
                continue
            if _carries(pid, marker):
                todo.append(pid)
            else:
                command.clean.add(identity)
        found: set[_Identity] = set()
        while todo:
            pid = todo.pop()
            identity = (pid, snapshot[pid].start)
            if identity in found or pid in (1, me):
                continue
            found.add(identity)
            todo.extend(children.get(pid, ()))
        return found

    def _reap_orphans(self, command: _Command, snapshot: dict[int, _Stat]) -> None:
        """Collect the zombies of this command's orphans re-parented to us (a subreaper); the
        shells themselves belong to asyncio."""
        me = os.getpid()
        shells = {c.root[0] for c in self._commands.values()} | {command.root[0]}
        for pid, start in command.seen:
            stat = snapshot.get(pid)
            if stat is None or stat.start != start or stat.state != "Z" or stat.ppid != me:
                continue
            if pid not in shells:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
