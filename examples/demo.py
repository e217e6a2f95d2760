"""`make demo`: a local cluster with 2 agents, the quickstart framework running 20 tasks, the
table, one frame of `agora top` and the master's task metrics, then a batch job: an array of 10
tasks submitted, waited for and accounted, then (as root, with Open MPI) a 4-rank MPI job across
the two agents.

Starts `agora local` (which also runs the batch service) as a child process, waits until it has
written the master's address, runs examples/quickstart.py against it, shows `agora tasks --all`,
submits `agora batch submit --array 0-9`, waits for it, shows one task's output and the
accounting (`agora batch history`), and stops the cluster (no process is left behind, even on
Ctrl-C). Exits non-zero if any step fails.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = 20
START_TIMEOUT = 60.0


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="agora-demo-") as tmp:
        env = dict(os.environ, AGORA_HOME=str(Path(tmp) / "home"))
        agora = [sys.executable, "-m", "agora.sdk.cli"]
        print(f"$ agora local --agents 2 --work-dir {tmp}/cluster", flush=True)
        cluster = subprocess.Popen(
            [*agora, "local", "--agents", "2", "--work-dir", f"{tmp}/cluster"], env=env
        )
        try:
            address_file = Path(env["AGORA_HOME"]) / "master"
            deadline = time.monotonic() + START_TIMEOUT
            while not address_file.exists():
                if cluster.poll() is not None or time.monotonic() > deadline:
                    print("demo: the local cluster did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
            print(f"$ python examples/quickstart.py {TASKS}", flush=True)
            run = subprocess.run(
                [sys.executable, str(HERE / "quickstart.py"), str(TASKS)], env=env, timeout=300
            )
            print("$ agora tasks --all", flush=True)
            table = subprocess.run([*agora, "tasks", "--all"], env=env, timeout=60)
            return (
                run.returncode
                or table.returncode
                or operator_demo(agora, env)
                or batch_demo(agora, env)
                or mpi_demo(agora, env)
            )
        finally:
            if cluster.poll() is None:
                cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
            print("demo: cluster stopped", flush=True)


def operator_demo(agora: list[str], env: dict[str, str]) -> int:
    """One frame of the operator's console, and the master's Prometheus metrics for tasks."""
    print("$ agora top --once", flush=True)
    top = subprocess.run([*agora, "top", "--once"], env=env, timeout=60)
    home = Path(env["AGORA_HOME"])
    url = (home / "master.http").read_text().split(",")[0].strip()
    # Everything but /health needs the operator token `agora local` wrote (0600, this user's).
    token = (home / "keys" / "operator.token").read_text().strip()
    print(
        f'$ curl -s -H "Authorization: Bearer $(cat {home}/keys/operator.token)" {url}/metrics'
        " | grep '^agora_master_tasks{' | grep -v ' 0.0$'",
        flush=True,
    )
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        metrics = resp.read().decode()
    wanted = [
        line
        for line in metrics.splitlines()
        if line.startswith("agora_master_tasks{") and not line.endswith(" 0.0")
    ]
    print("\n".join(wanted), flush=True)
    return top.returncode


def batch_demo(agora: list[str], env: dict[str, str]) -> int:
    """An array job through the batch service that `agora local` started."""
    words = ["--name", "hello", "--array", "0-9", "--cpus", "0.25", "--mem", "32", "--"]
    words += ["sh", "-c", "echo task $AGORA_ARRAY_INDEX of job $AGORA_JOB_ID on $(hostname)"]
    print(f"$ agora batch submit {shlex.join(words)}", flush=True)
    submit = subprocess.run(
        [*agora, "batch", "submit", *words], env=env, timeout=60, capture_output=True, text=True
    )
    print(submit.stdout + submit.stderr, end="", flush=True)
    if submit.returncode != 0:
        return submit.returncode
    job = submit.stdout.split()[-1]
    for step in (["wait", job], ["logs", f"{job}.3"], ["history", "--job", job]):
        print(f"$ agora batch {' '.join(step)}", flush=True)
        done = subprocess.run([*agora, "batch", *step], env=env, timeout=120)
        if done.returncode != 0:
            return done.returncode
    return 0


def mpi_demo(agora: list[str], env: dict[str, str]) -> int:
    """A 4-rank MPI job across the two agents, when this machine can run one (as root: member
    executors need host names of their own on one machine; Open MPI and mpi4py installed)."""
    from agora.frameworks.mpi.setup import missing

    if os.geteuid() != 0 or missing():
        print("demo: skipping the MPI job (needs root, Open MPI and mpi4py)", flush=True)
        return 0
    words = ["-n", "4", "--ntasks-per-node", "2", "--", "python", "-m", "mpi4py"]
    words.append(str(HERE / "mpi_allreduce.py"))
    print(f"$ agora mpirun {shlex.join(words)}", flush=True)
    return subprocess.run([*agora, "mpirun", *words], env=env, timeout=300).returncode


if __name__ == "__main__":
    sys.exit(main())
