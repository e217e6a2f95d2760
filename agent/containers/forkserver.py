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
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Final

from agora.agent.containers import _mounts
from agora.agent.containers.launch import ContainerSpec, LaunchError, spawn

__all__ = ["ForkServer", "main"]

_MAX_REQUEST: Final = 4 * 1024 * 1024
_SOCKET_FD: Final = 3
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # One request is one datagram, environment and all: make room for a large one.
        for sock in (ours, theirs):
            _grow_buffers(sock)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "agora.agent.containers.forkserver"],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={**os.environ, "AGORA_FORKSERVER_FD": str(theirs.fileno())},
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(self._timeout)
        self._sock = ours
        return ours

    def spawn(self, spec: ContainerSpec) -> int:
        """Like :func:`launch.spawn` (the caller must be a child subreaper); LaunchError."""
        with self._lock:
            sock = self._sock or self._start()
            request = pickle.dumps(replace(spec, stdin=0, stdout=1, stderr=2))
            try:
                socket.send_fds(sock, [request], [spec.stdin, spec.stdout, spec.stderr])
                reply = sock.recv(65536)
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
        kind, _, text = reply.partition(b":")
        if kind == b"P":
            return int(text)
        raise LaunchError(text.decode(errors="replace"))

    def close(self, *, kill: bool = False) -> None:
        """Stop the server (it exits when its socket closes; ``kill``: SIGKILL it at once)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._forked:
            _reap(self._forked, kill=kill)
            self._forked = 0
        if self._proc is not None:
            if kill:
                self._proc.kill()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


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
        _grow_buffers(sock)
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


def _grow_buffers(sock: socket.socket) -> None:
    """Send and receive buffers of _MAX_REQUEST (root may exceed net.core.[rw]mem_max)."""
    for force, plain in (
        (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF),
        (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
    ):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force if force is not None else plain, _MAX_REQUEST)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, _MAX_REQUEST)


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            request, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
        except OSError:
            return
        if not request:
            return
        try:
            if len(fds) != 3:
                raise LaunchError("the fork server got a request without its stdio")
            spec: ContainerSpec = pickle.loads(request)
            spec = replace(spec, stdin=fds[0], stdout=fds[1], stderr=fds[2])
            reply = b"P:%d" % spawn(spec, adopted_above=True)
        except LaunchError as exc:
            reply = b"E:" + str(exc).encode(errors="replace")
        except Exception as exc:  # never die on one request
            reply = b"E:" + f"fork server: {exc!r}".encode(errors="replace")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            sock.send(reply)
        except OSError:
            return


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
