"""Which paths of an ``agora mpirun`` command its ranks cannot see, decided before anything
starts (pure: no file system access; the caller resolves symlinks if it wants to).

A rank runs in a container whose /tmp is its own: the agent mounts the sandbox's ``tmp`` over
/tmp and binds back only the sandbox and its own runtime (this Python, Agora). A program, a
script given to an interpreter or a working directory under /tmp therefore does not exist for
the ranks, which would each fail with a traceback. ``unseen`` names the first such path and
why, as one line.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

__all__ = ["PRIVATE_DIRS", "script_of", "unseen"]

#: Directories every rank sees as its own, empty private copy (the agent's private /tmp).
PRIVATE_DIRS: tuple[str, ...] = ("/tmp",)

#: Interpreters whose first non-option argument is a script file.
_SCRIPTED = ("python", "bash", "sh", "dash", "zsh", "perl", "ruby", "node", "Rscript", "julia")
#: Python options that take a value (the value is not the script).
_PY_VALUED = frozenset({"-W", "-X", "-Q"})
#: Options of ``python -m mpi4py`` that take a value.
_MPI4PY_VALUED = frozenset({"-rc"})


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _absolute(path: str, workdir: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


def _interpreter(program: str) -> str | None:
    name = posixpath.basename(program)
    for base in _SCRIPTED:
        if name == base or (
            name.startswith(base) and name[len(base) :].lstrip("0123456789.") == ""
        ):
            return base
    return None


def script_of(command: Sequence[str]) -> str | None:
    """The script file an interpreter command runs (``python -m mpi4py app.py`` → app.py;
    ``bash run.sh`` → run.sh), or None when it runs none (``-c``, ``-m`` of another module)."""
    if not command:
        return None
    kind = _interpreter(command[0])
    if kind is None:
        return None
    args = list(command[1:])
    i = 0
    valued = _PY_VALUED if kind == "python" else frozenset()
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if arg in ("-c", "-e") or arg == "-":
            return None
        if kind == "python" and arg == "-m":
            if i + 1 < len(args) and args[i + 1] == "mpi4py":
                valued, i = _MPI4PY_VALUED, i + 2  # mpi4py's own options, then the script
                continue
            return None
        if arg.startswith("-"):
            i += 2 if arg in valued else 1
            continue
        return arg
    return None


def unseen(command: Sequence[str], workdir: str, visible: Sequence[str] = ()) -> str | None:
    """One line naming the first path of the job the ranks cannot see, and why; None if none.

    ``workdir`` is where the ranks start (absolute); relative paths are taken from it.
    ``visible``: directories kept visible inside containers although under a private
    directory (the runtime the agents keep: this Python's prefix)."""
    checks: list[tuple[str, str]] = [(workdir, "the working directory")]
    if command and "/" in command[0]:
        checks.append((_absolute(command[0], workdir), "the program"))
    script = script_of(command)
    if script is not None:
        checks.append((_absolute(script, workdir), "the script"))
    for path, what in checks:
        if any(_under(path, kept) for kept in visible):
            continue
        for private in PRIVATE_DIRS:
            if _under(path, private):
                fix = (
                    "run from, or give --chdir, a directory every agent shares"
                    if what == "the working directory"
                    else "put it under a path every agent shares (e.g. your home or the "
                    "project directory) and run it from there"
                )
                return (
                    f"{what} {path} is under {private}, which every rank sees as its own "
                    f"private directory (containers get a private {private}); {fix}"
                )
    return None
