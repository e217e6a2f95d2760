"""What a machine lacks to run MPI jobs, each item one line saying how to get it.

``agora mpirun`` prints these before it asks for a gang, so a user without Open MPI or mpi4py
hears so at once, not from a rank's traceback on some agent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Final

__all__ = ["OPEN_MPI_HINT", "missing"]

OPEN_MPI_HINT: Final = "apt-get install openmpi-bin libopenmpi-dev"
_MPI4PY_HINT: Final = "pip install mpi4py"
#: Loads mpi4py's MPI module (and so libmpi) without MPI_Init: no daemons, no side effects.
_IMPORT_MPI4PY: Final = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI"
_VERSION: Final = re.compile(r"\(Open MPI\)\s+(\d+)\.(\d+)(?:\.(\d+))?")


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    """(exit code, stdout + stderr), or (-1, why) when it cannot run or times out."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    except OSError as exc:
        return -1, exc.strerror or str(exc)
    text = (done.stdout + done.stderr).decode("utf-8", errors="replace")
    return done.returncode, text


def _last_line(text: str, limit: int = 160) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "no output"


def _open_mpi_version(mpirun: str, timeout: float) -> str | None:
    """None when ``mpirun`` is Open MPI 4.x, else the line that says what is wrong."""
    code, text = _run([mpirun, "--version"], timeout)
    if code != 0:
        return f"Open MPI: `{mpirun} --version` failed ({_last_line(text)}); {OPEN_MPI_HINT}"
    match = _VERSION.search(text)
    if match is None:
        return (
            f"Open MPI: {mpirun} is not Open MPI ({_last_line(text)}); "
            f"Agora's launcher supports Open MPI 4.1: {OPEN_MPI_HINT}"
        )
    major, minor = match.group(1), match.group(2)
    if major != "4":
        return f"found Open MPI {major}.{minor}; Agora's launcher supports 4.1: {OPEN_MPI_HINT}"
    return None


def missing(python: str = sys.executable, *, timeout: float = 10.0) -> list[str]:
    """What this machine lacks to run MPI jobs with ``python``; ``[]`` when nothing.

    Looks for ``mpirun`` and ``orted`` on ``$PATH``, checks that ``mpirun`` is Open MPI 4.x,
    and that ``python`` can import mpi4py (in a subprocess bounded by ``timeout`` seconds).
    """
    problems: list[str] = []
    # The two probes run side by side: both are on the path of every agora mpirun.
    with ThreadPoolExecutor(max_workers=1) as pool:
        mpi4py = pool.submit(_run, [python, "-c", _IMPORT_MPI4PY], timeout)
        tools = {name: shutil.which(name) for name in ("mpirun", "orted")}
        absent = [name for name, path in tools.items() if path is None]
        if absent:
            problems.append(f"Open MPI: {', '.join(absent)} not on PATH; {OPEN_MPI_HINT}")
        mpirun = tools["mpirun"]
        if mpirun is not None:
            wrong = _open_mpi_version(mpirun, timeout)
            if wrong is not None:
                problems.append(wrong)
        code, text = mpi4py.result()
    if code != 0:
        problems.append(f"mpi4py: {_MPI4PY_HINT} (not importable by {python}: {_last_line(text)})")
    return problems
