"""The `agora` CLI against a real `agora local` cluster (a master and two agents as processes).

Every command runs as its own process (`python -m agora.sdk.cli ...`) with AGORA_HOME in the test's
temporary directory, so the address `agora local` records is the one the other commands find.
Everything is bounded in time, and each cluster is stopped (and checked to leave nothing behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for

AGORA = (sys.executable, "-m", "agora.sdk.cli")
RESOURCES = "cpus:4;mem:4096;disk:4096"
CMD_TIMEOUT = 60.0  # seconds any one CLI command may take


@dataclass
class Local:
    proc: subprocess.Popen[bytes]
    endpoint: str
    env: dict[str, str]
    work: Path
    home: Path
    stderr_path: Path

    def agora(self, *args: str, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AGORA, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*AGORA, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def tasks(self) -> list[dict[str, Any]]:
        out = self.agora("tasks", "--all", "--json")
        assert out.returncode == 0, out.stderr
        tasks: list[dict[str, Any]] = json.loads(out.stdout)
        return tasks

    def task(self, task_id: str) -> dict[str, Any] | None:
        return next((t for t in self.tasks() if t["task_id"] == task_id), None)

    def stop(self, timeout: float = 45.0) -> int:
        """SIGTERM `agora local` and wait for it; SIGKILL its group if it overstays."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            raise


def start_local(
    tmp: Path, agents: int = 2, extra_env: dict[str, str] | None = None, masters: int = 1
) -> Local:
    home, work = tmp / "home", tmp / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["AGORA_HOME"] = str(home)
    env.update(extra_env or {})
    stderr_path = tmp / "local.stderr"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [
                *AGORA,
                *("local", "--agents", str(agents), "--work-dir", str(work)),
                *("--masters", str(masters)),
                *("--agent-resources", RESOURCES, "--timeout", "45"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    local = Local(proc, "", env, work, home, stderr_path)
    try:
        local.endpoint = _first_line(proc, timeout=60.0, stderr_path=stderr_path)
    except BaseException:
        _kill_everything(local)
        raise
    return local


def _first_line(proc: subprocess.Popen[bytes], timeout: float, stderr_path: Path) -> str:
    assert proc.stdout is not None
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"agora local printed no address: {stderr_path.read_text()}")
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise AssertionError(f"agora local exited: {stderr_path.read_text()}")
                buf += chunk
    return buf.split(b"\n", 1)[0].decode().strip()


def cluster_pids(work: Path) -> set[int]:
    """Our processes that belong to the cluster under ``work``: daemons and the batch service (by
    their command line) and executors and tasks (by the AGORA_SANDBOX they were given)."""
    root = str(work.resolve())
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if zombie:
            continue
        sandbox = next(
            (e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"AGORA_SANDBOX=")), ""
        )
        daemon = any(
            name in cmdline
            for name in ("agora.master.server", "agora.agent.server", "agora.frameworks.batch")
        )
        if (daemon and root in cmdline) or sandbox.startswith(root):
            found.add(int(entry))
    return found


def _kill_everything(local: Local) -> None:
    with contextlib.suppress(Exception):
        local.stop(timeout=30)
    for pid in cluster_pids(local.work):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-local"))
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


# ------------------------------------------------------------------ against one cluster


def test_local_prints_and_records_the_master_address(local: Local) -> None:
    assert local.endpoint.startswith("tcp://127.0.0.1:")
    assert (local.home / "master").read_text().strip() == local.endpoint
    assert (local.work / "logs" / "master.log").exists()
    assert (local.work / "logs" / "agent-1.log").exists()


def test_run_echo_prints_hello_and_exits_0(local: Local) -> None:
    out = local.agora("run", "--", "echo", "hello")
    assert (out.returncode, out.stdout) == (0, "hello\n"), out.stderr


def test_run_relays_stderr_and_the_exit_code(local: Local) -> None:
    out = local.agora("run", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 3")
    assert out.returncode == 3, out.stderr
    assert out.stdout == "to-out\n"
    assert "to-err\n" in out.stderr


def test_run_keeps_each_word_one_argument(local: Local) -> None:
    out = local.agora("run", "--", "printf", "[%s]\\n", "a b", "$HOME")
    assert (out.returncode, out.stdout) == (0, "[a b]\n[$HOME]\n"), out.stderr


def test_run_that_finds_no_fitting_offer_times_out(local: Local) -> None:
    t0 = time.monotonic()
    out = local.agora("run", "--cpus", "64", "--timeout", "2", "--", "true")
    assert out.returncode == 1
    assert "no offer" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 20


def test_state_json_lists_the_agents_and_the_finished_tasks(local: Local) -> None:
    done = local.agora("run", "--task-id", "state-probe", "--", "true")
    assert done.returncode == 0, done.stderr
    out = local.agora("state", "--json")
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert state["master_info"]["address"]
    hosts = sorted(a["hostname"] for a in state["agents"])
    assert hosts == ["agent-1", "agent-2"]
    assert all(a["status"] == "ACTIVE" for a in state["agents"])
    assert all(a["resources"]["cpus"] == 4 for a in state["agents"])
    probe = next(t for t in state["tasks"] if t["task_id"] == "state-probe")
    assert (probe["state"], probe["exit_code"]) == ("FINISHED", 0)
    assert any(f["name"] == "agora-run" for f in state["frameworks"])
    # the same, for a person
    table = local.agora("state")
    assert table.returncode == 0 and "agent-1" in table.stdout and "state-probe" in table.stdout
    agents = json.loads(local.agora("agents", "--json").stdout)
    assert len(agents) == 2
    live = json.loads(local.agora("tasks", "--json").stdout)
    assert all(t["task_id"] != "state-probe" for t in live)


def test_kill_ends_a_running_run_with_a_nonzero_status(local: Local) -> None:
    run = local.spawn("run", "--task-id", "sleeper", "--", "sleep", "60")
    try:
        wait_for(
            lambda: (local.task("sleeper") or {}).get("state") == "RUNNING", 30, "sleeper RUNNING"
        )
        out = local.agora("kill", "sleeper")
        assert out.returncode == 0, out.stderr
        code = run.wait(timeout=30)
        assert code == 128 + signal.SIGTERM
        task = wait_for(
            lambda: (t := local.task("sleeper")) and t["state"] == "KILLED" and t, 15, "KILLED"
        )
        assert task["state"] == "KILLED"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
        run.communicate(timeout=10)


def test_kill_of_an_unknown_task_exits_1_with_the_masters_message(local: Local) -> None:
    out = local.agora("kill", "no-such-task")
    assert out.returncode == 1
    assert "no-such-task" in out.stderr and "Traceback" not in out.stderr


def test_ctrl_c_on_run_kills_the_task(local: Local) -> None:
    run = local.spawn("run", "--task-id", "interrupted", "--", "sleep", "60")
    try:
        wait_for(lambda: (local.task("interrupted") or {}).get("state") == "RUNNING", 30, "RUNNING")
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        assert (local.task("interrupted") or {}).get("state") == "KILLED"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
        run.communicate(timeout=10)


# ------------------------------------------------------------------ without a cluster


def test_an_unreachable_master_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["AGORA_HOME"] = str(tmp_path)
    for args in (("state",), ("agents", "--json"), ("tasks",), ("kill", "t")):
        t0 = time.monotonic()
        out = subprocess.run(
            [*AGORA, *args, "--master", f"tcp://127.0.0.1:{port}", "--timeout", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert time.monotonic() - t0 < 10
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "master" in lines[0], out.stderr
    out = subprocess.run(
        [*AGORA, "run", "--master", f"tcp://127.0.0.1:{port}", "--timeout", "1", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "could not subscribe" in out.stderr, out.stderr


# ------------------------------------------------------------------ stopping


def test_local_ignores_daemon_settings_meant_for_one_daemon_or_the_cli(tmp_path: Path) -> None:
    """One HTTP port cannot serve two agents, and the CLI's CURVE keys are not the daemons'."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    extra = {
        "AGORA_HTTP_PORT": str(port),
        "AGORA_CURVE_SECRET_KEY": str(tmp_path / "cli.key_secret"),
        "AGORA_CURVE_SERVER_KEY": str(tmp_path / "master.key"),
    }
    local = start_local(tmp_path, extra_env=extra)
    try:
        clean = {k: v for k, v in local.env.items() if not k.startswith("AGORA_CURVE")}
        done = subprocess.run(
            [*AGORA, "agents", "--json", "--master", local.endpoint],
            env=clean,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        agents = json.loads(done.stdout)
        ports = {a["http_port"] for a in agents}
        assert len(agents) == 2 and len(ports) == 2 and 0 not in ports
    finally:
        _kill_everything(local)


def test_sigterm_to_local_leaves_no_process_behind(tmp_path: Path) -> None:
    local = start_local(tmp_path)
    run: subprocess.Popen[str] | None = None
    try:
        run = local.spawn("run", "--task-id", "long", "--", "sleep", "120")
        wait_for(lambda: (local.task("long") or {}).get("state") == "RUNNING", 30, "RUNNING")
        pids = cluster_pids(local.work)
        # master, two agents, the command executor and the task (sleep) at least
        assert len(pids) >= 5, pids
        assert local.stop() == 0
        wait_for(lambda: not (pids & cluster_pids(local.work)), 10, "cluster processes to end")
        assert not cluster_pids(local.work)
        assert not (local.home / "master").exists()
        run.wait(timeout=30)
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
        _kill_everything(local)


def _agent_pids(local: Local, host: str) -> list[int]:
    agent_dir = str((local.work / host).resolve())
    return [
        pid
        for pid in cluster_pids(local.work)
        if "agora.agent.server" in (cmd := _cmdline(pid)) and agent_dir in cmd
    ]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_killed_agent_is_restarted_and_takes_its_task_back(tmp_path: Path) -> None:
    """`agora local` starts a SIGKILLed agent again on its work dir: the agent recovers the
    executor it left running, so the task lives on and can still be killed through it."""
    local = start_local(tmp_path)
    run: subprocess.Popen[str] | None = None
    try:
        run = local.spawn("run", "--task-id", "orphan", "--", "sleep", "120")
        task = wait_for(
            lambda: (t := local.task("orphan")) and t["state"] == "RUNNING" and t, 30, "RUNNING"
        )
        agents = json.loads(local.agora("agents", "--json").stdout)
        killed_on = task["agent_id"]
        host = next(a["hostname"] for a in agents if a["agent_id"] == killed_on)
        (agent_pid,) = _agent_pids(local, host)
        os.kill(agent_pid, signal.SIGKILL)  # its executor and task are orphaned, for a while
        wait_for(
            lambda: (
                f"agora local: {host} was killed by signal 9; restarting it in 0.5 s (attempt 1"
                in local.stderr_path.read_text()
            ),
            10,
            "agora local to report the restart",
        )
        restarted = wait_for(
            lambda: (pids := _agent_pids(local, host)) and pids != [agent_pid] and pids, 10, "pid"
        )
        assert len(restarted) == 1
        # Back with the master (a kill sent before then would go to the dead agent's link)...
        wait_for(
            lambda: re.search(
                rf"agent_reregistered .*hostname={host}\b",
                (local.work / "logs" / "master.log").read_text(errors="replace"),
            ),
            30,
            f"{host} to re-register",
        )
        # ... with the executor back: a kill goes through it and ends the task.
        killed = wait_for(
            lambda: (out := local.agora("kill", "orphan")).returncode == 0 and out, 30, "kill"
        )
        assert killed.returncode == 0
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        task = wait_for(
            lambda: (t := local.task("orphan")) and t["state"] == "KILLED" and t, 15, "KILLED"
        )
        assert task["agent_id"] == killed_on
        assert local.proc.poll() is None
        log = (local.work / "logs" / "local.log").read_text()
        assert f"event='daemon_restarted' daemon='{host}'" in log, log
        assert local.stop() == 0
        wait_for(lambda: not cluster_pids(local.work), 10, "cluster processes to end")
        assert not (local.home / "master").exists()
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
        _kill_everything(local)
