"""Lending and reclaim on a real cluster, through the batch service's queues (queues are roles).

Queue ``a`` is guaranteed 2 of the agent's 4 cpus. While ``a`` is idle, queue ``b`` borrows all
4 (2 of them on revocable offers); when ``a`` gets work, the master takes back what it is owed:
two of ``b``'s tasks end KILLED with reason RESOURCES_REVOKED and are requeued without spending
a retry, and ``a``'s two tasks run.
"""

from __future__ import annotations

import time
from pathlib import Path

from support.batch import BatchService
from support.cluster import LocalCluster
from support.polling import wait_for

AGENT_ARGS = ("--isolation", "posix")


def test_an_idle_queues_guarantee_is_borrowed_then_taken_back(tmp_path: Path) -> None:
    master_args = (
        "--quota",
        "a:cpus:2",
        "--allocation-interval",
        "0.2",
        "--reclaim-min-runtime",
        "0",
    )
    with LocalCluster(
        tmp_path / "cluster",
        agents=1,
        agent_resources="cpus:4;mem:4096",
        master_args=master_args,
        agent_args=AGENT_ARGS,
    ) as cluster:
        service = BatchService(cluster.endpoint, tmp_path / "queues", args=("--queues", "a,b"))
        service.work_dir.mkdir()
        service.start()
        try:
            task = ("--cpus", "1", "--mem", "64", "--retries", "0", "--", "sleep", "300")
            b = service.submit("-p", "b", "--array", "0-3", *task)
            wait_for(lambda: service.job(b)["tasks"]["RUNNING"] == 4, 30, "b borrows all 4 cpus")
            start = time.monotonic()
            a = service.submit("-p", "a", "--array", "0-1", *task)
            wait_for(lambda: service.job(a)["tasks"]["RUNNING"] == 2, 30, "a's guarantee back")
            took = time.monotonic() - start
            print(f"reclaim: a's two tasks RUNNING {took:.2f} s after the submission")
            # Within a few seconds (sleep ends at once on SIGTERM: no grace period to wait).
            assert took < 5.0, took
            counts = service.job(b)["tasks"]
            assert (counts["RUNNING"], counts["PENDING"]) == (2, 2), counts
            requeued = [t for t in service.tasks(b) if t["state"] == "PENDING"]
            assert len(requeued) == 2
            for record in requeued:
                assert "PREEMPTED" in record["reason"], record
                assert "RESOURCES_REVOKED" in record["reason"], record
                assert record["failures"] == 0 and record["losses"] == 0, record
            for job in (a, b):
                assert service.cli("cancel", str(job)).returncode == 0
                assert service.wait_ended(job)["state"] == "CANCELLED"
        finally:
            service.stop()


def test_a_higher_priority_job_preempts_a_lower_one_in_its_queue(tmp_path: Path) -> None:
    """Slurm's PreemptMode=REQUEUE in one queue: the low-priority job fills the agent, the
    high-priority one waits a second, then two low tasks are stopped and requeued (no retry
    spent) and the high job runs."""
    with LocalCluster(
        tmp_path / "cluster",
        agents=1,
        agent_resources="cpus:2;mem:2048",
        master_args=("--allocation-interval", "0.2"),
        agent_args=AGENT_ARGS,
    ) as cluster:
        args = (
            "--preempt",
            "default=requeue",
            "--preempt-after",
            "1",
            "--preempt-min-runtime",
            "0.1",
        )
        service = BatchService(cluster.endpoint, tmp_path / "prio", args=args)
        service.work_dir.mkdir()
        service.start()
        try:
            task = ("--cpus", "1", "--mem", "64", "--retries", "0", "--", "sleep", "300")
            low = service.submit("--array", "0-1", "--priority", "0", *task)
            wait_for(lambda: service.job(low)["tasks"]["RUNNING"] == 2, 30, "low fills it")
            high = service.submit("--array", "0-1", "--priority", "9", *task)
            wait_for(lambda: service.job(high)["tasks"]["RUNNING"] == 2, 30, "high preempts")
            records = service.tasks(low)
            assert {r["state"] for r in records} == {"PENDING"}
            for record in records:
                assert record["reason"] == f"requeued: PREEMPTED by job {high} (priority 9)"
                assert record["failures"] == 0
            for job in (low, high):
                assert service.cli("cancel", str(job)).returncode == 0
        finally:
            service.stop()
