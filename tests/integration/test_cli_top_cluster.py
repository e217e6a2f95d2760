"""`agora top` against a real `agora local` cluster: one frame with --once, and the live console
on a pseudo-terminal quitting on `q` and on Ctrl-C with status 0 (and its terminal restored).

(Named apart from tests/unit/test_cli_top.py: the test directories are not packages, so two test
modules may not share a basename.)
"""

from __future__ import annotations

import contextlib
import os
import pty
import selectors
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import AGORA, Local, _kill_everything, cluster_pids, start_local


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-top"), agents=2)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)
        assert not cluster_pids(cluster.work)


def test_top_once_shows_both_agents_and_the_finished_task(local: Local) -> None:
    done = local.agora("run", "--task-id", "top-probe", "--", "echo", "hello")
    assert (done.returncode, done.stdout) == (0, "hello\n"), done.stderr
    out = local.agora("top", "--once", timeout=30)
    assert out.returncode == 0, out.stderr
    assert "agent-1" in out.stdout and "agent-2" in out.stdout
    line = next(x for x in out.stdout.splitlines() if "top-probe" in x)
    assert "FINISHED" in line
    assert "cpus" in out.stdout and "/8 (" in out.stdout  # two agents of 4 cpus each
    assert "agora-run" in out.stdout  # the framework `agora run` registered


def test_top_once_without_a_master_is_one_line_and_exit_1(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["AGORA_HOME"] = str(tmp_path)
    out = subprocess.run(
        [*AGORA, "top", "--once", "--master", "tcp://127.0.0.1:9", "--timeout", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("agora top: cannot reach the master")
    assert "Traceback" not in out.stderr


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while needle not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} on the pty in {timeout}s: {buf[-2000:]!r}")
            if sel.select(left):
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed its side
                    break
                if not chunk:
                    break
                buf += chunk
    return buf


@contextlib.contextmanager
def _top_on_a_pty(local: Local) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    master_fd, slave_fd = pty.openpty()
    proc = subprocess.Popen(
        [*AGORA, "top", "--interval", "0.2"],
        env={**local.env, "COLUMNS": "160", "LINES": "50", "TERM": "xterm-256color"},
        stdin=slave_fd,
        stdout=slave_fd,
        stderr=slave_fd,
        start_new_session=True,
    )
    try:
        yield proc, master_fd, slave_fd
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        os.close(master_fd)
        os.close(slave_fd)


@pytest.mark.parametrize("how", ["q", "ctrl-c"])
def test_live_top_quits_cleanly(local: Local, how: str) -> None:
    with _top_on_a_pty(local) as (proc, master_fd, slave_fd):
        before = termios.tcgetattr(slave_fd)
        _read_until(master_fd, b"agent-2", timeout=30)
        _read_until(master_fd, b"agent-1", timeout=10)  # a later frame, still live
        if how == "q":
            os.write(master_fd, b"q")
        else:
            os.killpg(proc.pid, signal.SIGINT)
        # Keep reading, as a terminal does: a top blocked writing a frame to a full pty cannot
        # get to its quitting (it leaves the alternate screen as it quits).
        _read_until(master_fd, b"\x1b[?1049l", timeout=15)
        assert proc.wait(timeout=10) == 0
        after = termios.tcgetattr(slave_fd)
        assert after[3] == before[3]  # lflag: ICANON and ECHO back as they were
