"""The batch service's HTTP API against a real core and job store (no cluster, no driver):
what a client sends that is wrong gets a 4xx naming it, and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agora.frameworks.batch.api import ClusterView, make_app
from agora.frameworks.batch.api_auth import ApiAuth
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.service import BatchService
from agora.frameworks.batch.store import JobStore
from aiohttp.test_utils import TestClient, TestServer

SPEC = {"name": "j", "user": "u", "command": "true"}
#: Served without tokens: these tests are about what the API checks after the caller.
OPEN = ApiAuth(insecure_http=True)

Scenario = Callable[[TestClient[Any, Any], BatchService], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario) -> None:
    async def main() -> None:
        store = JobStore.open(tmp_path / "jobs.sqlite")
        service = BatchService(BatchCore(CoreConfig()), store)
        client = TestClient(TestServer(make_app(service, ClusterView(None), ("*",), auth=OPEN)))
        await client.start_server()
        try:
            await scenario(client, service)
        finally:
            await client.close()
            store.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_bad_specs_are_refused_with_a_400_naming_the_problem(tmp_path: Path) -> None:
    cases: list[tuple[Any, str]] = [
        ({**SPEC, "cpus": 0.00001}, "cpus must be 0 or at least 0.001"),
        ({**SPEC, "cpus": int("1" + "0" * 400)}, "cpus is out of range"),
        ({**SPEC, "priority": 2**70}, "priority is out of range"),
        ({**SPEC, "name": "a\0b"}, "NUL"),
        ({**SPEC, "workdir": "/a\0b"}, "NUL"),
        ({**SPEC, "bogus": 1}, "unknown job field 'bogus'"),
        ({**SPEC, "queue": "gpu"}, "unknown queue 'gpu'"),
        ({**SPEC, "dependencies": ["afterok:7"]}, "there is no job 7"),
        ({**SPEC, "array": {"ranges": [[5, 1, 1]]}}, "bad array range 5-1"),
        ("not an object", "JSON object"),
    ]

    async def scenario(client: TestClient[Any, Any], service: BatchService) -> None:
        for spec, named in cases:
            reply = await client.post("/jobs", json={"spec": spec})
            body = await reply.json()
            assert reply.status == 400, (spec, body)
            assert named in body["error"], (spec, body)
        reply = await client.post("/jobs", data=b"{not json")
        assert reply.status == 400
        listed = await (await client.get("/jobs?all=1")).json()
        assert listed["jobs"] == []

    run(tmp_path, scenario)


def test_cancel_refuses_a_body_it_does_not_understand(tmp_path: Path) -> None:
    async def scenario(client: TestClient[Any, Any], service: BatchService) -> None:
        spec = {**SPEC, "array": {"ranges": [[0, 9, 1]], "max_running": 0}}
        job = (await (await client.post("/jobs", json={"spec": spec})).json())["job_id"]
        for body in ({"idx": 3}, [3], "3", {"index": "3"}, {"index": True}):
            reply = await client.post(f"/jobs/{job}/cancel", json=body)
            assert reply.status == 400, body
        view = (await (await client.get(f"/jobs/{job}?tasks=0")).json())["job"]
        assert view["tasks"]["PENDING"] == 10  # nothing was cancelled
        reply = await client.post(f"/jobs/{job}/cancel", json={"index": 3})
        assert (await reply.json()) == {"cancelled": 1}
        assert (await client.post(f"/jobs/{job}/cancel", json={"index": 99})).status == 404

    run(tmp_path, scenario)


def test_numbers_out_of_range_in_paths_and_queries_are_400_not_500(tmp_path: Path) -> None:
    async def scenario(client: TestClient[Any, Any], service: BatchService) -> None:
        huge = "9" * 30
        for path in (f"/jobs/{huge}", f"/history?limit={huge}", "/jobs/-1", "/jobs/x"):
            assert (await client.get(path)).status == 400, path
        assert (await client.get("/jobs/12345")).status == 404

    run(tmp_path, scenario)
