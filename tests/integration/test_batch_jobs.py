"""The batch framework end to end: a real cluster, the batch service, `agora batch` commands."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.batch import BatchService
from support.cluster import LocalCluster
from support.polling import wait_for

AGENT_ARGS = ("--isolation", "posix", "--attributes", "zone:west")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path / "cluster", agents=2, agent_resources="cpus:4;mem:4096", agent_args=AGENT_ARGS
    ) as c:
        yield c


@pytest.fixture
def batch(cluster: LocalCluster, tmp_path: Path) -> Iterator[BatchService]:
    service = BatchService(cluster.endpoint, tmp_path / "batch")
    service.work_dir.mkdir()
    service.start()
    try:
        yield service
    finally:
        service.stop()


def test_an_array_of_200_tasks_completes_with_one_accounting_record_each(
    batch: BatchService,
) -> None:
    job = batch.submit(
        "--array",
        "0-199",
        "--cpus",
        "0.25",
        "--mem",
        "16",
        "--",
        "sh",
        "-c",
        "echo i=$AGORA_ARRAY_INDEX",
    )
    waited = batch.cli("wait", str(job))
    assert waited.returncode == 0, waited.stderr
    assert f"job {job} COMPLETED" in waited.stdout + waited.stderr
    assert "200/200" in waited.stderr  # the progress it showed on the way
    history = batch.cli("history", "--job", str(job), "--json")
    records = json.loads(history.stdout)["records"]
    assert sorted(r["index"] for r in records) == list(range(200))
    for record in records:
        assert record["state"] == "COMPLETED" and record["exit_code"] == 0
        assert record["start_time"] <= record["end_time"]
        assert record["hostname"] in ("agent-0", "agent-1")
        assert record["attempt"] == 1


def test_a_dependency_chain_runs_in_order_and_a_broken_one_fails_fast(
    batch: BatchService, tmp_path: Path
) -> None:
    trail = tmp_path / "trail"
    a = batch.submit("--name", "A", "--", "sh", "-c", f"sleep 0.5; echo A >> {trail}")
    b = batch.submit("-d", f"afterok:{a}", "--", "sh", "-c", f"echo B >> {trail}")
    c = batch.submit("-d", f"afterok:{b}", "--", "sh", "-c", f"echo C >> {trail}")
    not_a = batch.submit("-d", f"afternotok:{a}", "--", "sh", "-c", f"echo X >> {trail}")
    failing = batch.submit("--", "sh", "-c", "exit 3")
    after_failure = batch.submit(
        "-d", f"afternotok:{failing}", "--", "sh", "-c", f"echo F >> {trail}"
    )
    broken = batch.submit("-d", f"afterok:{failing}", "--", "sh", "-c", f"echo Y >> {trail}")
    assert batch.wait_ended(c)["state"] == "COMPLETED"
    assert batch.wait_ended(after_failure)["state"] == "COMPLETED"
    for never in (not_a, broken):
        job = batch.wait_ended(never)
        assert job["state"] == "FAILED"
        assert job["reason"].startswith("DependencyNeverSatisfied")
        assert [t["state"] for t in batch.tasks(never)] == ["CANCELLED"]
    lines = trail.read_text().split()
    assert lines.index("A") < lines.index("B") < lines.index("C")
    assert "F" in lines and "X" not in lines and "Y" not in lines
    assert batch.cli("wait", str(broken)).returncode == 1


def test_a_task_over_its_time_limit_ends_timeout(batch: BatchService) -> None:
    job = batch.submit("--time", "1s", "--retries", "2", "--", "sleep", "60")
    started = time.monotonic()
    waited = batch.cli("wait", str(job))
    assert waited.returncode == 124, waited.stderr
    assert time.monotonic() - started < 20
    [task] = batch.tasks(job)
    assert task["state"] == "TIMEOUT" and task["attempt"] == 1  # a timeout is not retried


def test_a_failing_task_is_retried_up_to_its_limit_then_failed(
    batch: BatchService, tmp_path: Path
) -> None:
    tries = tmp_path / "tries"
    job = batch.submit("--retries", "2", "--", "sh", "-c", f"echo x >> {tries}; exit 3")
    waited = batch.cli("wait", str(job))
    assert waited.returncode == 3, waited.stderr
    assert tries.read_text().count("x") == 3
    [task] = batch.tasks(job)
    assert (task["state"], task["attempt"], task["failures"]) == ("FAILED", 3, 3)


def test_cancel_of_a_running_array_stops_it_and_queues_no_more(batch: BatchService) -> None:
    job = batch.submit("--array", "0-49%4", "--cpus", "0.5", "--", "sleep", "60")
    wait_for(lambda: batch.job(job)["tasks"]["RUNNING"] == 4, 30, "4 running tasks of the array")
    cancelled = batch.cli("cancel", str(job))
    assert cancelled.returncode == 0, cancelled.stderr
    assert "50" in cancelled.stdout  # 4 stopped, 46 dropped
    ended = batch.wait_ended(job, timeout=30)
    assert ended["state"] == "CANCELLED"
    states = Counter(t["state"] for t in batch.tasks(job))
    assert states == {"CANCELLED": 50}
    assert all(t["attempt"] <= 1 for t in batch.tasks(job))
    assert sum(t["attempt"] for t in batch.tasks(job)) == 4  # nothing launched after the cancel
    assert batch.cli("wait", str(job)).returncode == 130


def test_cancel_of_one_array_index(batch: BatchService) -> None:
    job = batch.submit("--array", "0-2", "--", "sleep", "60")
    wait_for(lambda: batch.job(job)["tasks"]["RUNNING"] == 3, 30, "3 running tasks")
    assert batch.cli("cancel", f"{job}.1").returncode == 0
    wait_for(lambda: batch.job(job)["tasks"]["CANCELLED"] == 1, 30, "index 1 cancelled")
    assert batch.job(job)["tasks"]["RUNNING"] == 2
    assert batch.cli("cancel", str(job)).returncode == 0
    assert batch.wait_ended(job)["state"] == "CANCELLED"


def test_a_gang_job_starts_all_its_tasks_together(batch: BatchService, tmp_path: Path) -> None:
    marks = tmp_path / "gang"
    marks.mkdir()
    job = batch.submit(
        "--ntasks", "4", "--ntasks-per-node", "2", "--cpus", "1", "--",
        "sh", "-c", f"date +%s.%N > {marks}/$AGORA_RANK; sleep 1",
    )  # fmt: skip
    assert batch.wait_ended(job)["state"] == "COMPLETED"
    starts = {int(p.name): float(p.read_text()) for p in marks.iterdir()}
    assert sorted(starts) == [0, 1, 2, 3]
    assert max(starts.values()) - min(starts.values()) < 1.0  # they overlapped: all or nothing
    hosts = Counter(t["hostname"] for t in batch.tasks(job))
    assert sorted(hosts.values()) == [2, 2]  # at most 2 per agent


def test_bad_submissions_are_refused_and_queue_nothing(batch: BatchService) -> None:
    cases = [
        (["--bogus", "1", "--", "true"], "--bogus"),
        (["--cpus", "64", "--", "true"], "no agent"),
        (["--dependency", "afterok:999", "--", "true"], "no job 999"),
        (["--array", "5-1", "--", "true"], "5-1"),
        (["--array", "0-3%x", "--", "true"], "0-3%x"),
        (["--constraint", "zone=east", "--", "true"], "zone=east"),
        (["--ntasks", "20", "--cpus", "1", "--", "true"], "20"),
    ]
    for args, named in cases:
        done = batch.cli("submit", *args)
        assert done.returncode != 0, args
        assert named in done.stderr, (args, done.stderr)
    assert batch.get("/jobs?all=1")["jobs"] == []
    job = batch.submit("--constraint", "zone=west", "--", "true")
    assert batch.wait_ended(job)["state"] == "COMPLETED"


def test_queues_are_roles_so_quota_applies_between_them(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path / "cluster",
        agents=1,
        agent_resources="cpus:4;mem:4096",
        master_args=("--quota-limit", "high:cpus:1", "--allocation-interval", "0.2"),
        agent_args=AGENT_ARGS,
    ) as cluster:
        service = BatchService(
            cluster.endpoint, tmp_path / "queues", args=("--queues", "default,high")
        )
        service.work_dir.mkdir()
        service.start()
        try:
            high = service.submit("-p", "high", "--array", "0-2", "--", "sleep", "30")
            low = service.submit("--array", "0-1", "--", "sleep", "30")
            wait_for(lambda: service.job(low)["tasks"]["RUNNING"] == 2, 30, "the default queue")
            wait_for(lambda: service.job(high)["tasks"]["RUNNING"] == 1, 30, "the high queue")
            # cpus are free, but the high queue's role is limited to 1 cpu
            assert service.job(high)["tasks"]["PENDING"] == 2
            refused = service.cli("submit", "-p", "nope", "--", "true")
            assert refused.returncode != 0 and "unknown queue 'nope'" in refused.stderr
            for job in (high, low):
                assert service.cli("cancel", str(job)).returncode == 0
                assert service.wait_ended(job)["state"] == "CANCELLED"
        finally:
            service.stop()
