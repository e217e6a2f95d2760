"""The init (pid 1) of a container's pid namespace: forwards signals, reaps, exits with the task
(after a SIGTERM: once every process of the container has exited).

Runs in a forked child of the launcher, so it only makes syscalls. The signals it forwards and
SIGCHLD are blocked before it is forked (a pid 1 drops unhandled signals, but never blocked ones)
and taken with sigwaitinfo, never by handlers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn

FORWARDED: Final = frozenset(
    {
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    }
)
WAITED: Final = FORWARDED | {signal.SIGCHLD}

# Set to SIG_DFL in the process that execs: Python ignores SIGPIPE and SIGXFSZ, and ignored
# signals stay ignored across exec.
_RESET: Final = FORWARDED | {signal.SIGPIPE, signal.SIGXFSZ}


def block_init_signals() -> None:
    """Block what the init waits for; done before forking it so nothing is lost."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)


def restore_signals() -> None:
    """Default dispositions and an empty mask, just before exec."""
    for sig in _RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def find_program(name: str, env: Mapping[str, str]) -> str:
    """``name`` looked up in the task's PATH, as execvp would."""
    if "/" in name:
        return name
    found_but_denied = False
    for directory in os.get_exec_path(dict(env)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            found_but_denied = True
    code = errno.EACCES if found_but_denied else errno.ENOENT
    raise OSError(code, os.strerror(code))


def spawn_task(path: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start the command (pid 2) with default signal handling and nothing blocked."""
    return os.posix_spawn(path, list(argv), dict(env), setsigmask=(), setsigdef=_RESET)


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128+N for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def run_init(task: int) -> NoReturn:
    """Serve as pid 1 until the task is over, then exit with the task's code.

    The task is over when ``task`` (pid 2) exits, unless a SIGTERM came first: then it is over
    once every process of the container has exited, so that a clean-up started by the SIGTERM
    (a shell's trap, a Python handler, a child still shutting down after the shell died) gets
    to finish. Whoever sent the SIGTERM bounds that wait: at the end of the task's kill grace
    period the executor SIGKILLs this init, which ends the namespace and all in it. Exiting
    ends the namespace too (the kernel SIGKILLs whatever is left).
    """
    terminating = False
    code: int | None = None  # the task's, once it has exited
    while True:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo != signal.SIGCHLD:
            _forward(info.si_signo)
            terminating = terminating or info.si_signo == signal.SIGTERM
            continue
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # nobody left in the namespace but this init
                os._exit(127 if code is None else code)  # 127: cannot happen
            if pid == 0:
                break
            if pid == task:
                code = exit_code(status)
                if not terminating:
                    os._exit(code)


def _forward(signo: int) -> None:
    """``signo`` to every process of the namespace (a SIGCONT after a SIGTERM: a stopped
    process must run to see it)."""
    with contextlib.suppress(OSError):  # nobody left to signal
        os.kill(-1, signo)
    if signo == signal.SIGTERM:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGCONT)
