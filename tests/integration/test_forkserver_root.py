"""The container fork server: containers it forks are adopted (and reaped) by the caller, with
the command's exit status; launch errors come back whole; it leaves with its caller."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers import forkserver
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.launch import ContainerSpec, LaunchError, become_subreaper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: namespaces")


@pytest.fixture
def server() -> Iterator[ForkServer]:
    assert become_subreaper()
    fs = ForkServer()
    yield fs
    fs.close()
    become_subreaper(enable=False)


def _spec(tmp_path: Path, script: str, **options: object) -> tuple[ContainerSpec, Path]:
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    spec = ContainerSpec(
        argv=("/bin/sh", "-c", script),
        env={"PATH": "/usr/bin:/bin"},
        sandbox=str(tmp_path),
        stdin=null,
        stdout=fd,
        stderr=fd,
        **options,  # type: ignore[arg-type]
    )
    return spec, out


def _wait(pid: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the container did not exit")


@pytest.mark.parametrize("namespaces", [frozenset(), frozenset({"pid", "mount"})])
def test_containers_from_the_server_are_our_children(
    server: ForkServer, tmp_path: Path, namespaces: frozenset[str]
) -> None:
    spec, out = _spec(tmp_path, "echo inside $$; exit 7", namespaces=namespaces)
    try:
        pid = server.spawn(spec)
    finally:
        for fd in (spec.stdin, spec.stdout):
            os.close(fd)
    assert _wait(pid) == 7  # waitpid works: the container was adopted by us
    text = out.read_text()
    assert text.startswith("inside ")
    if "pid" in namespaces:
        assert text.split()[1] == "2"


def test_a_launch_error_comes_back_from_the_server(server: ForkServer, tmp_path: Path) -> None:
    spec, _ = _spec(tmp_path, "true", namespaces=frozenset({"pid", "mount"}))
    bad = ContainerSpec(**{**_fields(spec), "argv": ("/nonexistent/agora-tool",)})
    try:
        with pytest.raises(LaunchError, match="agora-tool"):
            server.spawn(bad)
    finally:
        for fd in (spec.stdin, spec.stdout):
            os.close(fd)


def test_the_server_is_started_once_and_gone_after_close(tmp_path: Path) -> None:
    assert become_subreaper()
    server = ForkServer()
    pids: set[int | None] = set()
    try:
        for _ in range(3):
            spec, _ = _spec(tmp_path, "true")
            try:
                assert _wait(server.spawn(spec)) == 0
            finally:
                for fd in (spec.stdin, spec.stdout):
                    os.close(fd)
            pids.add(server.pid)
    finally:
        server.close()
        become_subreaper(enable=False)
    (pid,) = pids
    assert pid is not None and server.pid is None
    assert not Path(f"/proc/{pid}").exists(), "the server outlived close()"


def _fields(spec: ContainerSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in ContainerSpec.__dataclass_fields__}


def test_a_launch_over_the_deadline_fails_and_kills_the_server(tmp_path: Path) -> None:
    assert become_subreaper()
    server = ForkServer(timeout=0.001)  # the server cannot even start in time
    try:
        spec, _ = _spec(tmp_path, "true")
        try:
            with pytest.raises(LaunchError, match="fork server killed"):
                server.spawn(spec)
            assert server.pid is None
            patient = ForkServer()
            try:
                assert _wait(patient.spawn(spec)) == 0
            finally:
                patient.close()
        finally:
            for fd in (spec.stdin, spec.stdout):
                os.close(fd)
    finally:
        server.close()
        become_subreaper(enable=False)


def test_a_large_environment_travels_to_the_server(server: ForkServer, tmp_path: Path) -> None:
    # 400 kB of environment: twice a socket's default buffer (each variable stays below the
    # kernel's 128 kB limit on one exec string).
    spec, out = _spec(tmp_path, 'printf "%s" "${#BIG0}${#BIG7}"')
    huge = {f"BIG{i}": "x" * 50_000 for i in range(8)}
    big = ContainerSpec(**{**_fields(spec), "env": {**spec.env, **huge}})
    try:
        assert _wait(server.spawn(big)) == 0
    finally:
        for fd in (spec.stdin, spec.stdout):
            os.close(fd)
    assert out.read_text() == "5000050000"


def test_a_preforked_server_serves_the_first_fork_server(tmp_path: Path) -> None:
    """What the executor zygote does for a forked executor: the server is forked at its start,
    not started by exec at its first launch; it serves as one and is reaped at close."""
    assert become_subreaper()
    forkserver.prefork()
    fs = ForkServer()
    try:
        spec, out = _spec(tmp_path, "echo forked; exit 3", namespaces=frozenset({"pid", "mount"}))
        pid = fs.spawn(spec)
        server = fs.pid
        assert server is not None
        with (
            open(f"/proc/{server}/cmdline", "rb") as theirs,
            open("/proc/self/cmdline", "rb") as ours,
        ):
            assert theirs.read() == ours.read()  # a fork of this process, not a new interpreter
        assert _wait(pid) == 3
        assert out.read_text().strip() == "forked"
    finally:
        fs.close()
        become_subreaper(enable=False)
    assert not os.path.exists(f"/proc/{server}")  # exited and reaped
    assert ForkServer().pid is None  # the next one is started by exec as before
