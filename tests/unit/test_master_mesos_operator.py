"""Mesos-compatible operator endpoints on the master: /version, /master/health,
/master/redirect, /metrics/snapshot (a real core, the test server's socket only)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agora.master.server import http_access, mesos_operator
from agora.master.server.http import make_app
from agora.master.server.http_access import OPEN, HttpAccess
from agora.master.server.metrics import DaemonStats
from agora.sdk.daemon.http_auth import basic_principal, header_principal
from aiohttp.test_utils import TestClient, TestServer
from test_master_http import _cluster

T = TypeVar("T")


def _run(app_of: Callable[[], Any], body: Callable[[TestClient[Any, Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        async with TestClient(TestServer(app_of())) as client:
            return await asyncio.wait_for(body(client), timeout=10)

    return asyncio.run(run())


def test_open_paths_are_the_mesos_open_ones() -> None:
    assert mesos_operator.OPEN_PATHS <= http_access.OPEN_PATHS
    assert "/metrics/snapshot" not in http_access.OPEN_PATHS


def test_version_health_and_redirect_from_the_leader_need_no_token() -> None:
    h = _cluster()
    locked = HttpAccess(tokens={"tok": "ops"})

    async def body(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/version")
        assert resp.status == 200
        assert (await resp.json())["version"] == "1.11.0"
        resp = await client.get("/master/health")
        assert resp.status == 200 and await resp.text() == ""
        resp = await client.get("/master/redirect", allow_redirects=False)
        assert resp.status == 307
        assert resp.headers["Location"] == f"//{client.host}:{client.port}"
        resp = await client.get("/metrics/snapshot")
        assert resp.status == 401

    _run(lambda: make_app(lambda: h.master, DaemonStats(), access=locked), body)


def test_standby_redirects_only_to_an_authenticated_leader_url() -> None:
    where = {"leader_http": "http://10.0.0.7:5050"}

    async def trusted(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/master/redirect", allow_redirects=False)
        assert resp.status == 307 and resp.headers["Location"] == "//10.0.0.7:5050"
        resp = await client.get("/master/health")
        assert resp.status == 200, "Mesos answers 200 on any running master"
        snap = await (await client.get("/metrics/snapshot")).json()
        assert snap["master/elected"] == 0

    async def untrusted(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/master/redirect", allow_redirects=False)
        assert resp.status == 503

    _run(lambda: make_app(lambda: None, DaemonStats(), lambda: where, access=OPEN, redirect=True),
         trusted)  # fmt: skip
    _run(lambda: make_app(lambda: None, DaemonStats(), lambda: where, access=OPEN), untrusted)
    _run(lambda: make_app(lambda: None, DaemonStats(), lambda: {}, access=OPEN, redirect=True),
         untrusted)  # fmt: skip


def test_metrics_snapshot_counts_the_cluster() -> None:
    h = _cluster()

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        resp = await client.get("/metrics/snapshot", headers={"Authorization": "Bearer tok"})
        assert resp.status == 200
        return dict(await resp.json())

    locked = HttpAccess(tokens={"tok": "ops"})
    snap = _run(lambda: make_app(lambda: h.master, DaemonStats(), access=locked), body)
    assert snap["master/elected"] == 1
    assert snap["master/slaves_active"] == 2
    assert snap["master/frameworks_active"] == 2
    assert snap["master/tasks_running"] == 1
    assert snap["master/cpus_total"] == 6.0
    assert snap["master/mem_total"] == 6144.0
    assert snap["master/cpus_used"] >= 1.0
    assert 0 < snap["master/cpus_percent"] <= 1


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


TOKENS = {"t" * 16: "ops", "u" * 16: "dev"}


def test_basic_principal_needs_the_principal_and_its_own_token() -> None:
    assert basic_principal(_basic("ops", "t" * 16), TOKENS) == "ops"
    assert header_principal(_basic("dev", "u" * 16), TOKENS) == "dev"
    assert header_principal("Bearer " + "t" * 16, TOKENS) == "ops"
    assert basic_principal(_basic("dev", "t" * 16), TOKENS) is None, "another's token"
    assert basic_principal(_basic("ops", "x" * 16), TOKENS) is None, "unknown token"
    assert basic_principal(_basic("ops", ""), TOKENS) is None
    assert basic_principal("Basic !!notbase64", TOKENS) is None
    assert basic_principal("Basic " + base64.b64encode(b"no-colon").decode(), TOKENS) is None
    assert basic_principal("", TOKENS) is None
    assert basic_principal("Bearer " + "t" * 16, TOKENS) is None


def test_http_basic_auth_is_accepted_and_wrong_pairs_refused() -> None:
    h = _cluster()
    locked = HttpAccess(tokens=TOKENS)

    async def body(client: TestClient[Any, Any]) -> None:
        for path in ("/state", "/metrics/snapshot"):
            resp = await client.get(path, headers={"Authorization": _basic("ops", "t" * 16)})
            assert resp.status == 200, path
            for bad in ({"Authorization": _basic("dev", "t" * 16)}, {}):
                resp = await client.get(path, headers=bad)
                assert resp.status == 401, (path, bad)
                assert "WWW-Authenticate" in resp.headers

    _run(lambda: make_app(lambda: h.master, DaemonStats(), access=locked), body)


def test_api_v1_answers_mesos_shapes_and_refuses_the_rest() -> None:
    h = _cluster()
    auth = {"Authorization": "Bearer " + "t" * 16}

    async def body(client: TestClient[Any, Any]) -> None:
        async def call(payload: Any, status: int = 200, **kw: Any) -> Any:
            resp = await client.post("/api/v1", json=payload, headers=auth, **kw)
            assert resp.status == status, await resp.text()
            return await resp.json() if status == 200 else await resp.text()

        assert (await call({"type": "GET_HEALTH"}))["get_health"] == {"healthy": True}
        version = await call({"type": "GET_VERSION"})
        assert version["get_version"]["version_info"]["version"] == "1.11.0"
        metrics = (await call({"type": "GET_METRICS"}))["get_metrics"]["metrics"]
        assert {"name": "master/tasks_running", "value": 1} in metrics
        assert "GET_FLAGS" in await call({"type": "GET_FLAGS"}, 501)
        await call({"type": "NOPE"}, 400)
        await call(["GET_HEALTH"], 400)
        resp = await client.post(
            "/api/v1", data=b"\x08\x01", headers={**auth, "Content-Type": "application/x-protobuf"}
        )
        assert resp.status == 415
        resp = await client.post("/api/v1", json={"type": "GET_HEALTH"})
        assert resp.status == 401

    _run(lambda: make_app(lambda: h.master, DaemonStats(), access=HttpAccess(TOKENS)), body)
