"""The master's state in Mesos's shapes: /master/state, /state.json and the v1 state calls, as
the Mesos tools that read them expect (a real core behind the operator app)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agora.master.server.http import make_app
from agora.master.server.http_access import OPEN, HttpAccess
from agora.master.server.metrics import DaemonStats
from aiohttp.test_utils import TestClient, TestServer
from test_master_http import _cluster

T = TypeVar("T")
TOKEN = {"Authorization": "Bearer tok"}


def _run(app_of: Callable[[], Any], body: Callable[[TestClient[Any, Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        async with TestClient(TestServer(app_of())) as client:
            return await asyncio.wait_for(body(client), timeout=10)

    return asyncio.run(run())


def test_master_state_reads_like_mesos() -> None:
    h = _cluster()
    locked = HttpAccess(tokens={"tok": "ops"})

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        assert (await client.get("/master/state")).status == 401
        state = await (await client.get("/master/state", headers=TOKEN)).json()
        same = await (await client.get("/state.json", headers=TOKEN)).json()
        assert same == state
        return dict(state)

    state = _run(lambda: make_app(lambda: h.master, DaemonStats(), access=locked), body)
    assert state["version"] == "1.11.0" and state["leader"] == state["pid"]
    assert state["activated_slaves"] == 2 and state["deactivated_slaves"] == 0
    slaves = {s["hostname"]: s for s in state["slaves"]}
    assert slaves["a1"]["resources"]["cpus"] == 4.0 and slaves["a1"]["resources"]["mem"] == 4096.0
    assert slaves["a1"]["attributes"] == {"rack": "r1"}
    assert slaves["a2"]["resources"]["disk"] == 100.0
    assert sum(s["used_resources"]["cpus"] for s in state["slaves"]) == 1.0  # t1 runs
    by_name = {f["name"]: f for f in state["frameworks"]}
    s1, s2 = by_name["s1"], by_name["s2"]
    assert s1["role"] == "batch" and s1["active"] and s1["connected"]
    [t1] = s1["tasks"]
    assert (t1["id"], t1["state"], t1["resources"]["cpus"]) == ("t1", "TASK_RUNNING", 1.0)
    assert t1["slave_id"] == t1["agent_id"] and t1["framework_id"] == s1["id"]
    assert [t["state"] for t in s2["completed_tasks"]] == ["TASK_FINISHED"]
    assert s2["tasks"] == [] and state["orphan_tasks"] == []


def test_v1_state_calls_and_a_standby() -> None:
    h = _cluster()

    async def body(client: TestClient[Any, Any]) -> None:
        async def call(kind: str) -> Any:
            resp = await client.post("/api/v1", json={"type": kind})
            assert resp.status == 200, await resp.text()
            return await resp.json()

        agents = (await call("GET_AGENTS"))["get_agents"]["agents"]
        assert sorted(a["agent_info"]["hostname"] for a in agents) == ["a1", "a2"]
        frameworks = (await call("GET_FRAMEWORKS"))["get_frameworks"]["frameworks"]
        assert sorted(f["framework_info"]["name"] for f in frameworks) == ["s1", "s2"]
        tasks = (await call("GET_TASKS"))["get_tasks"]
        assert [(t["task_id"], t["state"]) for t in tasks["tasks"]] == [
            ({"value": "t1"}, "TASK_RUNNING")
        ]
        assert [t["task_id"]["value"] for t in tasks["completed_tasks"]] == ["t2"]
        state = (await call("GET_STATE"))["get_state"]
        assert set(state) == {"get_agents", "get_frameworks", "get_tasks"}

    _run(lambda: make_app(lambda: h.master, DaemonStats(), access=OPEN), body)

    async def standby(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/master/state", allow_redirects=False)
        assert (
            resp.status == 307 and resp.headers["Location"] == "http://10.0.0.7:5050/master/state"
        )
        resp = await client.post("/api/v1", json={"type": "GET_TASKS"}, allow_redirects=False)
        assert resp.status == 307

    where = {"leader_http": "http://10.0.0.7:5050"}
    _run(
        lambda: make_app(lambda: None, DaemonStats(), lambda: where, access=OPEN, redirect=True),
        standby,
    )
