"""Wall time of the commands a user types, on a quiet local cluster started by ``agora local``.

``agora local --agents 1 --no-batch`` runs with its defaults (CURVE on, keys and the master's
address under a fresh ``$AGORA_HOME``, which the timed commands find as a user's would), then:

- ``agora run -- true``, N times one after the other (wall p50/p99/min/max);
- ``agora --help`` (p50 of ``--help-runs``);
- ``python -c pass`` (p50), the floor of any Python command on this machine, for scale.

Prints one JSON line.

    python tests/bench/latency.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _agora() -> list[str]:
    exe = shutil.which("agora", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "agora.sdk.cli"]


def _time(cmd: list[str], env: dict[str, str], timeout: float) -> float:
    """Seconds of wall time of ``cmd``; it must exit 0."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return wall


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="agora run -- true, N times")
    parser.add_argument("--help-runs", type=int, default=7, help="agora --help, N times")
    parser.add_argument("--timeout", type=float, default=60.0, help="per command, seconds")
    args = parser.parse_args()
    agora = _agora()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agora-latency-", dir=base) as tmp:
        env = {**os.environ, "AGORA_HOME": str(Path(tmp) / "home")}
        for name in ("AGORA_MASTER", "AGORA_CURVE_SECRET_KEY", "AGORA_CURVE_SERVER_KEY"):
            env.pop(name, None)
        local = subprocess.Popen(
            [*agora, "local", "--agents", "1", "--no-batch", "--work-dir", str(Path(tmp) / "work")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert local.stdout is not None
            if not local.stdout.readline().strip():  # its address, once the cluster is up
                raise SystemExit("agora local did not start")
            _time([*agora, "run", "--", "true"], env, args.timeout)  # warm the page cache
            run = [*agora, "run", "--", "true"]
            runs = [_time(run, env, args.timeout) for _ in range(args.runs)]
            helps = [_time([*agora, "--help"], env, args.timeout) for _ in range(args.help_runs)]
            floor = [_time([sys.executable, "-c", "pass"], env, args.timeout) for _ in range(7)]
        finally:
            os.killpg(local.pid, signal.SIGTERM)
            try:
                local.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(local.pid, signal.SIGKILL)
                local.wait()
    result = {
        "runs": args.runs,
        "run_true_p50_ms": _pct(runs, 0.50),
        "run_true_p99_ms": _pct(runs, 0.99),
        "run_true_min_ms": _pct(runs, 0.0),
        "run_true_max_ms": _pct(runs, 1.0),
        "help_p50_ms": _pct(helps, 0.50),
        "python_pass_p50_ms": _pct(floor, 0.50),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
