"""MPI launch overhead: the same 4-rank allreduce job by plain ``mpirun`` on this host and by
``agora mpirun`` across 2 agents of a local cluster (processes, as root: member executors need
their own UTS namespace), wall time of each command from start to exit.

The short job is examples/mpi_allreduce.py; the long one the same allreduce followed by
``--long-seconds`` of sleep in every rank (0: skip it). Each short run is repeated ``--runs``
times and the median kept. Prints one JSON line with both wall times and their ratio.

    python tests/bench/mpi.py [--runs 5] [--long-seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.*

from agora.frameworks.mpi.setup import missing
from support.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
ALLREDUCE = str(ROOT / "examples" / "mpi_allreduce.py")
LONG = (
    "import sys, time; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "assert c.allreduce(1) == c.size; time.sleep(float(sys.argv[1]))"
)
#: The settings agora mpirun gives mpirun, so both runs do the same work.
MCA = {
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[:6]}… failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--long-seconds", type=float, default=60.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: member executors need their own UTS namespace")
    lacking = missing()
    if lacking:
        raise SystemExit("MPI is not installed: " + "; ".join(lacking))
    python = sys.executable
    env = {**os.environ, **MCA, "PATH": f"{Path(python).parent}:{os.environ['PATH']}"}
    plain = ["mpirun", "--oversubscribe", "-n", "4", "--tag-output", python, "-m", "mpi4py"]
    result: dict[str, object] = {"ranks": 4, "agents": 2, "runs": args.runs}
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory(prefix="agora-bench-mpi-", dir=shm) as tmp,
        LocalCluster(Path(tmp), agents=2, agent_resources="cpus:4;mem:4096") as cluster,
    ):
        agora_env = {k: v for k, v in env.items() if not k.startswith("AGORA_")}
        agora_env["AGORA_HOME"] = str(Path(tmp) / "home")
        agora = [
            *(python, "-m", "agora.sdk.cli", "mpirun", "--master", cluster.endpoint),
            *("-n", "4", "--ntasks-per-node", "2", "--", "python", "-m", "mpi4py"),
        ]
        _timed([*agora, ALLREDUCE], agora_env)  # warm the page cache and the agents
        short_plain = [_timed([*plain, ALLREDUCE], env) for _ in range(args.runs)]
        short_agora = [_timed([*agora, ALLREDUCE], agora_env) for _ in range(args.runs)]
        p, a = statistics.median(short_plain), statistics.median(short_agora)
        result["short"] = {
            "plain_mpirun_s": round(p, 3),
            "agora_mpirun_s": round(a, 3),
            "ratio": round(a / p, 2),
            "agora_min_s": round(min(short_agora), 3),
        }
        if args.long_seconds > 0:
            seconds = str(args.long_seconds)
            lp = _timed([*plain, "-c", LONG, seconds], env)
            la = _timed([*agora, "-c", LONG, seconds], agora_env)
            result["long"] = {
                "seconds": args.long_seconds,
                "plain_mpirun_s": round(lp, 3),
                "agora_mpirun_s": round(la, 3),
                "ratio": round(la / lp, 3),
            }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
