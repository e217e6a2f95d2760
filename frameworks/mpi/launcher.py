"""What ``mpirun`` runs instead of ssh.

Called as ``python -m agora.frameworks.mpi.launcher [opts] HOST WORD…``: it skips ssh's
options, joins the words with single spaces, asks the rank-0 executor (over the unix socket
named by :data:`SOCKET_VAR`) to run that on HOST, copies the command's output to its own
stdout/stderr and exits with its exit status: 255 when the executor cannot be reached or the
connection ends before the status arrives, as ssh does. stdin is ignored. Killing the launcher
closes the socket, which is what tells the executor to kill the remote command.

Kept light (no logging setup, no asyncio): ``mpirun`` starts one per remote host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Final

from agora.frameworks.mpi.protocol import (
    UNREACHABLE,
    ProtocolError,
    decode,
    encode,
    frame,
    read_frames,
)

__all__ = ["SOCKET_VAR", "UsageError", "main", "split_command"]

SOCKET_VAR: Final = "AGORA_MPI_LAUNCH_SOCKET"
#: ssh options that take a value (``-o Opt=val`` or ``-oOpt=val``).
VALUE_OPTIONS: Final = frozenset("bcDEeFIiJLlmOopQRSWw")
_PROG: Final = "agora-mpi-launcher"


class UsageError(ValueError):
    """The command line names no host or no command."""


def split_command(argv: Sequence[str]) -> tuple[str, str]:
    """``(host, command)`` from ssh-style arguments: leading options skipped as ssh's getopt
    would (``-x``, ``-o Opt=val``, ``-oOpt=val``, ``-p22``, ``-Tx``, ``--``), the remaining
    words after the host joined with single spaces."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        for j, letter in enumerate(arg[1:], start=2):
            if letter in VALUE_OPTIONS:
                if j == len(arg):  # value in the next argument
                    i += 1
                    if i == len(argv):
                        raise UsageError(f"option -{letter} needs a value")
                break
        i += 1
    rest = argv[i:]
    if not rest:
        raise UsageError("no host given")
    if len(rest) < 2:
        raise UsageError(f"no command given for {rest[0]}")
    return rest[0], " ".join(rest[1:])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        host, cmd = split_command(args)
    except UsageError as exc:
        return _fail(f"{exc} (usage: {_PROG} [ssh options] HOST WORD...)")
    path = os.environ.get(SOCKET_VAR)
    if not path:
        return _fail(f"{SOCKET_VAR} is not set: not started by an Agora MPI executor")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.connect(path)
            sock.sendall(frame(encode("run", host=host, cmd=cmd)))
        except OSError as exc:
            return _fail(f"cannot reach the MPI executor at {path}: {exc.strerror or exc}")
        return _relay(sock, host)


def _relay(sock: socket.socket, host: str) -> int:
    """Copy ``out`` frames to fd 1/2 until the ``exit`` frame; its code, else 255."""
    buffer = bytearray()
    broken: set[int] = set()
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return _fail(f"connection to the MPI executor closed before {host}'s command ended")
        buffer += data
        try:
            for raw in read_frames(buffer):
                message = decode(raw)
                if message["t"] == "out":
                    _write_all(message["fd"], message["data"], broken)
                elif message["t"] == "exit":
                    code: int = message["code"]
                    return code if 0 <= code <= 255 else UNREACHABLE
                else:
                    raise ProtocolError(f"unexpected {message['t']} message")
        except ProtocolError as exc:
            return _fail(f"bad message from the MPI executor: {exc}")


def _write_all(fd: int, data: bytes, broken: set[int]) -> None:
    """Write all of ``data`` to ``fd``; once that fails (reader gone), drop its output."""
    view = memoryview(data)
    while view and fd not in broken:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            broken.add(fd)


def _fail(reason: str) -> int:
    with contextlib.suppress(OSError):
        os.write(2, f"{_PROG}: {reason}\n".encode(errors="replace"))
    return UNREACHABLE


def _exit_on_signals() -> None:
    """SIGTERM/SIGINT/SIGHUP end the launcher at once (the closed socket tells the executor)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


if __name__ == "__main__":
    _exit_on_signals()
    sys.exit(main())
