"""Starting a task's process: its sandbox files (``stdout`` and ``stderr``, with pipes in front of
them when its output is streamed), the program resolved through the task's PATH, and the spawn
itself: ``posix_spawn`` (vfork + exec) in a session of its own, or ``subprocess.Popen`` when it
runs as another user."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agora.agent.executors.task_process import OutputStream, RunAs

__all__ = ["TaskFiles", "open_task_files", "popen_task", "posix_spawn_task", "which"]

_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
# Python ignores these at start-up; a child's command must see the default dispositions.
_DEFAULT_SIGNALS: Final = (signal.SIGPIPE, signal.SIGXFSZ)


@dataclass(slots=True)
class TaskFiles:
    """A task's open files before its process starts: ``out``/``err`` are the child's ends,
    ``kept`` what the executor closes once the child holds them, ``opened`` everything."""

    sandbox: str
    out: int = -1
    err: int = -1
    kept: list[int] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    streams: dict[int, OutputStream] = field(default_factory=dict)

    def close(self) -> None:
        for fd in self.opened:
            os.close(fd)
        self.opened.clear()


def open_task_files(sandbox: str, stream: bool, run_as: RunAs | None) -> TaskFiles:
    """The task's sandbox, its stdout and stderr files and, with ``stream``, pipes in front
    of them. Raises OSError (nothing open is left then)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(sandbox)
    files = TaskFiles(sandbox)
    try:
        out = os.open(f"{sandbox}/stdout", _FILE_FLAGS, 0o644)
        files.opened.append(out)
        err = os.open(f"{sandbox}/stderr", _FILE_FLAGS, 0o644)
        files.opened.append(err)
        if run_as is not None:
            os.chown(sandbox, run_as.uid, run_as.gid)
            os.fchown(out, run_as.uid, run_as.gid)
            os.fchown(err, run_as.uid, run_as.gid)
        files.out, files.err = out, err
        files.kept = [out, err]
        if stream:
            out_r, files.out = os.pipe()
            files.opened += (out_r, files.out)
            err_r, files.err = os.pipe()
            files.opened += (err_r, files.err)
            os.set_blocking(out_r, False)
            os.set_blocking(err_r, False)
            files.streams = {
                out_r: OutputStream("stdout", out_r, out),
                err_r: OutputStream("stderr", err_r, err),
            }
            files.kept = [files.out, files.err]
    except BaseException:
        files.close()
        raise
    return files


def posix_spawn_task(
    path: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
    home: int,
) -> int:
    """Start ``path`` in its own session with ``stdio`` as its stdin, stdout and stderr, the
    default dispositions of the signals Python ignores, in ``cwd``: the executor (single
    threaded) changes its own directory around the call, back to ``home`` (a descriptor)."""
    stdin, stdout, stderr = stdio
    actions = [
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    os.chdir(cwd)
    try:
        return os.posix_spawn(
            path,
            args,
            env,
            file_actions=actions,
            setsid=True,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    finally:
        os.fchdir(home)


def popen_task(
    path: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
    run_as: RunAs,
) -> subprocess.Popen[bytes]:
    """Start ``path`` as ``run_as`` (the executor is root), otherwise as :func:`posix_spawn_task`
    does; slower (a fork of the executor)."""
    stdin, stdout, stderr = stdio
    return subprocess.Popen(
        args,
        executable=path,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        user=run_as.uid,
        group=run_as.gid,
        extra_groups=list(run_as.groups),
    )


def which(program: str, search_path: str, cwd: str) -> str:
    """``program`` resolved like execvp would, through the task's own PATH."""
    if "/" in program:
        return program if os.path.isabs(program) else os.path.join(cwd, program)
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if not os.path.isabs(candidate):
            candidate = os.path.join(cwd, candidate)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(2, f"{program!r} not found in PATH", program)
