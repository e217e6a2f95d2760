"""Looking at this machine's processes from tests: are they alive, which MPI processes run,
which carry a test's mark; and stopping one a test started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

_MPI = re.compile(rb"(^|/)(orted|mpirun) |-m mpi4py ")


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def mpi_pids() -> set[int]:
    """Processes of Open MPI (mpirun, orted) or of an mpi4py rank, anywhere on this machine."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if _MPI.search(cmdline):
            found.add(int(entry))
    return found


def marked(variable: str, value: str) -> list[int]:
    """Live processes (not this one) whose environment sets ``variable=value``: what a test
    started, with all their children, for it to sweep up."""
    wanted = f"{variable}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ and alive(int(entry)):
            found.append(int(entry))
    return found


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM ``proc``; after ``grace`` seconds SIGKILL its process group. Reaps it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
