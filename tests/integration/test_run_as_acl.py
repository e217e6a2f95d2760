"""Who may run as whom, on real daemons: a CURVE master whose ACL maps principals to Unix users,
and an agent started without --allow-root-tasks (the default).

``mallory`` may run tasks only as ``nobody``: her tasks as ``root`` and as ``alice`` end
TASK_ERROR (reason TASK_UNAUTHORIZED, naming the ACL rule) and the master logs the refusal, while
her task as ``nobody`` runs (``id -un`` prints it). ``ops`` may run as anyone, so the master lets
its root task through, and the agent refuses it (naming --allow-root-tasks) and logs that.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.polling import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running tasks as nobody needs root")

AGORA = (sys.executable, "-m", "agora.sdk.cli")
CMD_TIMEOUT = 60.0
START_TIMEOUT = 30.0
ACL = """\
agents = ["agent-1"]
[run_as]
mallory = ["nobody"]
ops = ["*"]
"""


@dataclass
class Cluster:
    endpoint: str
    keys: Path
    env: dict[str, str]
    master_log: Path
    agent_log: Path

    def run(self, principal: str, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(*AGORA, "run", "--master", self.endpoint, "--timeout", "30"),
                *("--curve-secret-key", str(self.keys / f"{principal}.key_secret")),
                *("--curve-server-key", str(self.keys / "master.key")),
                *("--user", user, "--", *argv),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT,
        )

    def logs(self) -> str:
        return "\n".join(
            f"---- {p.name} ----\n{p.read_text(errors='replace')[-6000:]}"
            for p in (self.master_log, self.agent_log)
            if p.exists()
        )


def _stop(proc: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(how)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("run-as")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    keys, authorized = tmp / "keys", tmp / "authorized"
    authorized.mkdir()
    for name in ("master", "agent-1", "mallory", "ops"):
        subprocess.run(
            [*AGORA, "keys", "generate", name, "--dir", str(keys)],
            env=env,
            check=True,
            capture_output=True,
            timeout=CMD_TIMEOUT,
        )
        if name != "master":
            shutil.copy(keys / f"{name}.key", authorized / f"{name}.key")
    acl = tmp / "acl.toml"
    acl.write_text(ACL, encoding="utf-8")
    os.chmod(tmp, 0o755)  # the sandbox of a task run as nobody lies below
    endpoint_file = tmp / "master.endpoint"
    master_log, agent_log = tmp / "master.log", tmp / "agent.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master = _spawn(
            [
                *(sys.executable, "-m", "agora.master.server"),
                *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(endpoint_file)),
                *("--work-dir", str(tmp / "master-work")),
                *("--curve-secret-key", str(keys / "master.key_secret")),
                *("--curve-authorized-keys", str(authorized), "--acl", str(acl)),
            ],
            master_log,
            env,
        )
        procs.append(master)

        def bound() -> str | None:
            assert master.poll() is None, master_log.read_text()
            with contextlib.suppress(OSError):
                return endpoint_file.read_text().strip() or None
            return None

        endpoint = wait_for(bound, START_TIMEOUT, "the master's endpoint file")
        agent = _spawn(
            [
                *(sys.executable, "-m", "agora.agent.server", "--master", endpoint),
                *("--work-dir", str(tmp / "agent-work"), "--hostname", "agent-1"),
                *("--resources", "cpus:2;mem:1024;disk:1024", "--isolation", "posix"),
                *("--executor-bind", "tcp://127.0.0.1:0", "--http-port", "0"),
                *("--curve-secret-key", str(keys / "agent-1.key_secret")),
                *("--curve-server-key", str(keys / "master.key")),
            ],
            agent_log,
            env,
        )
        procs.append(agent)
        yield Cluster(endpoint, keys, env, master_log, agent_log)
    finally:
        # The agent first, with SIGUSR1: it then kills its executors and tasks (SIGTERM would
        # leave them running for the next agent on its work dir to adopt).
        for proc in reversed(procs):
            _stop(proc, signal.SIGUSR1 if proc is not procs[0] else signal.SIGTERM)


def _refused(out: subprocess.CompletedProcess[str], cluster: Cluster) -> str:
    assert out.returncode == 1, f"{out.stdout}\n{out.stderr}\n{cluster.logs()}"
    assert "TASK_UNAUTHORIZED" in out.stderr and "ERROR" in out.stderr, out.stderr
    assert out.stdout == ""
    return out.stderr


def test_a_permitted_user_runs_the_task(cluster: Cluster) -> None:
    pwd.getpwnam("nobody")
    out = cluster.run("mallory", "nobody", "id", "-un")
    assert (out.returncode, out.stdout) == (0, "nobody\n"), f"{out.stderr}\n{cluster.logs()}"


@pytest.mark.parametrize("user", ["root", "alice"])
def test_a_user_the_acl_does_not_allow_is_refused_and_logged(cluster: Cluster, user: str) -> None:
    err = _refused(cluster.run("mallory", user, "id", "-un"), cluster)
    assert f"principal 'mallory' may not run tasks as user '{user}'" in err

    def logged() -> bool:
        log = cluster.master_log.read_text(errors="replace")
        return any(
            "task_unauthorized" in line and "mallory" in line and f"'{user}'" in line
            for line in log.splitlines()
        )

    wait_for(logged, 10.0, f"the master's task_unauthorized warning\n{cluster.logs()}")


def test_the_agent_refuses_root_the_acl_allows_and_logs_it(cluster: Cluster) -> None:
    err = _refused(cluster.run("ops", "root", "id", "-un"), cluster)
    assert "--allow-root-tasks" in err

    def logged() -> bool:
        log = cluster.agent_log.read_text(errors="replace")
        return any(
            "task_unauthorized" in line and "--allow-root-tasks" in line
            for line in log.splitlines()
        )

    wait_for(logged, 10.0, f"the agent's task_unauthorized warning\n{cluster.logs()}")
