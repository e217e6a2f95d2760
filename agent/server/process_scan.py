"""Processes found through ``/proc``: the agent's children, and processes by their sandbox.

The agent makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``, see
:func:`become_subreaper`), so what an executor leaves behind is re-parented to it:
:func:`children` lists them. Every executor and task is started with ``AGORA_SANDBOX`` in its
environment, which names the sandbox it belongs to even after its parent is gone:
:func:`started_in`, :func:`sandbox_process_alive` and :func:`kill_sandbox_processes` go by it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Iterator

import structlog

__all__ = [
    "become_subreaper",
    "children",
    "kill_sandbox_processes",
    "sandbox_process_alive",
    "started_in",
]

log = structlog.get_logger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
_SANDBOX_VAR = b"AGORA_SANDBOX="


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children() -> Iterator[int]:
    """Pids of this process's children (all threads), from /proc."""
    pid = os.getpid()
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return
    readable = False
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/children", encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue
        readable = True
        for item in text.split():
            with contextlib.suppress(ValueError):
                yield int(item)
    if not readable:  # kernels without CONFIG_PROC_CHILDREN: scan every process's parent
        yield from _children_by_scan(pid)


def _children_by_scan(parent: int) -> Iterator[int]:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(parent):
            yield int(entry)


def kill_sandbox_processes(sandbox: str) -> int:
    """SIGKILL every process on the host started in ``sandbox`` (by AGORA_SANDBOX)."""
    killed = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        if not started_in(int(entry), sandbox):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
    if killed:
        log.info("sandbox_processes_killed", count=killed, sandbox=sandbox)
    return killed


def started_in(pid: int, sandbox: str) -> bool:
    """``pid`` was started in ``sandbox`` or below it (by its AGORA_SANDBOX)."""
    where = _sandbox_of(pid)
    return where is not None and (where + os.sep).startswith(sandbox.rstrip(os.sep) + os.sep)


def sandbox_process_alive(pid: int, sandbox: str) -> bool:
    """``pid`` is alive and was started in ``sandbox`` (guards against a reused pid)."""
    where = _sandbox_of(pid)
    return where is not None and where == sandbox.rstrip(os.sep)


def _sandbox_of(pid: int) -> str | None:
    """The AGORA_SANDBOX a process started with, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for entry in data.split(b"\x00"):
        if entry.startswith(_SANDBOX_VAR):
            return os.fsdecode(entry[len(_SANDBOX_VAR) :]).rstrip(os.sep)
    return None
