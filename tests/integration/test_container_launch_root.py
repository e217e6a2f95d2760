"""Container launcher with namespaces, a root filesystem, a user and a cgroup (needs root)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.launch import (
    Bind,
    ContainerSpec,
    LaunchError,
    become_subreaper,
    spawn,
)
from support.busybox import busybox_rootfs
from support.polling import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: namespaces and mounts")

PATH = {"PATH": "/usr/bin:/bin"}


def children() -> set[int]:
    """This process's live and zombie children."""
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        text = Path(f"/proc/self/task/{tid}/children").read_text()
        found.update(int(pid) for pid in text.split())
    return found


@pytest.fixture(autouse=True)
def subreaper() -> Iterator[None]:
    """Spawning with a pid namespace needs a subreaper; nothing may be left behind."""
    before = children()
    assert become_subreaper()
    yield
    become_subreaper(enable=False)
    left = children() - before
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert not left, "a container process was left behind"


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


class Output:
    def __init__(self, root: Path) -> None:
        self.path = root / "output"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def text(self) -> str:
        return self.path.read_text()


@pytest.fixture
def output(tmp_path: Path) -> Iterator[Output]:
    out = Output(tmp_path)
    yield out
    os.close(out.fd)
    os.close(out.null)


def run_spec(out: Output, sandbox: Path, script: str, **options: object) -> ContainerSpec:
    return ContainerSpec(
        argv=("sh", "-c", script),
        env=options.pop("env", PATH),  # type: ignore[arg-type]
        sandbox=str(sandbox),
        stdin=out.null,
        stdout=out.fd,
        stderr=out.fd,
        **options,  # type: ignore[arg-type]
    )


def wait_exit(pid: int, timeout: float = 10.0) -> int:
    def done() -> int | None:
        got, status = os.waitpid(pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) + 1000 if got == pid else None

    return wait_for(done, timeout=timeout, what=f"pid {pid} to exit") - 1000


def run(out: Output, sandbox: Path, script: str, **options: object) -> tuple[int, str]:
    pid = spawn(run_spec(out, sandbox, script, **options))
    code = wait_exit(pid)
    return code, out.text()


def ns(*names: str) -> frozenset[str]:
    return frozenset(names)


def test_pid_namespace_shows_only_the_task(output: Output, sandbox: Path) -> None:
    script = 'echo "me=$$"; for p in /proc/[0-9]*; do echo "${p#/proc/}"; done'
    code, text = run(output, sandbox, script, namespaces=ns("pid"))
    assert code == 0
    lines = text.split()
    assert lines[0] == "me=2"
    assert sorted(lines[1:]) == ["1", "2"]


def test_sigterm_to_the_returned_pid_reaches_the_command(output: Output, sandbox: Path) -> None:
    # "ready" once the sleep runs: one started after the SIGTERM would not have got it, and the
    # init waits for every process of a container it passed a SIGTERM to.
    script = 'trap "echo got-term; exit 42" TERM; sleep 30 & echo ready; wait'
    pid = spawn(run_spec(output, sandbox, script, namespaces=ns("pid")))
    wait_for(lambda: "ready" in output.text(), timeout=10, what="the task to start")
    os.kill(pid, signal.SIGTERM)
    assert wait_exit(pid) == 42
    assert "got-term" in output.text()


def test_killed_command_exits_128_plus_signal(output: Output, sandbox: Path) -> None:
    code, _ = run(output, sandbox, "kill -KILL $$", namespaces=ns("pid"))
    assert code == 128 + signal.SIGKILL


def test_orphans_are_reaped_by_the_init(output: Output, sandbox: Path) -> None:
    # The orphan writes its pid and exits; the task polls until its /proc entry is gone.
    script = (
        "(sh -c 'echo $$ > orphan.pid' &); "
        "while [ ! -s orphan.pid ]; do sleep 0.01; done; p=$(cat orphan.pid); i=0; "
        'while [ -e "/proc/$p" ] && [ $i -lt 500 ]; do i=$((i+1)); sleep 0.01; done; '
        '[ -e "/proc/$p" ] && grep State "/proc/$p/status" || echo reaped'
    )
    code, text = run(output, sandbox, script, namespaces=ns("pid"))
    assert (code, text) == (0, "reaped\n")


def test_uts_hostname_is_the_containers_only(output: Output, sandbox: Path) -> None:
    host = socket.gethostname()
    code, text = run(output, sandbox, "hostname", namespaces=ns("uts"), hostname="agora-box")
    assert (code, text) == (0, "agora-box\n")
    assert socket.gethostname() == host


def test_ipc_and_uts_namespaces_are_new(output: Output, sandbox: Path) -> None:
    script = "readlink /proc/self/ns/ipc /proc/self/ns/uts"
    code, text = run(output, sandbox, script, namespaces=ns("ipc", "uts"))
    assert code == 0
    inside = text.split()
    assert len(inside) == 2
    assert inside[0] != os.readlink("/proc/self/ns/ipc")
    assert inside[1] != os.readlink("/proc/self/ns/uts")


def test_mount_namespace_has_a_private_tmp(output: Output, sandbox: Path) -> None:
    name = f"agora-launch-{uuid.uuid4().hex}"
    code, text = run(output, sandbox, f"echo hi > /tmp/{name} && pwd", namespaces=ns("mount"))
    assert (code, text) == (0, f"{sandbox}\n")
    assert (sandbox / "tmp" / name).read_text() == "hi\n"
    assert not os.path.exists(f"/tmp/{name}")


def test_paths_kept_visible_survive_the_private_tmp_read_only(
    output: Output, sandbox: Path, tmp_path: Path
) -> None:
    runtime = tmp_path / "runtime"  # under /tmp, like a venv in a fresh checkout there
    runtime.mkdir()
    (runtime / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (runtime / "tool").chmod(0o755)
    hidden = tmp_path / "elsewhere"
    hidden.mkdir()
    script = f"{runtime}/tool; touch {runtime}/x 2>/dev/null || echo read-only; ls {hidden} || :"
    code, text = run(output, sandbox, script, namespaces=ns("mount"), keep_visible=(str(runtime),))
    assert code == 0
    assert text.splitlines()[:2] == ["tool ran", "read-only"]
    assert "No such file" in text  # what was not kept stays hidden


def test_volume_in_the_sandbox_is_read_only(output: Output, sandbox: Path, tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "file").write_text("shared\n")
    script = "cat data/file; echo x > data/new || echo refused"
    options = {"namespaces": ns("mount"), "volumes": (Bind(str(volume), "data", True),)}
    code, text = run(output, sandbox, script, **options)
    assert code == 0
    assert text.startswith("shared\n") and text.endswith("refused\n")
    assert os.listdir(volume) == ["file"]


def test_net_namespace_has_only_loopback(output: Output, sandbox: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (
            "import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "socket.create_connection(s.getsockname(), timeout=2).close(); print('lo-up')\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('reached-host')\n"
            "except OSError:\n"
            "    print('host-unreachable')\n"
        )
        script = f'tail -n +3 /proc/net/dev | cut -d: -f1; {sys.executable} -c "{probe}"'
        code, text = run(output, sandbox, script, namespaces=ns("net"))
    assert code == 0
    assert text.split() == ["lo", "lo-up", "host-unreachable"]


@pytest.mark.parametrize("namespaces", [ns("mount"), ns("pid")], ids=["plain", "pid-ns"])
def test_task_runs_as_nobody(
    output: Output, sandbox: Path, tmp_path: Path, namespaces: frozenset[str]
) -> None:
    nobody = pwd.getpwnam("nobody")
    os.chown(sandbox, nobody.pw_uid, nobody.pw_gid)
    os.chown(output.path, nobody.pw_uid, nobody.pw_gid)
    script = "id -u; id -g; id -G; touch mine && stat -c %u mine"
    code, text = run(output, sandbox, script, namespaces=namespaces, uid=nobody.pw_uid)
    assert code == 0
    uid, gid = str(nobody.pw_uid), str(nobody.pw_gid)
    assert text.split() == [uid, gid, gid, uid]


def test_task_joins_the_given_cgroup(output: Output, sandbox: Path) -> None:
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((ln.split(":", 2)[2] for ln in lines if ln.split(":")[1] == "memory"), None)
    if own is None or not os.path.isdir("/sys/fs/cgroup/memory"):
        pytest.skip("no cgroup v1 memory hierarchy")
    cgroup = Path(f"/sys/fs/cgroup/memory{own}/agora-launch-{uuid.uuid4().hex[:8]}")
    cgroup.mkdir()
    try:
        procs = (str(cgroup / "cgroup.procs"),)
        spec = run_spec(output, sandbox, "echo ready; exec sleep 30", namespaces=ns("pid"))
        spec = ContainerSpec(**{**_fields(spec), "cgroup_procs": procs})
        pid = spawn(spec)
        wait_for(lambda: "ready" in output.text(), timeout=10, what="the task to start")
        members = {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
        os.kill(pid, signal.SIGKILL)
        assert wait_exit(pid) == -signal.SIGKILL
        assert pid in members and len(members) == 2  # the init and the command
    finally:
        wait_for(lambda: _rmdir(cgroup), timeout=5, what=f"removing {cgroup}")


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True


def _fields(spec: ContainerSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in ContainerSpec.__dataclass_fields__}


def test_exec_failure_in_a_pid_namespace_leaves_nothing(output: Output, sandbox: Path) -> None:
    spec = ContainerSpec(("no-such-agora-command",), PATH, str(sandbox), 0, 1, 2)
    spec = ContainerSpec(**{**_fields(spec), "namespaces": ns("pid", "uts", "ipc")})
    with pytest.raises(LaunchError, match="no-such-agora-command"):
        spawn(spec)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root filesystem holding only busybox (Debian's busybox-static)."""
    return busybox_rootfs(tmp_path_factory.mktemp("image"))


def snapshot(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime_ns) for p in root.rglob("*"))


@pytest.mark.parametrize("namespaces", [ns("pid", "uts"), ns("mount")], ids=["pid-ns", "mount"])
def test_rootfs_is_the_image_and_writes_stay_out_of_it(
    output: Output, sandbox: Path, image: Path, tmp_path: Path, namespaces: frozenset[str]
) -> None:
    (sandbox / "marker").write_text("sandbox\n")
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "file").write_text("volume\n")
    before = snapshot(image)
    script = (
        "cat /etc/agora-image; cat /etc/debian_version 2>/dev/null || echo no-debian; "
        "echo w > /written && cat /written; pwd; cat marker; cat /vol/file; "
        "echo x 2>/dev/null >/vol/new || echo vol-read-only; ls /dev/null /dev/shm >/dev/null"
    )
    code, text = run(
        output,
        sandbox,
        script,
        env={"PATH": "/bin"},
        namespaces=namespaces,
        rootfs=str(image),
        volumes=(Bind(str(volume), "/vol", read_only=True),),
    )
    assert code == 0, text
    assert text.split() == [
        "busybox-image",
        "no-debian",
        "w",
        "/mnt/sandbox",
        "sandbox",
        "volume",
        "vol-read-only",
    ]
    assert snapshot(image) == before
    assert os.listdir(volume) == ["file"]
    assert os.listdir(sandbox / ".rootfs") == []  # the build mounts lived in the container only


def test_rootfs_falls_back_to_read_only_without_overlay(
    output: Output, sandbox: Path, image: Path, tmp_path: Path
) -> None:
    # overlayfs options cannot name a lower dir with a comma: the image is bound read-only.
    fallback = tmp_path / "image,read-only"
    shutil.copytree(image, fallback, symlinks=True)
    for mount_point in ("mnt/sandbox", "proc", "dev", "tmp"):
        (fallback / mount_point).mkdir(parents=True)
    script = "cat /etc/agora-image; echo x 2>/dev/null >/written || echo root-read-only; pwd"
    options = {"env": {"PATH": "/bin"}, "namespaces": ns("pid"), "rootfs": str(fallback)}
    code, text = run(output, sandbox, script, **options)
    assert (code, text.split()) == (0, ["busybox-image", "root-read-only", "/mnt/sandbox"])
    (fallback / "mnt" / "sandbox").rmdir()
    with pytest.raises(LaunchError, match="Read-only file system"):
        spawn(run_spec(output, sandbox, "true", **options))
