"""A warm parent for the built-in executor: start it by fork in milliseconds, not by exec in 250.

The built-in (command) executor is a Python process that imports the SDK, the codec and the
containerizer: started with ``python -m`` it spends ~230 ms importing before it says a word, and
every ``agora run`` starts one. The *zygote* is a process the agent starts once that has already
imported the executor. To launch one, the agent sends it the executor's environment, sandbox and
stdio; the zygote forks a child that forks the executor and exits, so the executor (the
grandchild) is re-parented to the agent, a child subreaper, which watches and reaps it exactly as
if it had started it. Before running, the executor becomes what ``exec`` would have made it: its
own session, its sandbox as cwd, stdio on the given descriptors, and the agent's environment for
it, both in ``os.environ`` and in ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``: the agent
finds its executors after a restart, and kills what they leave behind, by the ``AGORA_SANDBOX``
they were started with. Those two regions are rewritten in place (the zygote was started with
room to spare in both), the way ``setproctitle`` retitles a process.

The zygote declines (the agent then starts the executor the ordinary way) whatever a fork cannot
honour: a different user, interpreter settings (``PYTHON*``, ``LD_*``) other than its own, an
environment larger than its room. It dies with the agent (PR_SET_PDEATHSIG); its executors do not.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
from agora.agent.containers.helper_process import MAX_REQUEST, start_helper, stop_helper

__all__ = [
    "ENTRY",
    "ROOM",
    "Declined",
    "ExecutorZygote",
    "environ_blob",
    "fork_compatible",
    "main",
    "proc_regions",
]

#: The function a forked executor runs: the built-in executor's ``main``.
ENTRY: Final = "agora.agent.executors.command:main"
#: The argv an executor started by exec has, and the one its /proc/<pid>/cmdline shows.
_EXECUTOR_ARGV: Final = ("-m", "agora.agent.executors.command")
#: Bytes of room the zygote keeps in its environment and argv regions for an executor's.
ROOM: Final = 256 * 1024
_PAD_VAR: Final = "AGORA_ZYGOTE_ROOM"
_PAD_PIECE: Final = 64 * 1024
_FD_VAR: Final = "AGORA_ZYGOTE_FD"
_ENTRY_VAR: Final = "AGORA_ZYGOTE_ENTRY"
#: Variables that shape the interpreter at its start: a fork cannot take new values of these.
_INTERPRETER_PREFIXES: Final = ("PYTHON", "LD_", "MALLOC_", "GLIBC_")
#: A fork takes milliseconds; the zygote's first reply waits for its imports. The agent's loop
#: waits on it, so a zygote slower than this is killed and that executor started by exec.
SPAWN_TIMEOUT: Final = 5.0


class Declined(Exception):
    """The zygote cannot start this executor; start it the ordinary way. ``str()`` says why."""


class _Request(msgspec.Struct, frozen=True):
    env: dict[str, str]
    sandbox: str
    argv0: str


# ---- pure helpers ------------------------------------------------------------------------------


def environ_blob(env: Mapping[str, str]) -> bytes:
    """``env`` as the kernel lays out an environment: ``KEY=value`` entries, each NUL-ended."""
    return b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())


def fork_compatible(ours: Mapping[str, str], theirs: Mapping[str, str]) -> str | None:
    """None when a process forked with environment ``ours`` can run as one started with
    ``theirs``; else the first variable that differs and that the interpreter reads at start."""
    for key in sorted(set(ours) | set(theirs)):
        if key.startswith(_INTERPRETER_PREFIXES) and ours.get(key) != theirs.get(key):
            return key
    return None


def proc_regions(stat: str) -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end) from the text of ``/proc/<pid>/stat``."""
    # Fields after the command name (which may hold spaces and parentheses) start at field 3;
    # arg_start..env_end are fields 48..51 (proc(5)).
    rest = stat[stat.rindex(")") + 2 :].split()
    arg_start, arg_end, env_start, env_end = (int(v) for v in rest[45:49])
    return arg_start, arg_end, env_start, env_end


# ---- the agent's side --------------------------------------------------------------------------


class ExecutorZygote:
    """Started once by the agent (which must be a child subreaper); :meth:`spawn` is an executor
    starter. Thread-safe; restarts a dead zygote on the next spawn."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        python: str = sys.executable,
        entry: str = ENTRY,
        timeout: float = SPAWN_TIMEOUT,
    ) -> None:
        self._env = dict(env)
        self._python = python
        self._entry = entry
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the zygote now (it imports in the background; the first spawn waits for it)."""
        with self._lock:
            if self._sock is None:
                self._start()

    def _start(self) -> socket.socket:
        env = {
            **self._env,
            _ENTRY_VAR: self._entry,
            # Room in pieces: the kernel refuses any one string over 128 KiB (MAX_ARG_STRLEN).
            **{f"{_PAD_VAR}_{i}": "x" * _PAD_PIECE for i in range(ROOM // _PAD_PIECE)},
        }
        # The last argument is room for the executor's command line.
        argv = [self._python, "-m", __name__, " " * 256]
        self._sock, self._proc = start_helper(argv, env, _FD_VAR, self._timeout)
        return self._sock

    def spawn(
        self,
        argv: list[str],
        env: Mapping[str, str],
        sandbox: str,
        stdin: int,
        stdout: int,
        stderr: int,
        account: object | None,
    ) -> int:
        """The pid of a new executor (re-parented to the caller); Declined when the zygote
        cannot start it, OSError when the zygote failed (it is restarted on the next call)."""
        if account is not None:
            raise Declined("the executor runs as another user")
        if list(argv[1:]) != list(_EXECUTOR_ARGV):
            raise Declined("not the built-in executor")
        differs = fork_compatible(self._env, env)
        if differs is not None:
            raise Declined(f"{differs} differs from the agent's")
        if len(environ_blob(env)) > ROOM:
            raise Declined("the environment is larger than the zygote's room")
        request = msgspec.msgpack.encode(_Request(env=dict(env), sandbox=sandbox, argv0=argv[0]))
        with self._lock:
            sock = self._sock or self._start()
            try:
                socket.send_fds(sock, [request], [stdin, stdout, stderr])
                reply = sock.recv(65536)
            except OSError:
                self._close(kill=True)
                raise
            if not reply:
                self._close(kill=True)
                raise OSError("the executor zygote exited")
        kind, _, text = reply.partition(b":")
        if kind == b"P":
            return int(text)
        raise Declined(text.decode(errors="replace"))

    def close(self) -> None:
        with self._lock:
            self._close(kill=False)

    def _close(self, *, kill: bool) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            stop_helper(self._proc, kill=kill)
            self._proc = None


# ---- the zygote's side ---------------------------------------------------------------------


def _rewrite(start: int, end: int, content: bytes) -> None:
    """Overwrite our own memory ``start..end`` with ``content``, NUL-padded."""
    ctypes.memmove(start, content.ljust(end - start, b"\0"), end - start)


def _become_executor(
    request: _Request, fds: Sequence[int], regions: tuple[int, ...], ready: int
) -> None:
    """In the grandchild: turn into the executor ``exec`` would have started, write its pid to
    ``ready`` once it is one (the agent is answered then), run it. Never returns."""
    code = 127
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(request.sandbox)
        arg_start, arg_end, env_start, env_end = regions
        argv = (request.argv0, *_EXECUTOR_ARGV)
        # libc's environ points into the region about to be rewritten: empty it first.
        os.environ.clear()
        _rewrite(env_start, env_end, environ_blob(request.env))
        _rewrite(arg_start, arg_end, b"".join(os.fsencode(a) + b"\0" for a in argv))
        os.environ.update(request.env)
        os.write(ready, b"%d" % os.getpid())
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        _prefork_container_server()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        module, _, function = _ENTRY.partition(":")
        sys.argv = [getattr(sys.modules[module], "__file__", None) or module]
        entry = getattr(sys.modules[module], function)
        try:
            entry()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # what the interpreter would print, and its status
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    except BaseException as exc:  # a setup step failed: the executor never ran
        with contextlib.suppress(OSError):
            os.write(2, f"executor (forked by the agent's zygote) failed: {exc!r}\n".encode())
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _prefork_container_server() -> None:
    """An executor that will contain its tasks gets its container fork server now, forked while
    it is still the zygote's small single-threaded image, instead of by exec at its first launch."""
    from agora.agent.containers import forkserver
    from agora.agent.containers.isolation import ContainerConfig

    try:
        isolated = ContainerConfig.from_environ().isolated
    except ValueError:
        return  # the executor reports a malformed config itself
    if isolated:
        forkserver.prefork()


def _launch(request: _Request, fds: Sequence[int], regions: tuple[int, ...]) -> int:
    """Fork the executor as a grandchild (re-parented to the agent); its pid."""
    if len(environ_blob(request.env)) > regions[3] - regions[2]:
        raise Declined("the environment is larger than the zygote's room")
    if len(request.argv0) + 64 > regions[1] - regions[0]:
        raise Declined("the command line is larger than the zygote's room")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the middle process: fork the executor and exit, leaving it to the agent
        try:
            os.close(read_end)
            if os.fork() == 0:
                _become_executor(request, fds, regions, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        # Its pid once it is set up (its /proc environ says AGORA_SANDBOX), or nothing if
        # setting up failed (it then exits 127, saying why on its stderr).
        pid = os.read(read_end, 32)
    finally:
        os.close(read_end)
        # Reaped before the reply: by then the executor is re-parented to the agent.
        os.waitpid(child, 0)
    if not pid:
        raise OSError("the forked executor failed to set up (see its stderr)")
    return int(pid)


def _serve(sock: socket.socket, regions: tuple[int, ...]) -> None:
    decoder = msgspec.msgpack.Decoder(_Request)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 3)
        except OSError:
            return
        if not data:
            return
        try:
            if len(fds) != 3:
                raise Declined("a request without its stdio")
            reply = b"P:%d" % _launch(decoder.decode(data), fds, regions)
        except Declined as exc:
            reply = b"D:" + str(exc).encode(errors="replace")
        except Exception as exc:  # never die on one request
            reply = b"D:" + f"zygote: {exc!r}".encode(errors="replace")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            sock.send(reply)
        except OSError:
            return


_ENTRY = ENTRY


def main() -> None:
    """``python -m agora.agent.server.zygote`` (started by :class:`ExecutorZygote`)."""
    global _ENTRY
    from agora.agent.containers._mounts import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's Ctrl-C is the agent's
    with open("/proc/self/stat", encoding="ascii") as f:
        regions = proc_regions(f.read())
    fd = int(os.environ.pop(_FD_VAR))
    _ENTRY = os.environ.pop(_ENTRY_VAR, ENTRY)
    for key in [k for k in os.environ if k.startswith(_PAD_VAR)]:
        del os.environ[key]
    __import__(_ENTRY.partition(":")[0])  # the point of it all: import once, fork many
    sock = socket.socket(fileno=fd)
    try:
        _serve(sock, regions)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
