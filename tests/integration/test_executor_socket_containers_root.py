"""A custom executor's container reaches the agent's executor socket (a Unix socket under the
agent's work dir): under a private /tmp the socket's directory stays at its own path, and in an
image's root filesystem it is bound read-only at AGENT_DIR_IN_ROOTFS, even in a read-only image.
Without ``agent_dir`` the container would not see it (the first test shows that too)."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.containerizer import AGENT_DIR_IN_ROOTFS
from agora.agent.containers.launch import ContainerSpec, become_subreaper, spawn
from agora.sdk.runtime import runtime_paths
from support.busybox import busybox_rootfs
from support.polling import wait_for

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: namespaces and mounts"),
    pytest.mark.timeout(60),
]


@pytest.fixture(autouse=True)
def subreaper() -> Iterator[None]:
    assert become_subreaper()
    yield
    become_subreaper(enable=False)


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket listening at ``<tmp>/work/run/executors.sock`` (under the host's /tmp)."""
    run_dir = tmp_path / "work" / "run"
    run_dir.mkdir(parents=True, mode=0o711)
    path = run_dir / "executors.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    os.chmod(path, 0o666)
    server.listen()
    yield path
    server.close()


def _run(tmp_path: Path, argv: tuple[str, ...], **options: object) -> tuple[int, str]:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    out_path = tmp_path / "output"
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        spec = ContainerSpec(
            argv=argv,
            env={"PATH": "/bin:/usr/bin"},
            sandbox=str(sandbox),
            stdin=null,
            stdout=out,
            stderr=out,
            **options,  # type: ignore[arg-type]
        )
        pid = spawn(spec)
    finally:
        os.close(out)
        os.close(null)

    def exited() -> int | None:
        got, status = os.waitpid(pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) + 1000 if got == pid else None

    try:
        code = wait_for(exited, timeout=20, what=f"container {pid} to exit") - 1000
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return code, out_path.read_text()


def test_a_private_tmp_keeps_the_socket_reachable_at_its_path(
    tmp_path: Path, listening: Path
) -> None:
    connect = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    argv = (sys.executable, "-c", connect, str(listening))
    options = {"namespaces": frozenset({"mount"}), "keep_visible": runtime_paths()}
    assert _run(tmp_path, argv, **options) == (0, "refused 2\n")  # hidden by the private /tmp
    code, text = _run(tmp_path, argv, agent_dir=str(listening.parent), **options)
    assert (code, text) == (0, "connected\n")


@pytest.mark.parametrize("read_only_image", [False, True], ids=["overlay", "read-only-image"])
def test_a_root_filesystem_shows_the_socket_directory_read_only(
    tmp_path: Path, listening: Path, read_only_image: bool
) -> None:
    image = busybox_rootfs(tmp_path / "image")
    if read_only_image:
        # overlayfs options cannot name a lower dir with a comma: the image is bound read-only.
        image = image.rename(tmp_path / "image,read-only")
        for mount_point in ("mnt/sandbox", "proc", "dev", "tmp"):
            (image / mount_point).mkdir(parents=True)
    inside = f"{AGENT_DIR_IN_ROOTFS}/{listening.name}"
    script = f"test -S {inside} && echo socket; touch {AGENT_DIR_IN_ROOTFS}/x || echo read-only"
    code, text = _run(
        tmp_path,
        ("sh", "-c", script),
        namespaces=frozenset({"mount", "pid"}),
        rootfs=str(image),
        agent_dir=str(listening.parent),
    )
    assert code == 0, text
    assert text.split()[0] == "socket"
    assert text.split()[-1] == "read-only"
    assert sorted(os.listdir(listening.parent)) == ["executors.sock"]
