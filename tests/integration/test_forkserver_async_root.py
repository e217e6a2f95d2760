"""The fork server with several launches in flight: each container's setup goes on while the server
takes the next request, replies find their launch whatever their order, a synchronous launch in
the middle hands the others their replies, and a launch cancelled before its reply leaves no
process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.launch import ContainerSpec, LaunchError, become_subreaper
from support.polling import until

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: namespaces"),
    pytest.mark.timeout(60),
]

PID_MOUNT = frozenset({"pid", "mount"})


@pytest.fixture
def server() -> Iterator[ForkServer]:
    assert become_subreaper()
    fs = ForkServer()
    yield fs
    fs.close()
    become_subreaper(enable=False)


class _Stdio:
    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.fds: list[int] = []

    def spec(self, name: str, script: str, namespaces: frozenset[str]) -> ContainerSpec:
        sandbox = self.dir / name
        sandbox.mkdir()
        out = os.open(sandbox / "out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        self.fds += (out, null)
        return ContainerSpec(
            argv=("/bin/sh", "-c", script),
            env={"PATH": "/usr/bin:/bin"},
            sandbox=str(sandbox),
            stdin=null,
            stdout=out,
            stderr=out,
            namespaces=namespaces,
        )

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[_Stdio]:
    files = _Stdio(tmp_path)
    yield files
    files.close()


def _exit_code(pid: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"container {pid} did not exit")


@pytest.mark.parametrize("namespaces", [frozenset(), PID_MOUNT])
def test_launches_in_flight_together_each_get_their_container(
    server: ForkServer, stdio: _Stdio, namespaces: frozenset[str]
) -> None:
    specs = [stdio.spec(f"c{i}", f"echo c{i}; exit {i}", namespaces) for i in range(8)]

    async def launch_all() -> list[int]:
        return list(await asyncio.gather(*(server.spawn_async(s) for s in specs)))

    pids = asyncio.run(launch_all())
    assert len(set(pids)) == len(pids)
    assert [_exit_code(pid) for pid in pids] == list(range(8))
    for i, spec in enumerate(specs):
        assert (Path(spec.sandbox) / "out").read_text() == f"c{i}\n"


def test_a_sync_launch_among_async_ones_hands_them_their_replies(
    server: ForkServer, stdio: _Stdio
) -> None:
    async def body() -> tuple[list[int], int]:
        pending = [
            asyncio.ensure_future(server.spawn_async(stdio.spec(f"a{i}", "exit 3", PID_MOUNT)))
            for i in range(4)
        ]
        await asyncio.sleep(0)  # the requests are sent
        middle = server.spawn(stdio.spec("sync", "exit 5", PID_MOUNT))
        return list(await asyncio.gather(*pending)), middle

    pids, middle = asyncio.run(body())
    assert _exit_code(middle) == 5
    assert [_exit_code(pid) for pid in pids] == [3, 3, 3, 3]


def test_a_launch_error_comes_back_to_its_own_launch(server: ForkServer, stdio: _Stdio) -> None:
    good = stdio.spec("good", "exit 0", PID_MOUNT)
    bad = stdio.spec("bad", "exit 0", PID_MOUNT)
    bad = ContainerSpec(
        argv=("/nonexistent/agora-tool",),
        env=bad.env,
        sandbox=bad.sandbox,
        stdin=bad.stdin,
        stdout=bad.stdout,
        stderr=bad.stderr,
        namespaces=PID_MOUNT,
    )

    async def body() -> list[int | BaseException]:
        return await asyncio.gather(
            server.spawn_async(bad), server.spawn_async(good), return_exceptions=True
        )

    failed, started = asyncio.run(body())
    assert isinstance(failed, LaunchError) and "agora-tool" in str(failed)
    assert isinstance(started, int) and _exit_code(started) == 0


def test_a_launch_cancelled_before_its_reply_leaves_no_process(
    server: ForkServer, stdio: _Stdio
) -> None:
    spec = stdio.spec("orphan", "exec sleep 60", frozenset())
    killed: list[int] = []

    def reaped_killed_child() -> bool:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
        if info is not None and info.si_code == os.CLD_KILLED:
            killed.append(info.si_status)
        return bool(killed)

    async def body() -> None:
        launch = asyncio.ensure_future(server.spawn_async(spec))
        await asyncio.sleep(0)  # sent, not answered yet
        assert not launch.done()
        launch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await launch
        # The reply comes, the container is SIGKILLed; re-parented to us, we reap it.
        await until(reaped_killed_child, 10, "the cancelled launch's container to be killed")

    asyncio.run(body())
    assert killed == [signal.SIGKILL]
