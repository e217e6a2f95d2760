"""Who may do what with the batch service (pure rules), the job store's upgrade to recording who
submitted a job, where the CLI finds the service, and the TCP API's bearer tokens."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agora.frameworks.batch.access import Caller, list_filter, may_access, submit_problem
from agora.frameworks.batch.api import ClusterView, make_app
from agora.frameworks.batch.api_auth import ApiAuth, SocketInUse, prepare_socket_path
from agora.frameworks.batch.client import ServiceAddress, find_service
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.placement import task_info
from agora.frameworks.batch.records import JobRecord, TaskRecord
from agora.frameworks.batch.service import BatchService
from agora.frameworks.batch.spec import JobSpec
from agora.frameworks.batch.store import SCHEMA_VERSION, JobStore
from agora.sdk.cli.common import CliError
from agora.sdk.daemon.http_auth import HttpCredentials
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import Offer
from agora.sdk.resources import Resources
from aiohttp.test_utils import TestClient, TestServer

ALICE = Caller.local_user(1000, "alice")
OFFER = Offer(
    offer_id=OfferID("o"),
    framework_id=FrameworkID("f"),
    agent_id=AgentID("a"),
    hostname="h",
    role="*",
    resources=Resources.parse("cpus:1;mem:128"),
)
ROOT = Caller.local_user(0, "root")


# ------------------------------------------------------------------ the rules


def test_a_local_user_submits_only_as_themself() -> None:
    assert submit_problem(ALICE, "alice") is None
    problem = submit_problem(ALICE, "root")
    assert problem is not None
    assert "Unix user 'alice' (uid 1000) may not submit a job to run as user 'root'" in problem
    assert "nothing was queued" in problem


def test_root_and_token_holders_are_operators() -> None:
    assert ROOT.operator and Caller.token("ops").operator and Caller.anonymous().operator
    for caller in (ROOT, Caller.token("ops"), Caller.anonymous()):
        assert submit_problem(caller, "alice") is None
        assert may_access(caller, "alice", 1000)
        assert list_filter(caller, None) == (None, None)
        assert list_filter(caller, "bob") == ("bob", None)


def test_a_local_user_reads_and_cancels_only_their_own_jobs() -> None:
    assert may_access(ALICE, "alice", None)  # runs as alice (root submitted it for her)
    assert may_access(ALICE, "alice", 1000)
    assert not may_access(ALICE, "root", 0)
    assert not may_access(ALICE, "bob", None)
    assert list_filter(ALICE, None) == ("alice", None)
    assert list_filter(ALICE, "alice") == ("alice", None)
    user, problem = list_filter(ALICE, "bob")
    assert user is None and problem is not None and "only their own jobs" in problem


def test_the_submitter_recorded() -> None:
    assert ALICE.submitter == "alice"
    assert Caller.token("ops").submitter == "token:ops"
    assert Caller.anonymous().submitter == "insecure-http"


# ------------------------------------------------------------------ the job store


def test_a_job_records_its_submitter_and_runs_as_its_user(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "jobs.sqlite")
    try:
        spec = JobSpec(name="j", user="alice", command="id -un")
        job, tasks = store.add_job(spec, 5.0, submitter="alice", submit_uid=1000)
        assert (job.run_as, job.submitter, job.submit_uid) == ("alice", "alice", 1000)
        assert store.job(job.job_id) == job
        assert job.to_json()["submitter"] == "alice"
        tasks[0].task_id = "t-1"
        info = task_info(job, tasks[0], OFFER, Resources.parse("cpus:1;mem:128"))
        assert info.command is not None and info.command.user == "alice"
    finally:
        store.close()


def test_a_version_1_store_is_upgraded_and_its_jobs_keep_the_services_user(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.sqlite"
    store = JobStore.open(path)
    job, _ = store.add_job(JobSpec(name="old", user="label", command="true"), 1.0)
    store.close()
    # Make it what version 1 wrote: no run_as, submitter or submit_uid columns.
    raw = sqlite3.connect(path)
    for column in ("run_as", "submitter", "submit_uid"):
        raw.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    raw.execute("ALTER TABLE tasks DROP COLUMN preemptions")  # version 3's
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    store = JobStore.open(path)
    try:
        old = store.job(job.job_id)
        assert old is not None and (old.run_as, old.submitter, old.submit_uid) == ("", "", None)
        task = TaskRecord(job.job_id, 0, task_id="t")
        info = task_info(old, task, OFFER, Resources.parse("cpus:1;mem:128"))
        assert info.command is not None and info.command.user is None  # the framework's user
        new, _ = store.add_job(JobSpec(name="new", user="bob", command="true"), 2.0)
        assert store.job(new.job_id) == JobRecord(new.job_id, new.spec, 2.0, run_as="bob")
    finally:
        store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


# ------------------------------------------------------------------ finding the service


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_the_cli_prefers_the_unix_socket_and_keeps_the_url_as_fallback(tmp_path: Path) -> None:
    env = {"AGORA_HOME": str(tmp_path)}
    (tmp_path / "batch").write_text("http://127.0.0.1:9\n")
    assert find_service(None, env) == ServiceAddress(url="http://127.0.0.1:9")
    with _listen(tmp_path / "batch.sock"):
        found = find_service(None, env)
    assert found == ServiceAddress(socket=str(tmp_path / "batch.sock"), url="http://127.0.0.1:9")
    assert str(found) == f"unix:{tmp_path}/batch.sock"
    assert find_service("unix:/x/b.sock", env) == ServiceAddress(socket="/x/b.sock")
    assert find_service("/x/b.sock", env) == ServiceAddress(socket="/x/b.sock")
    assert find_service(None, {**env, "AGORA_BATCH": "h:1"}) == ServiceAddress(url="http://h:1")
    (tmp_path / "batch").unlink()
    (tmp_path / "batch.sock").unlink()
    with pytest.raises(CliError, match="no batch service found"):
        find_service(None, env)


def test_a_stale_socket_is_cleared_and_a_live_one_kept(tmp_path: Path) -> None:
    path = tmp_path / "run" / "batch.sock"
    prepare_socket_path(path)  # makes the directory, 0755
    assert (path.parent.stat().st_mode & 0o777) == 0o755
    listener = _listen(path)
    with pytest.raises(SocketInUse, match="another batch service listens"):
        prepare_socket_path(path)
    listener.close()  # the socket file stays, nobody listens: a dead service's
    prepare_socket_path(path)
    assert not path.exists()
    path.write_text("not a socket")
    with pytest.raises(SocketInUse, match="not a socket"):
        prepare_socket_path(path)


# ------------------------------------------------------------------ TCP needs a token

TOKEN = "a-token-of-at-least-sixteen-chars"
SPEC = {"name": "j", "user": "alice", "command": "true"}


def _api(tmp_path: Path, auth: ApiAuth, scenario: Any) -> None:
    async def main() -> None:
        store = JobStore.open(tmp_path / "jobs.sqlite")
        service = BatchService(BatchCore(CoreConfig()), store)
        app = make_app(service, ClusterView(None), ("*",), auth=auth)
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            await scenario(client, store)
        finally:
            await client.close()
            store.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_tcp_needs_a_token_except_for_health(tmp_path: Path) -> None:
    auth = ApiAuth(credentials=HttpCredentials({TOKEN: "ops"}, frozenset({"ops"})))

    async def scenario(client: TestClient[Any, Any], store: JobStore) -> None:
        assert (await client.get("/health")).status == 200
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}):
            for method, path in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/history")):
                reply = await client.request(method, path, json={"spec": SPEC}, headers=headers)
                assert reply.status == 401, (method, path, headers)
                assert "Bearer" in reply.headers["WWW-Authenticate"]
        assert store.jobs(include_ended_since=None, user=None, limit=0) == []
        good = {"Authorization": f"Bearer {TOKEN}"}
        reply = await client.post("/jobs", json={"spec": SPEC}, headers=good)
        assert reply.status == 201, await reply.text()
        job = store.job((await reply.json())["job_id"])
        assert job is not None and (job.run_as, job.submitter) == ("alice", "token:ops")
        web_page = {**good, "Origin": "http://evil.example"}
        assert (await client.get("/jobs", headers=web_page)).status == 403

    _api(tmp_path, auth, scenario)


def test_without_credentials_tcp_serves_only_health(tmp_path: Path) -> None:
    async def scenario(client: TestClient[Any, Any], store: JobStore) -> None:
        assert (await client.get("/health")).status == 200
        reply = await client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert reply.status == 401
        assert "Unix socket" in (await reply.json())["error"]

    _api(tmp_path, ApiAuth(), scenario)


def test_a_flood_of_refused_requests_logs_a_few_lines(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    async def scenario(client: TestClient[Any, Any], store: JobStore) -> None:
        for _ in range(100):
            assert (await client.get("/jobs")).status == 401

    with capture_logs() as logs:
        _api(tmp_path, ApiAuth(), scenario)
    refused = [e for e in logs if e["event"] == "batch_http_refused"]
    assert 1 <= len(refused) <= 10, len(refused)  # a burst of 3, then 3 a second
