"""Syscalls through libc (resolved once, at import) and the mount namespace a container sees.

Everything here after the libc set-up runs in a forked child of the launcher: plain syscalls and
small Python, no logging. Failures raise ``OSError`` whose text names the step.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Final

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUTS: Final = 0x04000000
CLONE_NEWIPC: Final = 0x08000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_NOEXEC: Final = 8
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
MNT_DETACH: Final = 2

PR_SET_CHILD_SUBREAPER: Final = 36
PR_GET_CHILD_SUBREAPER: Final = 37

_SYS_PIVOT_ROOT: Final = {"x86_64": 155, "aarch64": 217, "riscv64": 41, "ppc64le": 203}.get(
    platform.machine()
)

_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_unshare.restype = ctypes.c_int
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong]
_mount.argtypes += [ctypes.c_char_p]
_mount.restype = ctypes.c_int
_umount2 = _libc.umount2
_umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_umount2.restype = ctypes.c_int
_setns = _libc.setns
_setns.argtypes = [ctypes.c_int, ctypes.c_int]
_setns.restype = ctypes.c_int
_sethostname = _libc.sethostname
_sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_sethostname.restype = ctypes.c_int
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
PR_SET_PDEATHSIG: Final = 1
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
# libc's fork without Python's at-fork work, and without releasing the GIL (PyDLL): for forks in
# a child that is single-threaded already, where that work costs more than the fork itself.
_fork = ctypes.PyDLL(None, use_errno=True).fork
_fork.argtypes = []
_fork.restype = ctypes.c_int

#: Where a root filesystem shows the agent's executor socket directory (on its private /tmp).
AGENT_DIR_IN_ROOTFS: Final = "/tmp/.agora-agent"
# Host device nodes bind-mounted into a root filesystem's /dev.
DEVICES: Final = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS: Final = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_unshare(flags), "unshare")


def join_network(fd: int) -> None:
    """Enter the network namespace ``fd`` refers to (another container's: a task group's)."""
    _check(_setns(fd, CLONE_NEWNET), "join the group's network namespace")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    src = source.encode() if source is not None else None
    kind = fstype.encode() if fstype is not None else None
    opts = data.encode() if data else None
    what = f"mount {source or fstype or ''} on {target}"
    _check(_mount(src, target.encode(), kind, flags, opts), what)


def umount2(target: str, flags: int) -> None:
    _check(_umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    if _SYS_PIVOT_ROOT is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall on {platform.machine()}")
    result = _syscall(ctypes.c_long(_SYS_PIVOT_ROOT), new_root.encode(), put_old.encode())
    _check(result, "pivot_root")


def fork_single_threaded() -> int:
    """``fork()`` for a process with one thread; the child is a plain copy (Python state too)."""
    pid = int(_fork())
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fork: {os.strerror(err)}")
    return pid


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_sethostname(raw, len(raw)), f"sethostname {name}")


def set_child_subreaper(enable: bool) -> bool:
    flag = ctypes.c_ulong(1 if enable else 0)
    return int(_prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), flag)) == 0


def die_with_parent() -> bool:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    return int(_prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(9))) == 0


def is_child_subreaper() -> bool:
    flag = ctypes.c_int(0)
    ok = _prctl(ctypes.c_int(PR_GET_CHILD_SUBREAPER), ctypes.byref(flag)) == 0
    return ok and flag.value != 0


def resolve_in_root(root: str, path: str) -> str:
    """The host path of ``path`` inside ``root``, following symlinks as if ``root`` were ``/``.

    An image's symlinks must not lead a mount outside its root. A missing tail is kept as is.
    """
    parts = [p for p in path.split("/") if p and p != "."]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(root, *done, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a symlink, or missing
            done.append(part)
            continue
        hops += 1
        if hops > 40:
            raise OSError(errno.ELOOP, f"resolve {path} in {root}: too many symlinks")
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p and p != "."] + parts
    return os.path.join(root, *done)


def _make_mount_point(target: str, like: str, uid: int | None, gid: int | None) -> None:
    """Create ``target`` (a directory, or an empty file when ``like`` is not a directory)."""
    if os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(like):
        os.mkdir(target)
    else:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    if uid is not None:
        os.chown(target, uid, -1 if gid is None else gid)


def bind(source: str, target: str, read_only: bool, recursive: bool = True) -> None:
    flags = MS_BIND | (MS_REC if recursive else 0)
    mount(source, target, None, flags)
    if read_only:
        mount(None, target, None, flags | MS_REMOUNT | MS_RDONLY)


def mount_volumes(
    root: str, volumes: tuple[tuple[str, str, bool], ...], uid: int | None, gid: int | None
) -> None:
    """Bind each (host path, path under root, read only); symlinks resolved inside ``root``."""
    for host_path, inner, read_only in volumes:
        target = resolve_in_root(root, inner)
        _make_mount_point(target, host_path, uid, gid)
        bind(host_path, target, read_only)


def make_private() -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def private_tmp(
    sandbox: str,
    uid: int | None,
    gid: int | None,
    keep: tuple[str, ...] = (),
    writable: tuple[str, ...] = (),
) -> None:
    """Without a root filesystem: ``<sandbox>/tmp`` is the container's /tmp.

    What lies under the host's /tmp and must stay reachable at its own path is bind-mounted
    back onto that path inside the new /tmp: the sandbox itself and ``writable`` (read-write:
    the task's persistent volumes) and ``keep`` (read-only: the agent's own runtime, so that
    SDK executors run). The directories that takes are created in ``<sandbox>/tmp``, empty on
    the host."""
    tmp = os.path.join(sandbox, "tmp")
    if not os.path.isdir(tmp):
        os.mkdir(tmp, 0o1777)
        os.chmod(tmp, 0o1777)
        if uid is not None:
            os.chown(tmp, uid, -1 if gid is None else gid)
    # Read-only views first, the sandbox last: on top, should it lie inside one of them.
    wanted = [(path, True) for path in keep] + [(p, False) for p in writable] + [(sandbox, False)]
    under = [(p, ro) for p, ro in wanted if _under_tmp(p) and os.path.exists(p)]
    held = [(os.open(p, os.O_PATH | os.O_CLOEXEC), p, ro) for p, ro in under]
    try:
        bind(tmp, "/tmp", read_only=False, recursive=False)
        for fd, path, read_only in held:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            bind(f"/proc/self/fd/{fd}", path, read_only=read_only, recursive=read_only)
    finally:
        for fd, _, _ in held:
            os.close(fd)


def _under_tmp(path: str) -> bool:
    inside = os.path.relpath(path, "/tmp")
    return not (inside.startswith(os.pardir) or inside == os.curdir)


def fresh_proc(target: str) -> None:
    mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _overlay(image: str, base: str, merged: str) -> bool:
    if any(c in image for c in ",:\\"):
        return False
    upper, work = os.path.join(base, "upper"), os.path.join(base, "work")
    os.mkdir(upper, 0o755)
    os.mkdir(work, 0o700)
    try:
        mount("overlay", merged, "overlay", 0, f"lowerdir={image},upperdir={upper},workdir={work}")
    except OSError:
        return False
    return True


def _dev(merged: str) -> None:
    dev = resolve_in_root(merged, "/dev")
    _make_mount_point(dev, "/", None, None)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name in DEVICES:
        host = f"/dev/{name}"
        if not os.path.exists(host):
            continue
        inner = os.path.join(dev, name)
        os.close(os.open(inner, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
        bind(host, inner, read_only=False, recursive=False)
    for name, target in _DEV_LINKS:
        os.symlink(target, os.path.join(dev, name))
    shm = os.path.join(dev, "shm")
    os.mkdir(shm)
    mount("tmpfs", shm, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def enter_rootfs(
    image: str,
    sandbox: str,
    volumes: tuple[tuple[str, str, bool], ...],
    fresh_pid_ns: bool,
    uid: int | None,
    gid: int | None,
    agent_dir: str | None = None,
) -> bool:
    """Build the container's root under ``<sandbox>/.rootfs`` and pivot into it.

    Writes go to an overlay on a tmpfs, never to ``image``; returns False when overlayfs was
    refused and the image is bind-mounted read-only instead. The sandbox is /mnt/sandbox;
    ``agent_dir`` (the agent's executor socket directory) is AGENT_DIR_IN_ROOTFS, read-only.
    """
    base = os.path.join(sandbox, ".rootfs")
    if not os.path.isdir(base):
        os.mkdir(base, 0o700)
    mount("tmpfs", base, "tmpfs", 0, "mode=755")
    merged = os.path.join(base, "merged")
    os.mkdir(merged, 0o755)
    writable = _overlay(image, base, merged)
    if not writable:
        bind(image, merged, read_only=True)
    inside = resolve_in_root(merged, "/mnt/sandbox")
    _make_mount_point(inside, sandbox, None, None)
    bind(sandbox, inside, read_only=False, recursive=False)
    proc = resolve_in_root(merged, "/proc")
    _make_mount_point(proc, "/", None, None)
    if fresh_pid_ns:
        fresh_proc(proc)
    else:
        bind("/proc", proc, read_only=False)
    _dev(merged)
    tmp = resolve_in_root(merged, "/tmp")
    _make_mount_point(tmp, "/", None, None)
    mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    # After the fresh /tmp: a volume there (an agent's work dir under /tmp) is not hidden.
    mount_volumes(merged, volumes, uid, gid)
    if agent_dir is not None:
        # On the fresh /tmp: a mount point there can be made even in a read-only image. The
        # directory, not the socket file: a restarted agent's new socket shows through.
        inner = resolve_in_root(merged, AGENT_DIR_IN_ROOTFS)
        _make_mount_point(inner, agent_dir, None, None)
        bind(agent_dir, inner, read_only=True, recursive=False)
    # pivot_root(".", "."): the old root is stacked on the new one, then detached.
    os.chdir(merged)
    pivot_root(".", ".")
    umount2(".", MNT_DETACH)
    os.chdir("/")
    return writable
