"""A helper process the caller talks to over a private socketpair (the container fork server,
the executor zygote): one datagram per request, its descriptors passed with it.

:func:`start_helper` makes the pair with room for a large request, starts the helper with its end
(the descriptor number in ``fd_var`` of its environment) and keeps the caller's end, with a
deadline on every call.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = ["MAX_REQUEST", "grow_buffers", "start_helper", "stop_helper"]

#: The largest request datagram: an environment and all.
MAX_REQUEST: Final = 4 * 1024 * 1024


def grow_buffers(sock: socket.socket) -> None:
    """Send and receive buffers of MAX_REQUEST (root may exceed net.core.[rw]mem_max)."""
    for force, plain in (
        (getattr(socket, "SO_SNDBUFFORCE", None), socket.SO_SNDBUF),
        (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF),
    ):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force if force is not None else plain, MAX_REQUEST)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, MAX_REQUEST)


def start_helper(
    argv: Sequence[str], env: Mapping[str, str], fd_var: str, timeout: float
) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """Start ``argv`` with one end of a new SOCK_SEQPACKET pair; (our end, its process)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        grow_buffers(sock)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            env={**env, fd_var: str(theirs.fileno())},
            close_fds=True,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    ours.settimeout(timeout)
    return ours, proc


def stop_helper(proc: subprocess.Popen[bytes], *, kill: bool, timeout: float = 2.0) -> None:
    """Wait for a helper whose socket was closed to exit (it exits then); ``kill``: SIGKILL it
    first. One that is still there after ``timeout`` s is SIGKILLed and waited for as long."""
    if kill:
        proc.kill()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
