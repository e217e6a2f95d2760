"""Secure by default: a master or an agent without CURVE refuses to start (exit 2, one line saying
what to give) unless told --insecure; started so, it says so loudly (`running_insecure`), the
master's state carries it (`agora state` prints INSECURE), and a user whose $AGORA_HOME holds
keys reaches it with AGORA_INSECURE=1 (and `agora top` shows it INSECURE)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agora.sdk.cli.cluster import free_ports
from agora.sdk.cli.local_keys import ensure_local_keys
from support.polling import wait_for

MASTER = (sys.executable, "-m", "agora.master.server")
AGENT = (sys.executable, "-m", "agora.agent.server")
AGORA = (sys.executable, "-m", "agora.sdk.cli")
DEADLINE = 30.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env.update(extra)
    return env


@contextlib.contextmanager
def _daemon(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def _event(log: Path, name: str) -> Callable[[], dict[str, Any] | None]:
    """A poll for the first JSON log line of event ``name`` in ``log``."""

    def find() -> dict[str, Any] | None:
        for line in log.read_text().splitlines():
            if f'"{name}"' in line:
                event: dict[str, Any] = json.loads(line)
                return event
        return None

    return find


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_keyless_master_and_a_keyless_agent_exit_2_naming_what_to_give(tmp_path: Path) -> None:
    master = [*MASTER, "--bind", "tcp://127.0.0.1:0", "--work-dir", str(tmp_path / "m")]
    agent = [*AGENT, "--master", "tcp://127.0.0.1:1", "--work-dir", str(tmp_path / "a")]
    for argv, prog, keys in (
        (master, "agora-master", "--curve-authorized-keys"),
        (agent, "agora-agent", "--curve-server-key"),
    ):
        done = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=DEADLINE)
        assert done.returncode == 2, done
        line = _one_line(done)
        assert line.startswith(f"{prog}: error: CURVE is off"), line
        assert "--curve-secret-key" in line and keys in line and "--insecure" in line, line
    assert not (tmp_path / "m").exists() and not (tmp_path / "a" / "meta").exists()


def test_a_group_without_curve_refuses_to_start_unless_insecure(tmp_path: Path) -> None:
    group = ",".join(f"tcp://127.0.0.1:{p}" for p in free_ports(3))
    first = group.split(",")[0]
    argv = [*MASTER, "--bind", first, "--masters", group, "--work-dir", str(tmp_path / "m")]
    refused = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=DEADLINE)
    assert refused.returncode == 2, refused
    assert "--insecure" in refused.stderr and "CURVE is off" in refused.stderr
    log = tmp_path / "insecure.log"
    with _daemon([*argv, "--insecure"], log) as proc:
        wait_for(lambda: "running_insecure" in log.read_text(), 20, "running_insecure logged")
        assert proc.poll() is None


def test_an_insecure_cluster_says_so_and_a_user_with_keys_reaches_it_with_agora_insecure(
    tmp_path: Path,
) -> None:
    endpoint_file = tmp_path / "master.endpoint"
    master_log, agent_log = tmp_path / "master.log", tmp_path / "agent.log"
    master_argv = [
        *MASTER,
        *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(endpoint_file)),
        *("--work-dir", str(tmp_path / "m"), "--log-format", "json", "--insecure"),
    ]
    with _daemon(master_argv, master_log) as master:

        def bound() -> str | None:
            assert master.poll() is None, master_log.read_text()
            with contextlib.suppress(OSError):
                return endpoint_file.read_text().strip() or None
            return None

        endpoint = wait_for(bound, DEADLINE, "the master's endpoint file")
        agent_argv = [
            *(*AGENT, "--master", endpoint, "--work-dir", str(tmp_path / "a")),
            *("--hostname", "agent-1", "--isolation", "posix", "--log-format", "json"),
            *("--resources", "cpus:1;mem:256;disk:256", "--insecure"),
        ]
        with _daemon(agent_argv, agent_log) as agent:
            for log in (master_log, agent_log):
                event = wait_for(
                    _event(log, "running_insecure"), DEADLINE, f"running_insecure in {log.name}"
                )
                assert event["level"] == "warning" and event["insecure_flag"] is True, event
            # This user has keys (an `agora local` of their own): by default the CLI uses them,
            # and the keyless master refuses the handshake, in one line that names the way out.
            home = tmp_path / "home"
            ensure_local_keys(home / "keys")
            user = _env(AGORA_HOME=str(home))
            state = [*AGORA, "state", "--master", endpoint, "--timeout", "5"]
            done = subprocess.run(state, capture_output=True, text=True, env=user, timeout=60)
            assert done.returncode == 1, done
            assert "AGORA_INSECURE=1" in _one_line(done)
            insecure = {**user, "AGORA_INSECURE": "1"}

            def agent_registered() -> dict[str, object] | None:
                out = subprocess.run(
                    [*state, "--json"], capture_output=True, text=True, env=insecure, timeout=60
                )
                assert out.returncode == 0, out.stderr
                doc: dict[str, object] = json.loads(out.stdout)
                return doc if doc["agents"] else None

            doc = agent_registered() or wait_for(agent_registered, DEADLINE, "the agent")
            assert doc["insecure"] is True
            shown = subprocess.run(state, capture_output=True, text=True, env=insecure, timeout=60)
            assert shown.returncode == 0, shown.stderr
            assert "INSECURE (no CURVE)" in shown.stdout.splitlines()[0], shown.stdout
            top = [*AGORA, "top", "--once", "--master", endpoint, "--timeout", "5"]
            frame = subprocess.run(top, capture_output=True, text=True, env=insecure, timeout=60)
            assert frame.returncode == 0, frame.stderr
            assert "INSECURE (no CURVE)" in frame.stdout.splitlines()[0], frame.stdout
            assert agent.poll() is None and master.poll() is None
