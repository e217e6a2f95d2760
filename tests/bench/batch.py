"""Batch framework throughput: one array of N trivial tasks, submit to last completion.

A local cluster (1 master, 2 agents, as processes; their work dirs on /dev/shm, as in
throughput.py) and the batch service (its job store on disk unless --store-dir says otherwise:
every commit is fsynced). The bench POSTs one array job of ``--tasks`` ``true`` tasks to the
service's HTTP API, waits until the job has ended, stops the service, and then reads the job
store file itself to check that every task's record is there, COMPLETED.

Prints one JSON line: tasks, seconds (from just before the submission to the job's end, as the
service recorded it), tasks_per_s, records (COMPLETED rows found in the store afterwards), and
the CPU seconds each process spent.

    python tests/bench/batch.py --tasks 5000
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.*

from support.batch import BatchService
from support.cluster import LocalCluster
from support.polling import wait_for


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu(cluster: LocalCluster, batch: BatchService) -> dict[str, float]:
    out = {"batch_service": 0.0, "master": 0.0, "agents": 0.0, "executors": 0.0}
    if batch.proc is not None:
        out["batch_service"] = _cpu_seconds(batch.proc.pid)
    if cluster.master is not None:
        out["master"] = _cpu_seconds(cluster.master.pid)
    out["agents"] = sum(_cpu_seconds(p.pid) for p in cluster.agent_procs)
    for pid_file in cluster.work_dir.glob("agent-*/frameworks/*/executors/*/executor.pid"):
        out["executors"] += _cpu_seconds(int(pid_file.read_text()))
    return out


def _completed_in_store(store: Path, job_id: int) -> int:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE job_id = ? AND state = 'COMPLETED'", (job_id,)
        ).fetchone()
        return int(count)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--agent-resources", default="cpus:64;mem:65536;disk:1024")
    parser.add_argument(
        "--isolation", default="posix", help="the agents' --isolation (posix, or auto)"
    )
    parser.add_argument("--store-dir", help="where the job store goes (default: a disk temp dir)")
    args = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory(prefix="agora-bench-", dir=shm) as tmp,
        tempfile.TemporaryDirectory(prefix="agora-bench-store-", dir=args.store_dir) as disk,
    ):
        cluster = LocalCluster(
            Path(tmp) / "cluster",
            agents=2,
            agent_resources=args.agent_resources,
            agent_args=("--isolation", args.isolation),
        )
        with cluster:
            batch = BatchService(cluster.endpoint, Path(disk))
            batch.start()
            try:
                spec = {
                    "name": "bench",
                    "user": pwd.getpwuid(os.geteuid()).pw_name,  # a job runs as its user
                    "command": "true",
                    "cpus": 0.01,
                    "mem": 1,
                    "array": {"ranges": [[0, args.tasks - 1, 1]], "max_running": 0},
                }
                cpu_before = _cpu(cluster, batch)
                submitted = time.time()
                status, reply = batch.call("POST", "/jobs", {"spec": spec})
                assert status == 201, reply
                job_id = int(reply["job_id"])
                job = wait_for(
                    lambda: (j := batch.job(job_id))["state"] not in ("PENDING", "RUNNING") and j,
                    args.timeout,
                    "the array to end",
                )
                cpu_after = _cpu(cluster, batch)
            finally:
                batch.stop()
            records = _completed_in_store(Path(disk) / "store" / "jobs.sqlite", job_id)
    seconds = float(job["end_time"]) - submitted
    result = {
        "tasks": args.tasks,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(args.tasks / seconds, 1),
        "state": job["state"],
        "records": records,
        "isolation": args.isolation,
        "cpu_seconds": {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_after},
    }
    print(json.dumps(result))
    return 0 if job["state"] == "COMPLETED" and records == args.tasks else 1


if __name__ == "__main__":
    sys.exit(main())
