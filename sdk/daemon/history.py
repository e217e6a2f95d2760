"""An append-only JSONL history of what a process did, for the fault suite's checker.

Off unless a path is given (``--history FILE`` on the daemons, ``AGORA_HISTORY`` for drivers).
Each line is one JSON object: ``t`` (``time.monotonic_ns()``, comparable across processes on one
host), ``node`` (who wrote it), ``kind`` and the event's fields. Lines are written with one
``write`` on an ``O_APPEND`` descriptor, so several writers may share a file and a crash loses at
most the line being written.

Kinds written by Agora's processes (the checker in ``tests/support/history_checker.py`` reads them):

============== ========= ============================================================
kind           writer    fields
============== ========= ============================================================
term           master    term (its current term; at start and on every change)
leader         master    term (became leader of it)
heard_leader   master    term, leader (first message of a new leader in that term)
stepped_down   master    term
acting         master    term, until (monotonic ns its lease lasts; it sent offers/launches)
commit         master    term, index, digest (a registry entry it applied)
epoch          agent     epoch (the highest master epoch it has seen rose to this)
launch         agent     task, framework, epoch, resources (text form)
end            agent     task, framework, state (the task's terminal state)
total          agent     resources (what the agent offers, text form; once, at registration)
update         agent     task, framework, uuid (hex), state (a status update it generated)
received       framework task, uuid (hex), state (an UPDATE it was given)
ack            framework task, uuid (hex) (it acknowledged that update)
offer          framework epoch (it received offers)
fault, healed  nemesis   what
============== ========= ============================================================
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["History"]


class History:
    """Appends events to ``path``; a History without a path records nothing (and costs nothing)."""

    def __init__(self, path: Path | str | None, node: str) -> None:
        self.node = node
        self._fd: int | None = None
        if path is not None and str(path):
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def record(self, kind: str, **fields: Any) -> None:
        if self._fd is None:
            return
        line = json.dumps(
            {"t": time.monotonic_ns(), "node": self.node, "kind": kind, **fields},
            separators=(",", ":"),
            default=str,
        )
        # A full disk must not take a daemon down; the checker will see the gap.
        with contextlib.suppress(OSError):
            os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
