"""A fork server for container launches: a small process, started once per executor, that forks
the containers so that the executor (a much larger Python process) does not copy its page tables
and heap for each one.

Forking costs grow with the size of the forking process: ~50 ms per pid-namespace container from
a 47 MB executor, much less from this server (it imports only the launcher). The executor sends
each :class:`~agora.agent.containers.launch.ContainerSpec` (pickled; its stdin/stdout/stderr
passed as descriptors over a Unix socket) and gets back the init's pid or the launch error. The
server is no subreaper: a container's init is adopted by the executor (which is), so the executor
reaps it and learns the task's exit status as if it had forked it. A container without a pid
namespace is adopted the same way: its command's process is forked off the server's child,
which exits at once.

The server dies with the executor (PR_SET_PDEATHSIG) and exits when its socket closes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from agora.agent.containers import _mounts
from agora.agent.containers.helper_process import (
    MAX_REQUEST,
    grow_buffers,
    start_helper,
    stop_helper,
)
from agora.agent.containers.launch import ContainerSpec, LaunchError, Pending, start

if TYPE_CHECKING:  # the server process does without asyncio (every fork copies what it loads)
    import asyncio

__all__ = ["ForkServer", "main"]

_SOCKET_FD: Final = 3
#: Every request and its reply start with the request's number: replies come in the order the
#: containers finish their setup, not the order they were asked for.
_TAG: Final = struct.Struct("=Q")
#: How long one launch may take the server (setting up namespaces, mounts, the command's exec)
#: before it is declared stuck: killed, and started afresh on the next launch.
LAUNCH_TIMEOUT: Final = 30.0


class ForkServer:
    """The executor's side: start the server lazily, send it specs, get pids back."""

    def __init__(self, timeout: float = LAUNCH_TIMEOUT) -> None:
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._forked = 0  # the pid of a server taken from prefork (no Popen)
        self._lock = threading.Lock()
        self._tags = 0
        #: Launches of spawn_async awaiting their reply, by tag; the loop that reads the socket.
        self._waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (None before the first spawn and after close)."""
        return self._proc.pid if self._proc is not None else (self._forked or None)

    def _start(self) -> socket.socket:
        global _preforked
        if _preforked is not None:  # forked at this process's start (see prefork)
            (sock, self._forked), _preforked = _preforked, None
            sock.settimeout(self._timeout)
            self._sock = sock
            return sock
        self._sock, self._proc = start_helper(
            [sys.executable, "-m", "agora.agent.containers.forkserver"],
            os.environ,
            "AGORA_FORKSERVER_FD",
            self._timeout,
        )
        return self._sock

    def spawn(self, spec: ContainerSpec) -> int:
        """Like :func:`launch.spawn` (the caller must be a child subreaper); LaunchError. Replies
        to launches of :meth:`spawn_async` still in flight are handed to them meanwhile."""
        with self._lock:
            sock = self._sock or self._start()
            tag = self._send(sock, spec)
            try:
                while True:
                    reply = sock.recv(65536)
                    if not reply or reply[: _TAG.size] == tag:
                        break
                    self._deliver(reply)
            except TimeoutError:
                self.close(kill=True)
                raise LaunchError(
                    f"the container launch took over {self._timeout:g} s (fork server killed)"
                ) from None
            except OSError as exc:
                self.close(kill=True)
                raise LaunchError(f"the container fork server failed: {exc}") from None
        if not reply:
            self.close()
            raise LaunchError("the container fork server exited")
        return _pid_of(reply[_TAG.size :])

    async def spawn_async(self, spec: ContainerSpec) -> int:
        """:meth:`spawn` without blocking the event loop: several launches may be in flight, the
        server sets their containers up at the same time. Cancelled before its reply, the
        container is killed when the reply comes."""
        import asyncio

        loop = asyncio.get_running_loop()
        with self._lock:
            sock = self._sock or self._start()
            if self._loop is not loop:
                if self._loop is not None:
                    raise RuntimeError("the fork server is already read by another event loop")
                loop.add_reader(sock.fileno(), self._readable)
                self._loop = loop
            try:
                tag = self._send(sock, spec)
            except OSError as exc:
                self.close(kill=True)
                raise LaunchError(f"the container fork server failed: {exc}") from None
            future: asyncio.Future[bytes] = loop.create_future()
            self._waiting[tag] = future
        try:
            async with asyncio.timeout(self._timeout):
                reply = await asyncio.shield(future)
        except TimeoutError:
            self.close(kill=True)
            raise LaunchError(
                f"the container launch took over {self._timeout:g} s (fork server killed)"
            ) from None
        except asyncio.CancelledError:
            future.add_done_callback(_kill_orphan)
            raise
        return _pid_of(reply)

    def _send(self, sock: socket.socket, spec: ContainerSpec) -> bytes:
        self._tags += 1
        tag = _TAG.pack(self._tags)
        request = tag + pickle.dumps(replace(spec, stdin=0, stdout=1, stderr=2))
        socket.send_fds(sock, [request], [spec.stdin, spec.stdout, spec.stderr])
        return tag

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            reply = sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:  # taken by a synchronous spawn meanwhile
            return
        except OSError as exc:
            self._fail_waiting(f"the container fork server failed: {exc}")
            self.close(kill=True)
            return
        if not reply:
            self._fail_waiting("the container fork server exited")
            self.close()
            return
        self._deliver(reply)

    def _deliver(self, reply: bytes) -> None:
        future = self._waiting.pop(reply[: _TAG.size], None)
        if future is not None and not future.done():
            future.set_result(reply[_TAG.size :])

    def _fail_waiting(self, why: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(LaunchError(why))

    def close(self, *, kill: bool = False) -> None:
        """Stop the server (it exits when its socket closes; ``kill``: SIGKILL it at once)."""
        self._fail_waiting("the container fork server was stopped")
        if self._sock is not None:
            if self._loop is not None:
                if not self._loop.is_closed():
                    self._loop.remove_reader(self._sock.fileno())
                self._loop = None
            self._sock.close()
            self._sock = None
        if self._forked:
            _reap(self._forked, kill=kill)
            self._forked = 0
        if self._proc is not None:
            stop_helper(self._proc, kill=kill)
            self._proc = None


def _pid_of(reply: bytes) -> int:
    kind, _, text = reply.partition(b":")
    if kind == b"P":
        return int(text)
    raise LaunchError(text.decode(errors="replace"))


def _kill_orphan(future: asyncio.Future[bytes]) -> None:
    """The reply to a cancelled launch: its container is nobody's, kill it (its first process is
    re-parented to us, the subreaper, and reaped with the other strays)."""
    if future.cancelled() or future.exception() is not None:
        return
    try:
        pid = _pid_of(future.result())
    except (LaunchError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


#: A server forked by :func:`prefork`, for this process's first ForkServer: (socket, pid).
_preforked: tuple[socket.socket, int] | None = None


def prefork() -> None:
    """Fork a server now, for this process's first :class:`ForkServer` to use instead of starting
    one by exec (~100 ms of interpreter start and imports). For a process that is still small and
    single-threaded: the executor forked by the agent's zygote calls it before it runs (a fork
    of a process that has grown, or has threads, would cost each container more)."""
    global _preforked
    if _preforked is not None:
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        grow_buffers(sock)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            _mounts.die_with_parent()
            os.closerange(3, theirs.fileno())
            os.closerange(theirs.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
            _serve(theirs)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    _preforked = (ours, pid)


def _reap(pid: int, *, kill: bool, timeout: float = 2.0) -> None:
    """Wait for our child ``pid`` to exit (SIGKILL it first with ``kill``, or after ``timeout``)."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    delay = 0.001
    try:
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except ChildProcessError:  # reaped by our own sweep of exited children
        pass


def _serve(sock: socket.socket) -> None:
    """Serve launches until the socket closes. Several may be in flight: each container's
    children set it up while the server takes the next request; a reply goes out when that
    container's report pipe reaches EOF (its command exec'd, or its setup failed)."""
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    pending: dict[int, tuple[bytes, Pending, list[bytes]]] = {}
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is sock:
                    if not _take_request(sock, selector, pending):
                        return
                    continue
                fd = key.fd
                chunk = os.read(fd, 65536)
                if chunk:
                    pending[fd][2].append(chunk)
                    continue
                selector.unregister(fd)
                os.close(fd)
                tag, launch, chunks = pending.pop(fd)
                try:
                    reply = b"P:%d" % launch.finish(b"".join(chunks))
                except LaunchError as exc:
                    reply = b"E:" + str(exc).encode(errors="replace")
                except Exception as exc:  # never die on one request
                    reply = b"E:" + f"fork server: {exc!r}".encode(errors="replace")
                if not _reply(sock, tag + reply):
                    return
    finally:
        selector.close()


def _take_request(
    sock: socket.socket,
    selector: selectors.BaseSelector,
    pending: dict[int, tuple[bytes, Pending, list[bytes]]],
) -> bool:
    """Start the container of one request (False: the socket is gone)."""
    try:
        request, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
    except OSError:
        return False
    if not request:
        return False
    tag, body = request[: _TAG.size], request[_TAG.size :]
    try:
        if len(fds) != 3 or len(tag) != _TAG.size:
            raise LaunchError("the fork server got a request without its stdio")
        spec: ContainerSpec = pickle.loads(body)
        spec = replace(spec, stdin=fds[0], stdout=fds[1], stderr=fds[2])
        launch = start(spec, adopted_above=True)
    except LaunchError as exc:
        return _reply(sock, tag + b"E:" + str(exc).encode(errors="replace"))
    except Exception as exc:  # never die on one request
        return _reply(sock, tag + b"E:" + f"fork server: {exc!r}".encode(errors="replace"))
    finally:
        for fd in fds:
            os.close(fd)
    pending[launch.report] = (tag, launch, [])
    selector.register(launch.report, selectors.EVENT_READ)
    return True


def _reply(sock: socket.socket, reply: bytes) -> bool:
    try:
        sock.send(reply)
    except OSError:
        return False
    return True


def main() -> None:
    """``python -m agora.agent.containers.forkserver`` (started by :class:`ForkServer`)."""
    _mounts.die_with_parent()
    fd = int(os.environ.pop("AGORA_FORKSERVER_FD", str(_SOCKET_FD)))
    sock = socket.socket(fileno=fd)
    try:
        _serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
