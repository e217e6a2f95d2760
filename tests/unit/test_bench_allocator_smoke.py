"""The allocator benchmark still runs and prints its JSON line (timings are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "allocator.py"


def test_allocator_benchmark_prints_one_json_line() -> None:
    args = ["--agents", "60", "--frameworks", "7", "--rounds", "2", "--samples", "50"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert list(result)[:5] == [
        "agents",
        "frameworks",
        "full_cycle_ms",
        "event_alloc_p50_us",
        "event_alloc_p99_us",
    ]
    assert (result["agents"], result["frameworks"]) == (60, 7)
    assert result["offers_per_cycle"] == 60  # every framework wants everything: one offer per agent
    assert result["samples"] == 50


def test_with_reclaim_it_lends_and_plans_what_the_claimant_is_owed() -> None:
    args = ["--agents", "60", "--frameworks", "7", "--rounds", "2", "--samples", "20", "--reclaim"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(done.stdout)
    assert result["reclaim_need"]["claim"]["cpus"] > 0  # its guarantee was lent: nothing free
    assert result["reclaim_victims"] > 0
