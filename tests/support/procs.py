"""Looking at this machine's processes from tests: are they alive, which MPI processes run."""

from __future__ import annotations

import os
import re
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
