"""Start one process in a container: cgroups, namespaces, a root filesystem, a user, the command.

``spawn(spec)`` forks; the child joins the cgroups, unshares the namespaces, sets up its mounts,
hostname and loopback, drops to the task's user and execs the command. With a pid namespace the
child forks a tiny init (pid 1 inside, see ``_init``) which sets up the container, becomes the
task's user and posix_spawns the command (pid 2); the launcher's first child exits at once so the
init is re-parented to the caller, who must be a child subreaper (``become_subreaper``). The
caller may be an asyncio process with ZeroMQ threads: the children only make syscalls, exec or
``os._exit`` — no logging, no event loop. Only the first fork is ``os.fork``; the init is forked
with libc's fork (the first child is single-threaded; Python's at-fork work would cost more than
the fork), and the command is started by posix_spawn (vfork) — about 5 ms a container in all.

Without a root filesystem the sandbox is the working directory, entered through an fd opened
before /tmp is replaced (a sandbox under /tmp stays reachable as ``.``, not by its path).

Children report through an O_CLOEXEC pipe, NUL-terminated records: ``P<pid>`` (the init's pid),
``W<text>`` (a warning for the caller to log), ``E<text>`` (why the launch failed). The caller
reads to EOF, which means every child that holds the pipe has exec'd or exited.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import pwd
import signal
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NoReturn

from agora.agent.containers import _mounts
from agora.agent.containers._init import (
    block_init_signals,
    find_program,
    restore_signals,
    run_init,
    spawn_task,
)

NAMESPACES: Final = frozenset({"pid", "mount", "uts", "ipc", "net"})
_CLONE_FLAGS: Final = {
    "pid": _mounts.CLONE_NEWPID,
    "mount": _mounts.CLONE_NEWNS,
    "uts": _mounts.CLONE_NEWUTS,
    "ipc": _mounts.CLONE_NEWIPC,
    "net": _mounts.CLONE_NEWNET,
}
SANDBOX_IN_ROOTFS: Final = "/mnt/sandbox"
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1
_IFREQ: Final = struct.Struct("16sh22x")
_MAX_FD: Final = 2**31 - 1


class LaunchError(Exception):
    """The container could not be started; ``str()`` says why."""


@dataclass(frozen=True, slots=True)
class Bind:
    """A volume: ``host_path`` seen at ``container_path`` (relative: inside the sandbox)."""

    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What to run and how to isolate it. Invalid values raise ``LaunchError``.

    ``"pid"`` in ``namespaces`` implies ``"mount"`` (a fresh /proc); ``rootfs`` and ``volumes``
    need ``"mount"``, ``hostname`` needs ``"uts"``.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    sandbox: str
    stdin: int
    stdout: int
    stderr: int
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()
    cgroup_procs: tuple[str, ...] = ()
    namespaces: frozenset[str] = field(default_factory=frozenset)
    hostname: str | None = None
    rootfs: str | None = None
    volumes: tuple[Bind, ...] = ()
    #: Join this network namespace (``/proc/<pid>/ns/net`` of another container) instead of
    #: creating one: the members of a task group share one network.
    network_of: str | None = None
    #: Host paths that stay visible (read-only) though a private /tmp would hide them.
    keep_visible: tuple[str, ...] = ()
    #: The directory of the agent's executor socket (a custom executor's container): kept
    #: visible like ``keep_visible``, bound read-only at AGENT_DIR_IN_ROOTFS in a rootfs.
    agent_dir: str | None = None
    #: Without a root filesystem: paths under /tmp that stay reachable, read-write, in a private
    #: /tmp (the task's persistent volumes when the agent's work dir is under /tmp).
    keep_writable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        namespaces = frozenset(self.namespaces)
        if "pid" in namespaces:
            namespaces |= {"mount"}
        object.__setattr__(self, "namespaces", namespaces)
        _validate(self)

    @property
    def cwd(self) -> str:
        """The command's working directory as the container sees it."""
        return SANDBOX_IN_ROOTFS if self.rootfs is not None else self.sandbox


def _bad(why: str) -> LaunchError:
    return LaunchError(f"invalid container spec: {why}")


def _validate(spec: ContainerSpec) -> None:
    if not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
        raise _bad("argv must be a non-empty tuple of strings without NUL")
    if not spec.argv[0]:
        raise _bad("argv[0] is empty")
    for key, value in spec.env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise _bad(f"bad environment variable {key!r}")
    if not os.path.isabs(spec.sandbox):
        raise _bad(f"sandbox must be an absolute path, not {spec.sandbox!r}")
    for name in ("stdin", "stdout", "stderr"):
        if getattr(spec, name) < 0:
            raise _bad(f"{name} must be a file descriptor")
    ids = [i for i in (spec.uid, spec.gid) if i is not None] + list(spec.groups)
    if any(i < 0 for i in ids):
        raise _bad("uid, gid and groups must not be negative")
    if unknown := spec.namespaces - NAMESPACES:
        raise _bad(f"unknown namespaces {sorted(unknown)}; known: {sorted(NAMESPACES)}")
    if spec.hostname is not None and "uts" not in spec.namespaces:
        raise _bad("a hostname needs the uts namespace")
    if spec.hostname is not None and not 0 < len(spec.hostname.encode()) <= 64:
        raise _bad(f"hostname {spec.hostname!r} must be 1 to 64 bytes")
    if (spec.rootfs is not None or spec.volumes) and "mount" not in spec.namespaces:
        raise _bad("a rootfs or volumes need the mount namespace")
    if spec.rootfs is not None and not os.path.isabs(spec.rootfs):
        raise _bad(f"rootfs must be an absolute path, not {spec.rootfs!r}")
    if not all(os.path.isabs(p) for p in spec.cgroup_procs):
        raise _bad("cgroup_procs must be absolute paths")
    for volume in spec.volumes:
        if not os.path.isabs(volume.host_path):
            raise _bad(f"volume host path {volume.host_path!r} must be absolute")
        inner = volume.container_path
        if not inner or ".." in inner.split("/") or os.path.normpath(inner) in ("/", "."):
            raise _bad(f"volume container path {inner!r} must name a path below / or the sandbox")
        if os.path.isabs(inner) and spec.rootfs is None:
            raise _bad(f"absolute volume container path {inner!r} needs a rootfs")


def become_subreaper(enable: bool = True) -> bool:
    """Make this process adopt its orphaned descendants (needed to spawn with ``"pid"``).

    A subreaper must reap what it adopts. ``enable=False`` undoes it. False if the kernel refused.
    """
    return _mounts.set_child_subreaper(enable)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the child needs, computed before the fork."""

    flags: int
    gid: int | None
    volumes: tuple[tuple[str, str, bool], ...]
    #: An open descriptor of the network namespace to join (-1: none); closed after the fork.
    netns: int = -1
    #: The command's process is forked off the first child, which exits at once: it is adopted
    #: by a subreaper further up (the fork server's parent), as a pid namespace's init is.
    detach: bool = False


def _plan(spec: ContainerSpec, adopted_above: bool = False) -> _Plan:
    if not os.path.isdir(spec.sandbox):
        raise LaunchError(f"sandbox {spec.sandbox} is not a directory")
    if spec.rootfs is not None and not os.path.isdir(spec.rootfs):
        raise LaunchError(f"rootfs {spec.rootfs} is not a directory")
    for name in ("stdin", "stdout", "stderr"):
        try:
            os.fstat(getattr(spec, name))
        except OSError as exc:
            raise LaunchError(f"{name} fd {getattr(spec, name)}: {exc.strerror}") from None
    if "pid" in spec.namespaces and not adopted_above and not _mounts.is_child_subreaper():
        raise LaunchError("a pid namespace needs the launcher to be a child subreaper")
    gid = spec.gid
    if spec.uid is not None and gid is None:
        try:
            gid = pwd.getpwuid(spec.uid).pw_gid
        except KeyError:
            raise LaunchError(f"uid {spec.uid} has no passwd entry: give a gid") from None
    volumes = []
    for volume in spec.volumes:
        if not os.path.exists(volume.host_path):
            raise LaunchError(f"volume {volume.host_path} does not exist")
        inner = volume.container_path
        if spec.rootfs is not None and not os.path.isabs(inner):
            inner = os.path.join(SANDBOX_IN_ROOTFS, inner)
        volumes.append((volume.host_path, inner, volume.read_only))
    flags = 0
    for name in spec.namespaces:
        flags |= _CLONE_FLAGS[name]
    netns = -1
    if spec.network_of is not None:
        if "net" in spec.namespaces:
            raise _bad("network_of and a net namespace of its own exclude each other")
        try:
            netns = os.open(spec.network_of, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LaunchError(f"network namespace {spec.network_of}: {exc.strerror}") from None
    return _Plan(flags=flags, gid=gid, volumes=tuple(volumes), netns=netns, detach=adopted_above)


def spawn(spec: ContainerSpec, *, adopted_above: bool = False) -> int:
    """Start the container; return the pid to watch once the command was exec'd.

    ``adopted_above``: with a pid namespace, the init is adopted by a subreaper further up than
    the caller (the fork server's parent, the executor), so the caller need not be one.

    Its exit status is the task's: the command's exit code, or 128+N when the command was killed
    by signal N inside a pid namespace. Raises ``LaunchError`` with the child's error text.
    """
    pending = start(spec, adopted_above=adopted_above)
    try:
        report = _read_all(pending.report)
    finally:
        os.close(pending.report)
    return pending.finish(report)


@dataclass(frozen=True, slots=True)
class Pending:
    """A container whose children are still setting it up: read ``report`` (a non-blocking
    caller may poll it) to EOF, close it, then :meth:`finish` with what was read."""

    spec: ContainerSpec
    first: int
    report: int
    detach: bool

    def finish(self, report: bytes) -> int:
        """The pid to watch, or LaunchError (the children are reaped or killed then)."""
        spec, first = self.spec, self.first
        records = [r for r in report.split(b"\0") if r]
        errors = [r[1:].decode(errors="replace") for r in records if r[:1] == b"E"]
        for warning in (r[1:].decode(errors="replace") for r in records if r[:1] == b"W"):
            _warn(warning, spec.argv[0])
        if "pid" not in spec.namespaces and not self.detach:
            if errors:
                _reap(first)
                raise LaunchError(errors[0])
            return first
        status = _reap(first)
        inits = [int(r[1:]) for r in records if r[:1] == b"P"]
        if not inits:
            raise LaunchError(errors[0] if errors else f"container launch failed: status {status}")
        if errors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(inits[0], signal.SIGKILL)
            _reap(inits[0])
            raise LaunchError(errors[0])
        return inits[0]


def start(spec: ContainerSpec, *, adopted_above: bool = False) -> Pending:
    """The first half of :func:`spawn`: fork the container's first child and return without
    waiting for its setup, so that one process can set up several containers at once."""
    plan = _plan(spec, adopted_above)
    try:
        read_end, write_end = os.pipe()  # both O_CLOEXEC
        try:
            first = os.fork()
            if first == 0:  # pragma: no cover - runs in the child
                try:
                    _child(spec, plan, write_end)
                finally:
                    os._exit(127)
        except BaseException:
            os.close(read_end)
            os.close(write_end)
            raise
    finally:
        if plan.netns >= 0:
            os.close(plan.netns)
    os.close(write_end)
    return Pending(spec, first, read_end, plan.detach)


def _warn(warning: str, argv0: str) -> None:
    # structlog costs the fork server 15 MB of memory to import, and every fork copies it.
    import structlog

    structlog.get_logger(__name__).warning("container_launch_warning", warning=warning, argv0=argv0)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _reap(pid: int) -> int | None:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


class _Step:
    """Where the child is, for its error text."""

    name = "start"


def _child(spec: ContainerSpec, plan: _Plan, report: int) -> None:
    """The forked child (and, with a pid namespace, its init and the command's process)."""
    gc.disable()  # a collection would touch (copy) every page of the caller's heap
    step = _Step()
    try:
        step.name = "join cgroup"
        for path in spec.cgroup_procs:
            step.name = f"join cgroup {path}"
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if plan.netns >= 0:
            step.name = "join the network namespace"
            _mounts.join_network(plan.netns)
        step.name = "set up stdio"
        report = _take_fds(spec, report)
        os.setsid()
        step.name = "unshare namespaces"
        if "pid" not in spec.namespaces:
            if plan.flags:
                _mounts.unshare(plan.flags)
            if plan.detach:
                step.name = "fork the command's process"
                command = _mounts.fork_single_threaded()
                if command != 0:
                    os.write(report, b"P%d\0" % command)
                    os._exit(0)
                os.setsid()
            cwd = _setup(spec, plan, report, step)
            _exec(spec, plan, step, cwd)
        block_init_signals()
        _mounts.unshare(plan.flags)
        step.name = "fork the init"
        init = _mounts.fork_single_threaded()
        if init != 0:
            os.write(report, b"P%d\0" % init)
            os._exit(0)
        os.setsid()
        cwd = _setup(spec, plan, report, step)
        # The init itself becomes the task's user in the task's directory, so the command can be
        # started by posix_spawn (a vfork: no copy of this process's page tables).
        _become_task(spec, plan, step, cwd)
        step.name = f"execute {spec.argv[0]!r}"
        task = spawn_task(find_program(spec.argv[0], spec.env), spec.argv, spec.env)
        os.close(report)
        run_init(task)
    except BaseException as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        if isinstance(exc, OSError) and exc.filename is not None:
            detail = f"{detail}: {exc.filename}"
        text = f"{step.name}: {detail}"
        os.write(report, b"E" + text.encode(errors="replace").replace(b"\0", b"") + b"\0")


def _take_fds(spec: ContainerSpec, report: int) -> int:
    """Put the task's stdio on 0, 1, 2 and close every other fd but the report pipe."""
    report = fcntl.fcntl(report, fcntl.F_DUPFD_CLOEXEC, 3)
    copies = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in (spec.stdin, spec.stdout, spec.stderr)]
    for target, fd in enumerate(copies):
        os.dup2(fd, target)
    os.closerange(3, report)
    os.closerange(report + 1, _MAX_FD)
    return report


def _setup(spec: ContainerSpec, plan: _Plan, report: int, step: _Step) -> int | None:
    """Mounts, hostname and loopback, in the new namespaces (inside the pid namespace if any).

    Returns an O_PATH fd of the sandbox when a mount may hide its path (a sandbox under /tmp).
    """
    cwd = None
    if "mount" in spec.namespaces:
        step.name = "make / private"
        _mounts.make_private()
        if spec.rootfs is not None:
            step.name = f"enter rootfs {spec.rootfs}"
            writable = _mounts.enter_rootfs(
                spec.rootfs,
                spec.sandbox,
                plan.volumes,
                "pid" in spec.namespaces,
                spec.uid,
                plan.gid,
                spec.agent_dir,
            )
            if not writable:
                warning = f"overlayfs refused: rootfs {spec.rootfs} is mounted read-only"
                os.write(report, b"W" + warning.encode(errors="replace") + b"\0")
        else:
            step.name = "open the sandbox"
            cwd = os.open(spec.sandbox, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            step.name = "mount volumes"
            _mounts.mount_volumes(spec.sandbox, plan.volumes, spec.uid, plan.gid)
            step.name = "mount private /tmp"
            keep = spec.keep_visible + ((spec.agent_dir,) if spec.agent_dir else ())
            _mounts.private_tmp(spec.sandbox, spec.uid, plan.gid, keep, spec.keep_writable)
            if "pid" in spec.namespaces:
                step.name = "mount /proc"
                _mounts.fresh_proc("/proc")
    if spec.hostname is not None:
        step.name = "set hostname"
        _mounts.sethostname(spec.hostname)
    if "net" in spec.namespaces:
        step.name = "bring up lo"
        _loopback_up()
    return cwd


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0))
        flags = _IFREQ.unpack(current)[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))


def _become_task(spec: ContainerSpec, plan: _Plan, step: _Step, cwd: int | None) -> None:
    """Drop to the task's user and group, then enter its working directory."""
    if spec.uid is not None or plan.gid is not None:
        step.name = "drop privileges"
        os.setgroups(list(spec.groups))
        if plan.gid is not None:
            os.setgid(plan.gid)
        if spec.uid is not None:
            os.setuid(spec.uid)
    step.name = f"change directory to {spec.cwd}"
    if cwd is None:
        os.chdir(spec.cwd)
    else:
        os.fchdir(cwd)
        os.close(cwd)


def _exec(spec: ContainerSpec, plan: _Plan, step: _Step, cwd: int | None) -> NoReturn:
    _become_task(spec, plan, step, cwd)
    restore_signals()
    step.name = f"execute {spec.argv[0]!r}"
    try:
        os.execvpe(spec.argv[0], list(spec.argv), dict(spec.env))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror) from None
