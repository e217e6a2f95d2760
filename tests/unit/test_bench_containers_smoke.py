"""The containers benchmark still runs a real cluster and prints its JSON line (timings are not
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "containers.py"


def test_containers_benchmark_prints_one_json_line_per_mode() -> None:
    args = ["--containers", "5", "--latency-tasks", "2", "--modes", "posix", "--timeout", "30"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert list(result)[:9] == [
        "mode",
        "isolation",
        "containers",
        "seconds",
        "launches_per_s",
        "accept_to_running_p50_ms",
        "p90_ms",
        "p99_ms",
        "python",
    ]
    assert (result["mode"], result["isolation"], result["containers"]) == ("posix", "posix", 5)
    assert result["seconds"] > 0 and result["launches_per_s"] > 0
    assert 0 < result["accept_to_running_p50_ms"] <= result["p90_ms"] <= result["p99_ms"]
    assert result["failed"] == 0
    assert result["leftovers"] == {}  # every process and cgroup of the cluster is gone
