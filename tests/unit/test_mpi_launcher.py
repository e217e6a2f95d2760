"""The MPI launcher (ssh stand-in) against a real LaunchServer running commands locally."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from agora.frameworks.mpi.launch_server import LaunchServer
from agora.frameworks.mpi.launcher import SOCKET_VAR, UsageError, main, split_command
from agora.frameworks.mpi.protocol import decode, encode, frame
from agora.frameworks.mpi.remote import RemoteCommands
from support.polling import until
from support.procs import alive

LAUNCHER = [sys.executable, "-m", "agora.frameworks.mpi.launcher"]


class Rig:
    """A LaunchServer whose launches run through a RemoteCommands in this process, as the
    scheduler would relay them between the rank-0 executor and a member."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.path = str(tmp_path / "launch.sock")
        self.launched: list[tuple[str, str, str]] = []
        self.cancelled: list[str] = []
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.remote = RemoteCommands(self._relay, env, str(tmp_path))
        self.server = LaunchServer(self._on_launch, self._on_cancel)

    def _on_launch(self, id: str, host: str, cmd: str) -> None:
        self.launched.append((id, host, cmd))
        self.remote.start(id, cmd)

    def _on_cancel(self, id: str) -> None:
        self.cancelled.append(id)
        self.remote.kill(id)

    def _relay(self, message: bytes) -> None:
        self.server.deliver(decode(message)["id"], message)

    def env(self) -> dict[str, str]:
        return {**os.environ, SOCKET_VAR: self.path}

    async def launch(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *LAUNCHER,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(),
        )

    async def run(self, *args: str) -> tuple[int, bytes, bytes]:
        proc = await self.launch(*args)
        out, err = await asyncio.wait_for(proc.communicate(), 15)
        assert proc.returncode is not None
        return proc.returncode, out, err


@asynccontextmanager
async def rig_for(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path)
    await rig.server.start(rig.path)
    try:
        yield rig
    finally:
        await rig.server.close()
        await rig.remote.kill_all()
    assert not os.path.exists(rig.path)


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text else None


# -- argument handling ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "host", "cmd"),
    [
        (["h1", "echo", "hi"], "h1", "echo hi"),
        (["-x", "-T", "h1", "orted", "-mca", "a", "'b c'"], "h1", "orted -mca a 'b c'"),
        (["-o", "StrictHostKeyChecking=no", "-oBatchMode=yes", "h1", "true"], "h1", "true"),
        (["-p", "22", "-l", "root", "-xTp2222", "node-3", "x"], "node-3", "x"),
        (["-o", "JobId=42", "--", "-h", "true"], "-h", "true"),
    ],
)
def test_split_command_skips_ssh_options(argv: list[str], host: str, cmd: str) -> None:
    assert split_command(argv) == (host, cmd)


@pytest.mark.parametrize("argv", [[], ["-x"], ["h1"], ["-o"], ["-p", "22", "h1"]])
def test_split_command_refuses_missing_host_or_command(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        split_command(argv)


def test_without_the_socket_variable_exits_255(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(SOCKET_VAR, raising=False)
    assert main(["h1", "true"]) == 255
    err = capfd.readouterr().err
    assert SOCKET_VAR in err and len(err.splitlines()) == 1


def test_unreachable_socket_exits_255(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(SOCKET_VAR, str(tmp_path / "nobody.sock"))
    assert main(["h1", "true"]) == 255
    assert "cannot reach" in capfd.readouterr().err


# -- through a real server -----------------------------------------------------------------


def test_echo_exit_codes_and_stderr(tmp_path: Path) -> None:
    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            assert await rig.run("node1", "echo", "hi") == (0, b"hi\n", b"")
            assert (await rig.run("node1", "sh", "-c", "'exit 7'"))[0] == 7
            code, out, err = await rig.run("node2", "echo", "oops", ">&2;", "exit", "3")
            assert (code, out, err) == (3, b"", b"oops\n")
            hosts_cmds = [(host, cmd) for _, host, cmd in rig.launched]
            assert hosts_cmds == [
                ("node1", "echo hi"),
                ("node1", "sh -c 'exit 7'"),
                ("node2", "echo oops >&2; exit 3"),
            ]
            assert len({id for id, _, _ in rig.launched}) == 3
            assert rig.cancelled == []

    asyncio.run(go())


def test_ssh_options_are_skipped(tmp_path: Path) -> None:
    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            args = ["-x", "-o", "BatchMode=yes", "-oX=y", "-p", "22", "-T", "nodeA", "echo", "ok"]
            assert await rig.run(*args) == (0, b"ok\n", b"")
            assert [host for _, host, _ in rig.launched] == ["nodeA"]

    asyncio.run(go())


def test_big_output_arrives_intact(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    (tmp_path / "blob").write_bytes(data)

    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            code, out, err = await rig.run("node1", "cat", "blob")
            assert (code, err) == (0, b"")
            assert out == data

    asyncio.run(go())


def test_server_closed_mid_run_exits_255_and_kills_the_command(tmp_path: Path) -> None:
    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            proc = await rig.launch("node1", "echo $$ > pid; exec sleep 30")
            await until(lambda: read_pid(tmp_path / "pid"), what="remote command")
            pid = read_pid(tmp_path / "pid")
            assert pid is not None and alive(pid)
            await rig.server.close()
            _, err = await asyncio.wait_for(proc.communicate(), 10)
            assert proc.returncode == 255
            assert b"closed before" in err
            assert rig.cancelled == [rig.launched[0][0]]
            await until(lambda: not alive(pid), 5, "remote command killed")

    asyncio.run(go())


def test_killed_launcher_kills_the_remote_tree(tmp_path: Path) -> None:
    d = tmp_path
    cmd = (
        # a grandchild in its own session, one orphaned (its parent exits), then the command
        f"setsid sh -c 'echo $$ > {d}/g; exec sleep 60' & "
        f"(setsid sh -c 'echo $$ > {d}/o; exec sleep 60' &); "
        f"echo $$ > {d}/c; sleep 60"
    )
    files = [d / "g", d / "o", d / "c"]
    pids: list[int] = []

    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            proc = await rig.launch("node1", cmd)
            await until(lambda: all(read_pid(f) for f in files), what="pid files")
            pids.extend(p for p in map(read_pid, files) if p is not None)
            assert all(alive(p) for p in pids)
            proc.kill()
            await proc.wait()
            started = time.monotonic()
            await until(lambda: rig.cancelled, 5, "on_cancel")
            assert rig.cancelled == [rig.launched[0][0]]
            await until(lambda: not any(alive(p) for p in pids), 5, "remote tree gone")
            assert time.monotonic() - started < 5
            await until(lambda: not rig.remote.running(), 5, "exit of the killed command")

    try:
        asyncio.run(go())
    finally:  # on failure, leave nothing behind
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_bad_frames_close_only_that_connection(tmp_path: Path) -> None:
    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            for garbage in (b"\x00\x00\x00\x03abc", frame(encode("kill", id="x")), b"\xff" * 8):
                reader, writer = await asyncio.open_unix_connection(rig.path)
                writer.write(garbage)
                assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
                writer.close()
            assert rig.launched == [] and rig.cancelled == []
            rig.server.deliver("l1", encode("exit", id="l1", code=0))  # unknown: ignored
            assert await rig.run("node1", "true") == (0, b"", b"")

    asyncio.run(go())


def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "launch.sock"))
    stale.close()

    async def go() -> None:
        async with rig_for(tmp_path) as rig:
            assert os.stat(rig.path).st_mode & 0o777 == 0o600
            assert await rig.run("node1", "echo", "fresh") == (0, b"fresh\n", b"")

    asyncio.run(go())
