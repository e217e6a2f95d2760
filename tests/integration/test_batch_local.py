"""`agora local` runs the batch service: `agora batch` finds it through $AGORA_HOME/batch, reads a
task's output through its agent, and nothing of the service outlives `agora local`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.test_cli import Local, _kill_everything, cluster_pids, start_local
from support.polling import wait_for


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-batch-local"))
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def test_batch_commands_find_the_service_agora_local_started(local: Local) -> None:
    url = (local.home / "batch").read_text().strip()
    assert url.startswith("http://127.0.0.1:")
    submitted = local.agora(
        "batch", "submit", "--name", "hello", "--array", "0-2", "--",
        "sh", "-c", "echo hello from $AGORA_ARRAY_INDEX; echo oops >&2",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.startswith("Submitted batch job ")
    job = submitted.stdout.split()[-1]
    waited = local.agora("batch", "wait", job)
    assert waited.returncode == 0, waited.stderr
    out = local.agora("batch", "logs", f"{job}.2")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello from 2\n"
    err = local.agora("batch", "logs", "--stderr", f"{job}.0")
    assert err.stdout == "oops\n"
    status = json.loads(local.agora("batch", "status", "--all", "--json").stdout)
    [view] = [j for j in status["jobs"] if str(j["job_id"]) == job]
    assert view["state"] == "COMPLETED" and view["tasks"]["COMPLETED"] == 3
    table = local.agora("batch", "status", "--all")
    assert "hello" in table.stdout and "COMPLETED" in table.stdout
    history = local.agora("batch", "history", "--job", job)
    assert history.returncode == 0 and f"{job}.1" in history.stdout


def test_the_batch_service_is_a_framework_of_the_cluster(local: Local) -> None:
    state = json.loads(local.agora("state", "--json").stdout)
    assert "batch" in {f["name"] for f in state["frameworks"]}


def test_stopping_agora_local_stops_the_batch_service(tmp_path: Path) -> None:
    cluster = start_local(tmp_path, agents=1)
    try:
        wait_for(lambda: (cluster.home / "batch").exists(), 30, "the batch service's URL")
        service = {
            pid
            for pid in cluster_pids(cluster.work)
            if b"agora.frameworks.batch" in Path(f"/proc/{pid}/cmdline").read_bytes()
        }
        assert len(service) == 1
        assert cluster.stop() == 0
        assert not any(os.path.exists(f"/proc/{pid}") for pid in service)
        assert not (cluster.home / "batch").exists()
    finally:
        _kill_everything(cluster)
