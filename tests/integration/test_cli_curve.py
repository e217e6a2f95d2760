"""The `agora` CLI against a real CURVE master and agent (processes, ephemeral ports).

Keys come from `agora keys generate`. The master admits agent-1, ops and fw (their public keys are
in its authorized-keys directory), not rogue; its ACL lets agent-1 register, ops make operator
calls and fw (only) subscribe with the default role. Every CLI command runs as its own process,
bounded in time; the master, the agent and whatever the agent started are killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from support.procs import marked, stop

AGORA = (sys.executable, "-m", "agora.sdk.cli")
CMD_TIMEOUT = 60.0  # seconds any one CLI command may take, at most
START_TIMEOUT = 30.0  # seconds for the master to bind and the agent to register
#: Marks every process these tests start (executors and tasks inherit it), to sweep them up.
MARK = "CLI_CURVE_TEST_MARK"


@dataclass
class CurveCluster:
    endpoint: str
    keys: Path
    env: dict[str, str]
    master_log: Path
    agent_log: Path

    def agora(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = CMD_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AGORA, *args],
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def as_(self, principal: str, server: str = "master") -> tuple[str, ...]:
        """The CURVE flags (and --master) of a client holding ``principal``'s key."""
        return (
            *("--master", self.endpoint),
            *("--curve-secret-key", str(self.keys / f"{principal}.key_secret")),
            *("--curve-server-key", str(self.keys / f"{server}.key")),
        )

    def logs(self) -> str:
        parts = []
        for path in (self.master_log, self.agent_log):
            with contextlib.suppress(OSError):
                parts.append(f"---- {path.name} ----\n{path.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)


def _clean_env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env[MARK] = mark
    return env


def _generate(env: dict[str, str], keys: Path, name: str) -> None:
    out = subprocess.run(
        [*AGORA, "keys", "generate", name, "--dir", str(keys)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    assert str(keys / f"{name}.key") in out.stdout
    assert str(keys / f"{name}.key_secret") in out.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CurveCluster]:
    tmp = tmp_path_factory.mktemp("cli-curve")
    mark = uuid.uuid4().hex
    env = _clean_env(mark)
    keys, authorized = tmp / "keys", tmp / "authorized"
    for name in ("master", "agent-1", "ops", "fw", "rogue"):
        _generate(env, keys, name)
    authorized.mkdir()
    for name in ("agent-1", "ops", "fw"):  # not rogue
        shutil.copy(keys / f"{name}.key", authorized / f"{name}.key")
    acl = tmp / "acl.toml"
    acl.write_text(
        'agents = ["agent-1"]\noperators = ["ops"]\n[roles]\nfw = ["*"]\n"*" = []\n',
        encoding="utf-8",
    )
    endpoint_file = tmp / "master.endpoint"
    master_log, agent_log = tmp / "master.log", tmp / "agent.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(master_log, "wb") as log:
            master = subprocess.Popen(
                [
                    *(sys.executable, "-m", "agora.master.server"),
                    *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(endpoint_file)),
                    *("--work-dir", str(tmp / "master-work")),
                    *("--curve-secret-key", str(keys / "master.key_secret")),
                    *("--curve-authorized-keys", str(authorized), "--acl", str(acl)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append(master)

        def bound() -> str | None:
            if master.poll() is not None:
                raise AssertionError(f"master exited {master.returncode}: {master_log.read_text()}")
            with contextlib.suppress(OSError):
                return endpoint_file.read_text().strip() or None
            return None

        endpoint = wait_for(bound, START_TIMEOUT, "the master's endpoint file")
        with open(agent_log, "wb") as log:
            agent = subprocess.Popen(
                [
                    *(sys.executable, "-m", "agora.agent.server", "--master", endpoint),
                    *("--work-dir", str(tmp / "agent-work"), "--hostname", "agent-1"),
                    *("--resources", "cpus:2;mem:1024;disk:1024"),
                    *("--executor-bind", "tcp://127.0.0.1:0"),
                    "--allow-root-tasks",  # `agora run` runs as the invoking user: root here
                    *("--curve-secret-key", str(keys / "agent-1.key_secret")),
                    *("--curve-server-key", str(keys / "master.key")),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append(agent)
        yield CurveCluster(endpoint, keys, env, master_log, agent_log)
    finally:
        for proc in reversed(procs):  # the agent first: it stops its executors and tasks
            stop(proc)
        for pid in marked(MARK, mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _state(cluster: CurveCluster, *args: str) -> dict[str, Any] | None:
    out = cluster.agora("state", "--json", *args, "--timeout", "5")
    assert out.returncode == 0, f"{out.stderr}\n{cluster.logs()}"
    state: dict[str, Any] = json.loads(out.stdout)
    return state


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


# ------------------------------------------------------------------ admitted


def test_state_with_the_operator_key_lists_the_agent(cluster: CurveCluster) -> None:
    def agent_active() -> dict[str, Any] | None:
        state = _state(cluster, *cluster.as_("ops"))
        assert state is not None
        return next(
            (a for a in state["agents"] if a["hostname"] == "agent-1" and a["status"] == "ACTIVE"),
            None,
        )

    agent = wait_for(agent_active, START_TIMEOUT, f"agent-1 ACTIVE\n{cluster.logs()}")
    assert agent["resources"]["cpus"] == 2


def test_the_keys_may_come_from_the_environment(cluster: CurveCluster) -> None:
    env = dict(cluster.env)
    env["AGORA_CURVE_SECRET_KEY"] = str(cluster.keys / "ops.key_secret")
    env["AGORA_CURVE_SERVER_KEY"] = str(cluster.keys / "master.key")
    out = cluster.agora("agents", "--json", "--master", cluster.endpoint, env=env)
    assert out.returncode == 0, out.stderr
    assert isinstance(json.loads(out.stdout), list)
    # half a pair is a usage error, before any connection
    del env["AGORA_CURVE_SERVER_KEY"]
    out = cluster.agora("agents", "--master", cluster.endpoint, env=env)
    assert out.returncode == 2
    assert "--curve-server-key" in _one_line(out)


def test_run_with_an_admitted_framework_key_prints_its_output(cluster: CurveCluster) -> None:
    test_state_with_the_operator_key_lists_the_agent(cluster)  # the agent is up
    out = cluster.agora("run", *cluster.as_("fw"), "--timeout", "30", "--", "echo", "hi")
    assert (out.returncode, out.stdout) == (0, "hi\n"), f"{out.stderr}\n{cluster.logs()}"


def test_run_with_a_key_whose_roles_are_denied_exits_1(cluster: CurveCluster) -> None:
    t0 = time.monotonic()
    out = cluster.agora("run", *cluster.as_("ops"), "--timeout", "20", "--", "true")
    assert out.returncode == 1
    line = _one_line(out)
    assert "forbidden" in line and "'*'" in line, line
    assert time.monotonic() - t0 < 15


# ------------------------------------------------------------------ refused


@pytest.mark.parametrize("command", [("state",), ("agents", "--json"), ("kill", "t1")])
def test_no_keys_is_one_line_and_exit_1_within_the_timeout(
    cluster: CurveCluster, command: tuple[str, ...]
) -> None:
    t0 = time.monotonic()
    out = cluster.agora(*command, "--master", cluster.endpoint, "--timeout", "3")
    assert time.monotonic() - t0 < 3 + 5  # the timeout, and the interpreter's start-up
    assert out.returncode == 1
    line = _one_line(out)
    assert "requires CURVE" in line and "--curve-secret-key" in line, line


def test_run_without_keys_is_one_line_and_exit_1(cluster: CurveCluster) -> None:
    t0 = time.monotonic()
    out = cluster.agora("run", "--master", cluster.endpoint, "--timeout", "10", "--", "true")
    assert out.returncode == 1
    assert "requires CURVE" in _one_line(out)
    assert time.monotonic() - t0 < 10 + 5


@pytest.mark.parametrize(
    ("command", "tail"), [("state", ()), ("kill", ("t1",)), ("run", ("--", "true"))]
)
def test_an_unlisted_key_is_rejected_in_one_line(
    cluster: CurveCluster, command: str, tail: tuple[str, ...]
) -> None:
    t0 = time.monotonic()
    out = cluster.agora(command, *cluster.as_("rogue"), "--timeout", "5", *tail)
    assert time.monotonic() - t0 < 5 + 5
    assert out.returncode == 1
    line = _one_line(out)
    assert "rejected" in line and "authentication failed" in line, line


def test_a_wrong_server_key_is_one_line_and_exit_1(cluster: CurveCluster) -> None:
    t0 = time.monotonic()
    out = cluster.agora("state", *cluster.as_("ops", server="rogue"), "--timeout", "3")
    assert time.monotonic() - t0 < 3 + 5
    assert out.returncode == 1
    line = _one_line(out)
    assert "handshake" in line and "--curve-server-key" in line, line


def test_keys_for_a_master_without_curve_are_one_line_and_exit_1(
    cluster: CurveCluster, tmp_path: Path
) -> None:
    endpoint_file = tmp_path / "plain.endpoint"
    with open(tmp_path / "plain.log", "wb") as log:
        plain = subprocess.Popen(
            [
                *(sys.executable, "-m", "agora.master.server"),
                *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(endpoint_file)),
                *("--work-dir", str(tmp_path / "plain-work"), "--insecure"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=cluster.env,
            start_new_session=True,
        )
    try:

        def bound() -> str | None:
            assert plain.poll() is None, (tmp_path / "plain.log").read_text()
            with contextlib.suppress(OSError):
                return endpoint_file.read_text().strip() or None
            return None

        endpoint = wait_for(bound, START_TIMEOUT, "the plain master's endpoint file")
        flags = cluster.as_("ops")[2:]  # the CURVE flags, without --master
        t0 = time.monotonic()
        out = cluster.agora("state", "--master", endpoint, *flags, "--timeout", "3")
        assert time.monotonic() - t0 < 3 + 5
        assert out.returncode == 1
        line = _one_line(out)
        assert "CURVE" in line and endpoint in line, line
        # and without the keys, the same master answers
        assert cluster.agora("state", "--master", endpoint, "--json").returncode == 0
    finally:
        stop(plain)
