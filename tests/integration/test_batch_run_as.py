"""The batch service runs jobs as their submitters, on a root-started `agora local`.

A client that drops to ``nobody`` submits through the service's Unix socket: its job runs as
``nobody`` (``id -un`` prints it), a job script too. ``nobody`` asking to run as ``root`` is
refused, logged, and nothing is stored; ``nobody`` cannot read or cancel root's job. Over TCP the
API wants the operator token (401 without it), except ``/health``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.test_cli import CMD_TIMEOUT, Local, _kill_everything, start_local
from integration.test_local_secure import AS_NOBODY
from support.polling import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the test drops to the user nobody"
)


@pytest.fixture(scope="module")
def local() -> Iterator[Local]:
    # Not under pytest's tmp dir (mode 0700): nobody must reach $AGORA_HOME/batch.sock.
    tmp = Path(tempfile.mkdtemp(prefix="agora-batch-run-as-"))
    os.chmod(tmp, 0o755)
    cluster = start_local(tmp, agents=1)
    try:
        wait_for(lambda: (cluster.home / "batch.sock").exists(), 30, "the batch socket")
        yield cluster
    finally:
        _kill_everything(cluster)
        shutil.rmtree(tmp, ignore_errors=True)


def as_nobody(local: Local, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", AS_NOBODY, *args],
        env=dict(local.env, HOME="/nonexistent"),
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
    )


def submitted(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["job_id"])


def all_jobs(local: Local) -> list[dict[str, Any]]:
    out = local.agora("batch", "status", "--all", "--json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["jobs"])


def output_of(local: Local, job: str) -> str:
    waited = local.agora("batch", "wait", job)
    assert waited.returncode == 0, waited.stderr + waited.stdout
    out = local.agora("batch", "logs", job)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_job_submitted_by_nobody_runs_as_nobody(local: Local) -> None:
    job = submitted(as_nobody(local, "batch", "submit", "--json", "--", "id", "-un"))
    assert output_of(local, job) == "nobody\n"
    [view] = [j for j in all_jobs(local) if str(j["job_id"]) == job]
    assert (view["user"], view["submitter"], view["submit_uid"]) == ("nobody", "nobody", 65534)
    # A job script is written into the sandbox and run from there, as nobody too.
    script = local.home.parent / "job.sh"
    script.write_text("#!/bin/sh\nid -un\n", encoding="utf-8")
    os.chmod(script, 0o644)
    job = submitted(as_nobody(local, "batch", "submit", "--json", str(script)))
    assert output_of(local, job) == "nobody\n"
    # nobody sees their own jobs only.
    listed = json.loads(as_nobody(local, "batch", "status", "--all", "--json").stdout)["jobs"]
    assert listed and {j["user"] for j in listed} == {"nobody"}


def test_nobody_asking_to_run_as_root_is_refused_and_nothing_is_stored(local: Local) -> None:
    before = len(all_jobs(local))
    out = as_nobody(local, "batch", "submit", "--user", "root", "--", "id", "-un")
    assert out.returncode == 1, out
    assert "may not submit a job to run as user 'root'" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stdout == ""
    assert len(all_jobs(local)) == before
    log = local.work / "logs" / "batch.log"

    def logged() -> bool:
        text = log.read_text(errors="replace")
        return any(
            "batch_request_refused" in line and "nobody" in line and "'root'" in line
            for line in text.splitlines()
        )

    wait_for(logged, 10.0, "the service's batch_request_refused line")


def test_nobody_cannot_read_or_cancel_roots_job(local: Local) -> None:
    job = submitted(local.agora("batch", "submit", "--json", "--", "sleep", "300"))
    try:
        for args in (("cancel", job), ("status", job)):
            out = as_nobody(local, "batch", *args)
            assert out.returncode == 1, out
            assert "Unix user 'nobody' (uid 65534) may not" in out.stderr, out.stderr
        listed = json.loads(as_nobody(local, "batch", "status", "--all", "--json").stdout)["jobs"]
        assert job not in {str(j["job_id"]) for j in listed}
        [view] = [j for j in all_jobs(local) if str(j["job_id"]) == job]
        assert view["state"] in ("PENDING", "RUNNING") and view["user"] == "root"
    finally:
        out = local.agora("batch", "cancel", job)
        assert out.returncode == 0, out.stderr


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_tcp_wants_the_operator_token_except_for_health(local: Local) -> None:
    url = (local.home / "batch").read_text().strip()
    token = (local.home / "keys" / "operator.token").read_text().strip()
    assert _get(url + "/health") == 200
    assert _get(url + "/jobs") == 401
    assert _get(url + "/jobs", "not-the-token-not-the-token") == 401
    assert _get(url + "/jobs", token) == 200
