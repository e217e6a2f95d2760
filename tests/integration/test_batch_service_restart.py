"""The batch service SIGKILLed in the middle of an array, restarted on the same job store: every
index runs exactly once; and two users in a contended cluster share it fairly."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.batch import BatchService
from support.cluster import LocalCluster
from support.polling import wait_for


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path / "cluster",
        agents=2,
        agent_resources="cpus:4;mem:4096",
        agent_args=("--isolation", "posix"),
    ) as c:
        yield c


def test_sigkill_mid_array_then_restart_runs_every_index_exactly_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    batch = BatchService(cluster.endpoint, tmp_path / "batch")
    batch.work_dir.mkdir()
    batch.start()
    try:
        job = batch.submit(
            "--array", "0-499", "--cpus", "0.25", "--mem", "8", "--",
            "sh", "-c", f"sleep 0.2; echo $AGORA_ARRAY_INDEX >> {ran}",
        )  # fmt: skip

        def lines() -> int:
            return len(ran.read_text().split()) if ran.exists() else 0

        wait_for(lambda: lines() >= 100, 60, "100 indices done")
        batch.kill()
        assert 100 <= lines() < 500, "the kill must land mid-array"
        batch.start()
        ended = batch.wait_ended(job, timeout=120)
        assert ended["state"] == "COMPLETED"
        counts = Counter(int(i) for i in ran.read_text().split())
        assert sorted(counts) == list(range(500))
        assert set(counts.values()) == {1}, [i for i, n in counts.items() if n > 1]
        tasks = batch.tasks(job)
        assert all(t["state"] == "COMPLETED" for t in tasks)
        history = json.loads(batch.cli("history", "--job", str(job), "--json").stdout)
        assert len(history["records"]) == 500
    finally:
        batch.stop()


#: Two accounts every Linux host has: a job runs as its user, so the two users must exist.
USERS = ("nobody", "daemon")


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as two Unix users needs root")
def test_two_users_with_equal_shares_get_equal_service(
    tmp_path: Path,
) -> None:
    with LocalCluster(
        tmp_path / "cluster",
        agents=2,
        agent_resources="cpus:2;mem:2048",
        agent_args=("--isolation", "posix"),
    ) as cluster:
        batch = BatchService(cluster.endpoint, tmp_path / "batch")
        batch.work_dir.mkdir()
        batch.start()
        try:
            # Both jobs go in back to back through the API (a CLI process each would let the
            # first user's tasks start a second before the second user's job exists).
            jobs = {}
            for user in USERS:
                spec = {
                    "name": f"{user}-work",
                    "user": user,
                    "command": "sleep 0.2",
                    "cpus": 1,
                    "mem": 16,
                    "array": {"ranges": [[0, 99, 1]], "max_running": 0},
                }
                status, reply = batch.call("POST", "/jobs", {"spec": spec})
                assert status == 201, reply
                jobs[user] = int(reply["job_id"])
            for job in jobs.values():
                assert batch.wait_ended(job, timeout=120)["state"] == "COMPLETED"
            starts = {
                user: sorted(t["start_time"] for t in batch.tasks(job))
                for user, job in jobs.items()
            }
            # While both had work queued (from the later first start to the earlier last
            # start), each got about half of the cluster.
            since = max(s[0] for s in starts.values())
            until = min(s[-1] for s in starts.values())
            served = {u: sum(1 for t in s if since <= t <= until) for u, s in starts.items()}
            assert abs(served[USERS[0]] - served[USERS[1]]) <= 0.1 * max(served.values()), served
        finally:
            batch.stop()
