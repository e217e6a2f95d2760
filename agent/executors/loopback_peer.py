"""Which process is at the other end of a loopback TCP connection (Linux ``/proc``).

A server on 127.0.0.1 can be reached by every local user. When it must serve only processes it
started itself (the Mesos executor bridge serves only its executor), it finds the client's
socket in ``/proc/net/tcp`` and ``tcp6`` (the server's own network namespace) by the two ports,
then looks for that socket among the open files of the processes it trusts. A process of another
user cannot pose as one of them: it would need one of their sockets.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

__all__ = ["descendants", "holds_socket", "socket_inode"]

_ESTABLISHED = "01"


def socket_inode(client_port: int, server_port: int, net: str = "/proc/net") -> int | None:
    """The inode of the client's end of an established loopback connection from
    ``client_port`` to ``server_port``, or None when there is none."""
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(net, name), encoding="ascii") as table:
                next(table, None)  # the header
                for line in table:
                    inode = _match(line.split(), client_port, server_port)
                    if inode is not None:
                        return inode
        except OSError:
            continue
    return None


def _match(fields: list[str], client_port: int, server_port: int) -> int | None:
    # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
    if len(fields) < 10 or fields[3] != _ESTABLISHED:
        return None
    try:
        local = int(fields[1].rsplit(":", 1)[1], 16)
        remote = int(fields[2].rsplit(":", 1)[1], 16)
        inode = int(fields[9])
    except (IndexError, ValueError):
        return None
    if local == client_port and remote == server_port and inode:
        return inode
    return None


def holds_socket(pids: Iterable[int], inode: int, proc: str = "/proc") -> int | None:
    """The first of ``pids`` with the socket ``inode`` open, or None."""
    wanted = f"socket:[{inode}]"
    for pid in pids:
        fds = os.path.join(proc, str(pid), "fd")
        try:
            names = os.listdir(fds)
        except OSError:
            continue  # gone, or not ours to read
        for fd in names:
            try:
                if os.readlink(os.path.join(fds, fd)) == wanted:
                    return pid
            except OSError:
                continue
    return None


def descendants(root: int, proc: str = "/proc") -> Iterator[int]:
    """``root`` and every process below it (children first found first)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat"), encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after it.
        rest = stat[stat.rfind(")") + 2 :].split()
        if len(rest) > 1 and rest[1].isdigit():
            children.setdefault(int(rest[1]), []).append(int(entry))
    queue = [root]
    seen = set()
    while queue:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        yield pid
        queue.extend(children.get(pid, ()))
