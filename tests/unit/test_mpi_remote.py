"""RemoteCommands (agora.frameworks.mpi.remote): members run the scheduler's commands like sshd."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agora.frameworks.mpi.protocol import decode
from agora.frameworks.mpi.remote import CHUNK, MARKER_VAR, RemoteCommands
from support.polling import until
from support.procs import alive

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FOO": "bar baz"}


class Collector:
    """Decoded messages a RemoteCommands sent, by arrival."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def __call__(self, message: bytes) -> None:
        self.messages.append(decode(message))

    def of(self, id: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["id"] == id]

    def output(self, id: str, fd: int) -> bytes:
        return b"".join(m["data"] for m in self.of(id) if m["t"] == "out" and m["fd"] == fd)

    def exit_code(self, id: str) -> int | None:
        codes = [m["code"] for m in self.of(id) if m["t"] == "exit"]
        assert len(codes) <= 1, "more than one exit"
        return codes[0] if codes else None


async def run_one(tmp_path: Path, cmd: str) -> Collector:
    sent = Collector()
    remote = RemoteCommands(sent, ENV, str(tmp_path))
    remote.start("c1", cmd)
    try:
        await until(lambda: sent.exit_code("c1") is not None, what="exit")
    finally:
        await remote.kill_all()
    assert remote.running() == set()
    return sent


def test_output_env_cwd_and_exit_code(tmp_path: Path) -> None:
    cmd = 'echo "$FOO"; pwd; echo oops >&2; exit 3'
    sent = asyncio.run(run_one(tmp_path, cmd))
    assert sent.output("c1", 1) == f"bar baz\n{tmp_path}\n".encode()
    assert sent.output("c1", 2) == b"oops\n"
    assert sent.exit_code("c1") == 3
    assert sent.messages[-1]["t"] == "exit"


def test_killed_by_a_signal_exits_128_plus_n(tmp_path: Path) -> None:
    sent = asyncio.run(run_one(tmp_path, "kill -TERM $$"))
    assert sent.exit_code("c1") == 128 + 15


def test_stdin_is_dev_null_and_own_session(tmp_path: Path) -> None:
    # cat would block on an inherited stdin; field 6 of /proc/PID/stat is the session id.
    sent = asyncio.run(run_one(tmp_path, "cat; echo $$; cut -d' ' -f6 /proc/$$/stat"))
    pid, session = sent.output("c1", 1).split()
    assert pid == session
    assert sent.exit_code("c1") == 0


def test_marker_is_in_the_command_environment(tmp_path: Path) -> None:
    sent = asyncio.run(run_one(tmp_path, f'echo "${MARKER_VAR}"'))
    assert sent.output("c1", 1).strip()


def test_big_output_comes_in_bounded_chunks(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    (tmp_path / "blob").write_bytes(data)
    sent = asyncio.run(run_one(tmp_path, "cat blob"))
    chunks = [m["data"] for m in sent.of("c1") if m["t"] == "out"]
    assert all(len(c) <= CHUNK for c in chunks)
    assert b"".join(chunks) == data


def test_exit_waits_for_the_pipes_to_drain(tmp_path: Path) -> None:
    # The shell exits at once; a background job still holds stdout and writes later.
    sent = asyncio.run(run_one(tmp_path, "(sleep 0.2; echo late) & echo early"))
    kinds = [(m["t"], m.get("data")) for m in sent.of("c1")]
    assert kinds == [("out", b"early\n"), ("out", b"late\n"), ("exit", None)]


def test_cannot_start_in_a_missing_directory(tmp_path: Path) -> None:
    sent = asyncio.run(run_one(tmp_path / "missing", "echo hi"))
    assert sent.exit_code("c1") == 127
    assert b"cannot run" in sent.output("c1", 2)


def test_duplicate_id_and_unknown_kill_do_nothing(tmp_path: Path) -> None:
    async def main() -> Collector:
        sent = Collector()
        remote = RemoteCommands(sent, ENV, str(tmp_path))
        try:
            remote.start("a", "echo first; exec sleep 30")
            await until(lambda: sent.output("a", 1) == b"first\n", what="first output")
            remote.start("a", "echo second")
            remote.kill("nope")
            assert remote.running() == {"a"}
            remote.kill("a")
            remote.kill("a")  # a second kill of the same id changes nothing
            await until(lambda: sent.exit_code("a") is not None, what="exit after kill")
        finally:
            await remote.kill_all()
        assert remote.running() == set()
        return sent

    sent = asyncio.run(main())
    assert sent.output("a", 1) == b"first\n"
    assert sent.exit_code("a") == 128 + 9


def test_kill_right_after_start(tmp_path: Path) -> None:
    async def main() -> Collector:
        sent = Collector()
        remote = RemoteCommands(sent, ENV, str(tmp_path))
        remote.start("a", "echo $$ > pid; exec sleep 30")
        remote.kill("a")  # before the shell even exists
        await until(lambda: sent.exit_code("a") is not None, what="exit")
        await remote.kill_all()
        return sent

    sent = asyncio.run(main())
    assert sent.exit_code("a") is not None
    pid_file = tmp_path / "pid"
    if pid_file.exists() and pid_file.read_text().strip():
        assert not alive(int(pid_file.read_text()))


def test_kill_all_kills_every_tree(tmp_path: Path) -> None:
    async def main() -> list[int]:
        sent = Collector()
        remote = RemoteCommands(sent, ENV, str(tmp_path))
        try:
            for n in range(3):
                # the grandchild leaves the session and the process group
                remote.start(f"c{n}", f"setsid sh -c 'echo $$ > g{n}; exec sleep 30' & sleep 30")
            files = [tmp_path / f"g{n}" for n in range(3)]
            await until(lambda: all(f.exists() and f.read_text() for f in files), what="pids")
            pids = [int(f.read_text()) for f in files]
            assert all(alive(p) for p in pids)
            assert remote.running() == {"c0", "c1", "c2"}
        finally:
            await remote.kill_all()
        assert remote.running() == set()
        assert [sent.exit_code(f"c{n}") for n in range(3)] == [137, 137, 137]
        return pids

    pids = asyncio.run(main())
    assert not any(alive(p) for p in pids)


# Run in a child process: it makes itself a subreaper, so an orphan the command leaves behind is
# re-parented to it; the kill must find that orphan (by the marker) and reap its zombie.
_SUBREAPER_SCRIPT = """
import asyncio, os, sys, time
from agora.frameworks.mpi.protocol import decode
from agora.frameworks.mpi.remote import RemoteCommands, become_subreaper

assert become_subreaper()
work = sys.argv[1]

async def main():
    sent = []
    remote = RemoteCommands(lambda m: sent.append(decode(m)), dict(os.environ), work)
    remote.start("x", "(setsid sh -c 'echo $$ > orphan; exec sleep 60' &); exec sleep 60")
    path = os.path.join(work, "orphan")
    deadline = time.monotonic() + 10
    while not (os.path.exists(path) and open(path).read().strip()):
        assert time.monotonic() < deadline, "no orphan pid"
        await asyncio.sleep(0.01)
    orphan = int(open(path).read())
    while True:  # the subshell exits, the orphan is re-parented to us
        ppid = int(open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid():
            break
        assert time.monotonic() < deadline, "orphan not re-parented"
        await asyncio.sleep(0.01)
    remote.kill("x")
    await remote.kill_all()
    assert [m["code"] for m in sent if m["t"] == "exit"] == [137]
    assert not os.path.exists(f"/proc/{orphan}"), "orphan alive or left a zombie"
    print("ok", orphan)

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux prctl")
def test_subreaper_orphans_are_killed_and_reaped(tmp_path: Path) -> None:
    try:
        result = subprocess.run(
            [sys.executable, "-c", _SUBREAPER_SCRIPT, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    finally:  # should the kill miss the orphan, do not leave it behind
        orphan = tmp_path / "orphan"
        if orphan.exists() and orphan.read_text().strip() and alive(int(orphan.read_text())):
            os.kill(int(orphan.read_text()), signal.SIGKILL)
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1].split()  # structlog may print before it
    assert last[0] == "ok"
    assert not alive(int(last[1]))
