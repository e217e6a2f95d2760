"""`agora top` as a person sees it: the live console in a real terminal (a detached tmux pane)
against an `agora local` cluster, showing a task go RUNNING then FINISHED, and quitting on `q`.

tmux renders what top draws, so this checks the screen itself (alternate screen, layout at
200x50), not just the bytes written. Each test has its own tmux server (a socket in tmp_path,
no user config) and kills it on the way out.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.polling import wait_for
from test_cli import AGORA, Local, _kill_everything, cluster_pids, start_local

TMUX = shutil.which("tmux")

pytestmark = pytest.mark.skipif(
    TMUX is None, reason="needs tmux (apt-get install tmux; `make test` installs it as root)"
)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-top-tmux"), agents=2)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)
        assert not cluster_pids(cluster.work)


class Tmux:
    """A tmux server of our own (its socket and config in ``tmp``), for one session ``top``."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        assert TMUX is not None
        self.base = [TMUX, "-S", str(tmp / "tmux.sock"), "-f", str(tmp / "tmux.conf")]
        # Keep the pane after its command exits: the test sees it dead rather than gone.
        (tmp / "tmux.conf").write_text("set -g remain-on-exit on\n")
        self.env = env
        self.cwd = tmp

    def __call__(self, *args: str) -> str:
        out = subprocess.run(
            [*self.base, *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert out.returncode == 0, f"tmux {args[0]}: {out.stderr}"
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def screen_with(self, *needles: str) -> str | None:
        """The screen if it shows every one of ``needles``."""
        screen = self.screen()
        return screen if all(n in screen for n in needles) else None

    def pane(self, fmt: str) -> str:
        return self("display-message", "-p", "-t", "top", fmt).strip()


@contextlib.contextmanager
def _tmux_running(tmp: Path, env: dict[str, str], command: str) -> Iterator[Tmux]:
    tmux = Tmux(tmp, {**env, "TERM": "xterm-256color"})
    pane_pid = 0
    try:
        tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", command)
        pane_pid = int(tmux.pane("#{pane_pid}"))
        yield tmux
    finally:
        # The pane's command leads its own process group: if top did not quit, end it, then
        # the server.
        with contextlib.suppress(Exception):
            if pane_pid and tmux.pane("#{pane_dead}") == "0":
                os.killpg(pane_pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            tmux("kill-server")


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first line ``proc`` writes to stdout, read with a deadline."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            assert left > 0, f"no line from agora run in {timeout}s: {buf!r}"
            if sel.select(left):
                chunk = os.read(fd, 4096)
                assert chunk, f"agora run exited: {buf!r}"
                buf += chunk
    return buf.split(b"\n", 1)[0].decode().strip()


def _task_row(screen: str, task_id: str, state: str) -> str | None:
    """The tasks-table line of ``task_id`` if it shows ``state`` (events say it in lower case)."""
    return next((ln for ln in screen.splitlines() if task_id in ln and state in ln), None)


def test_top_in_tmux_follows_a_task_and_quits_on_q(local: Local, tmp_path: Path) -> None:
    task_id = "tmux-probe"
    # The shell records top's exit status (tmux 3.3 does not always reap a pane's process, so
    # #{pane_dead_status} may stay empty).
    status = tmp_path / "status"
    top = (
        f"{shlex.join([*AGORA, 'top', '--interval', '0.5'])}; echo $? > {shlex.quote(str(status))}"
    )
    with _tmux_running(tmp_path, local.env, top) as tmux:
        screen = wait_for(
            lambda: tmux.screen_with("agent-1", "agent-2"), timeout=30, what="top to draw agents"
        )
        assert "Traceback" not in screen
        # The task runs until the test opens its gate (a file in its sandbox, which the task's
        # private /tmp keeps at the same path): RUNNING is on screen however slow the poll.
        script = 'echo "$AGORA_SANDBOX"; while [ ! -e "$AGORA_SANDBOX/go" ]; do sleep 0.05; done'
        run = local.spawn("run", "--task-id", task_id, "--", "sh", "-c", script)
        try:
            sandbox = Path(_first_line(run, timeout=30))
            wait_for(
                lambda: _task_row(tmux.screen(), task_id, "RUNNING"),
                timeout=30,
                what=f"top to show {task_id} RUNNING",
            )
            (sandbox / "go").touch()
            assert run.wait(timeout=30) == 0, run.communicate()
            row = wait_for(
                lambda: _task_row(tmux.screen(), task_id, "FINISHED"),
                timeout=15,
                what=f"top to show {task_id} FINISHED",
            )
            assert "RUNNING" not in row
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(timeout=10)
        assert tmux.pane("#{pane_dead}") == "0", "top quit before it was told to"
        tmux("send-keys", "-t", "top", "q")
        wait_for(lambda: tmux.pane("#{pane_dead}") == "1", timeout=15, what="top to quit on q")
        assert status.read_text().strip() == "0", "top did not exit 0 on q"
