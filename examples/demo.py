"""`make demo`: a local cluster with 2 agents, the quickstart framework running 20 tasks, the table.

Starts `agora local` as a child process, waits until it has written the master's address, runs
examples/quickstart.py against it, shows `agora tasks --all`, and stops the cluster (no process is
left behind, even on Ctrl-C). Exits non-zero if any step fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
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
            return run.returncode or table.returncode
        finally:
            if cluster.poll() is None:
                cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
            print("demo: cluster stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
