"""Who is left of a process group, read from /proc.

A killed task's process group may outlive its leader: the shell dies on the SIGTERM at once
while the command it started is still running its clean-up. The executor keeps the leader
unreaped while it waits (a zombie leader keeps the group id from being reused) and asks here,
every few tens of milliseconds, whether anything else of the group still runs. There is no
kernel call that answers it: ``killpg(pgid, 0)`` succeeds as long as the zombie leader exists.
"""

from __future__ import annotations

import os

__all__ = ["group_alive"]


def group_alive(pgid: int, proc: str = "/proc") -> bool:
    """True while a process of group ``pgid`` exists that is not a zombie (the leader counts)."""
    try:
        entries = os.scandir(proc)
    except OSError:
        return False
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"{proc}/{entry.name}/stat", "rb") as stat:
                    data = stat.read()
            except OSError:  # gone meanwhile
                continue
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
            fields = data[data.rfind(b")") + 2 :].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
    return False
