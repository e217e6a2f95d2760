"""The simulation's soak: many seeds of one scenario, spread over worker processes; prints JSON.

    .venv/bin/python tests/sim/soak.py --seeds 10000 --workers 2
    .venv/bin/python tests/sim/soak.py --scenario chaos --seeds 200 --first 5000

Each seed is one deterministic run (see tests/support/sim/runner.py). The report gives the seeds
run, every failure with its first line and the command that replays it, wall time, seeds per
minute and simulated seconds per wall-clock second (summed over the workers). The exit status is
1 if any seed failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "sim")]


def _quiet_logs() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def _one(job: tuple[str, int]) -> tuple[int, float, float, str | None]:
    """(seed, simulated seconds, wall seconds, first line of the failure or None)."""
    import test_simulation
    from support.sim.runner import run

    name, seed = job
    factory = test_simulation.SCENARIOS.get(name) or getattr(test_simulation, name)
    started = time.perf_counter()
    try:
        result = run(factory(), seed)
    except AssertionError as exc:
        lines = str(exc).splitlines()
        return seed, 0.0, time.perf_counter() - started, " | ".join(lines[:3])
    return seed, result.end_time, time.perf_counter() - started, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="soak")
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--first", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    jobs = [(args.scenario, seed) for seed in range(args.first, args.first + args.seeds)]
    failures: list[dict[str, object]] = []
    simulated = busy = 0.0
    started = time.perf_counter()
    with multiprocessing.Pool(args.workers, initializer=_quiet_logs) as pool:
        for seed, sim_s, wall_s, error in pool.imap_unordered(_one, jobs, chunksize=8):
            simulated += sim_s
            busy += wall_s
            if error is not None:
                replay = (
                    f"AGORA_SIM_SOAK=1 AGORA_SIM_SEED={seed} .venv/bin/pytest "
                    f"tests/sim/test_simulation.py -k 'test_soak and {args.scenario}-'"
                )
                failures.append({"seed": seed, "error": error, "replay": replay})
    wall = time.perf_counter() - started
    report = {
        "scenario": args.scenario,
        "seeds": args.seeds,
        "first_seed": args.first,
        "workers": args.workers,
        "failed": len(failures),
        "failures": sorted(failures, key=lambda f: int(str(f["seed"])))[:50],
        "wall_s": round(wall, 1),
        "seeds_per_min": round(args.seeds / wall * 60, 1),
        "sim_s_per_wall_s_per_worker": round(simulated / busy, 1) if busy else 0.0,
        "simulated_s": round(simulated),
    }
    print(json.dumps(report, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
