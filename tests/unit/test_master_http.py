"""The operator HTTP API around a real master core driven by messages (no daemon, no sockets
but the test server's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from agora.master.core import MasterConfig
from agora.master.server.config import load_settings
from agora.master.server.http import make_app
from agora.master.server.http_access import OPEN
from agora.master.server.metrics import DaemonStats
from agora.sdk.messages import DrainAgent, TaskState, Teardown
from agora.sdk.resources import Resources
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from support.master_kit import Harness, offers_in

T = TypeVar("T")


def _cluster() -> Harness:
    """Two agents (one with attributes), two frameworks, three tasks in various states."""
    config = MasterConfig(
        weights={"batch": 2.0}, quotas={"batch": (Resources.parse("cpus:1"), None)}
    )
    h = Harness(config=config)
    a1 = h.register_agent("a1", "cpus:4;mem:4096", rack="r1")
    a2 = h.register_agent("a2", "cpus:2;mem:2048;disk:100")
    peers = {a1: "a1", a2: "a2"}
    fw1 = h.subscribe("s1", roles=("batch",))
    fw2 = h.subscribe("s2")
    out = h.tick(1.0)
    o1, o2 = offers_in(out, "s1")[0], offers_in(out, "s2")[0]
    h.launch("s1", fw1, [o1], [("t1", "cpus:1", o1.agent_id)], refuse_seconds=0)
    h.agent_update(peers[o1.agent_id], fw1, "t1", TaskState.RUNNING)
    h.launch("s2", fw2, [o2], [("t2", "cpus:1", o2.agent_id)], refuse_seconds=0)
    _, uuid = h.agent_update(peers[o2.agent_id], fw2, "t2", TaskState.FINISHED)
    h.ack("s2", fw2, o2.agent_id, "t2", uuid)
    assert len(h.master.state.tasks) == 1, "t1 live, t2 completed"
    return h


def _with_client(h: Harness, body: Callable[[TestClient[Any, Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        app = make_app(lambda: h.master, DaemonStats(), access=OPEN)
        async with TestClient(TestServer(app)) as client:
            return await asyncio.wait_for(body(client), timeout=10)

    return asyncio.run(run())


async def _get_json(client: TestClient[Any, Any], path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    return await resp.json()


def test_health() -> None:
    got = _with_client(Harness(), lambda c: _get_json(c, "/health"))
    assert got == {"status": "ok", "leading": True}


def test_unknown_path_is_a_json_404() -> None:
    got = _with_client(Harness(), lambda c: _get_json(c, "/nope", status=404))
    assert got["path"] == "/nope"
    assert "error" in got


def test_state_lists_everything() -> None:
    h = _cluster()
    state = _with_client(h, lambda c: _get_json(c, "/state"))
    st = h.master.state
    assert state["master"]["id"] == st.master_info.master_id
    assert state["master"]["epoch"] == h.master.epoch
    assert state["master"]["uptime"] >= 0
    agents = {a["hostname"]: a for a in state["agents"]}
    assert set(agents) == {"a1", "a2"}
    assert agents["a1"]["attributes"] == {"rack": "r1"}
    assert agents["a1"]["status"] == "ACTIVE"
    assert agents["a2"]["resources"] == {"cpus": 2, "disk": 100, "mem": 2048}
    assert sum(a["allocated"].get("cpus", 0) for a in state["agents"]) >= 1
    fws = {f["name"]: f for f in state["frameworks"]}
    assert fws["s1"]["roles"] == ["batch"]
    assert fws["s1"]["active"] and fws["s1"]["connected"]
    assert fws["s1"]["share"] > 0
    tasks = {t["id"]: t for t in state["tasks"]}
    assert tasks["t1"]["state"] == "RUNNING"
    assert tasks["t1"]["framework_id"] == fws["s1"]["id"]
    assert tasks["t1"]["exit_code"] is None
    assert tasks["t2"]["state"] == "FINISHED"
    assert tasks["t2"]["framework_id"] == fws["s2"]["id"]
    assert state["offers"]["outstanding"] == len(st.offers) == len(state["offers"]["list"])
    for offer in state["offers"]["list"]:
        assert offer["agent_id"] in {a["id"] for a in state["agents"]}
        assert offer["framework_id"] in {f["id"] for f in state["frameworks"]}
    assert sum(f["offers"] for f in state["frameworks"]) == len(st.offers)
    assert fws["s1"]["tasks"] == {"RUNNING": 1}
    assert not agents["a1"]["draining"] and agents["a1"]["reserved"] == {}
    assert state["cluster"] == "agora" and state["masters"] == []
    assert state["insecure"] is False  # (MasterConfig.insecure: the master runs without CURVE)
    roles = {r["name"]: r for r in state["roles"]}
    assert roles["batch"]["weight"] == 2.0
    assert roles["batch"]["quota"] == {"guarantee": {"cpus": 1}, "limit": None}
    assert roles["*"]["weight"] == 1.0 and roles["*"]["quota"] is None


def test_summary_counts_match_state() -> None:
    h = _cluster()

    async def both(c: TestClient[Any, Any]) -> tuple[Any, Any]:
        return await _get_json(c, "/state"), await _get_json(c, "/state/summary")

    state, summary = _with_client(h, both)
    assert summary["agents"] == {
        "ACTIVE": 2,
        "UNREACHABLE": 0,
        "DISCONNECTED": 0,
        "DRAINING": 0,
        "DRAINED": 0,
    }
    assert summary["frameworks"]["active"] == len(state["frameworks"])
    assert summary["frameworks"]["inactive"] == 0
    by_state: dict[str, int] = {}
    for task in state["tasks"]:
        by_state[task["state"]] = by_state.get(task["state"], 0) + 1
    assert summary["tasks"] == by_state
    assert summary["offers"]["outstanding"] == state["offers"]["outstanding"]
    assert summary["resources"]["total"] == {"cpus": 6, "mem": 6144, "disk": 100, "gpus": 0}
    allocated = summary["resources"]["allocated"]
    assert allocated["cpus"] == sum(a["allocated"].get("cpus", 0) for a in state["agents"])


def test_torn_down_framework_is_inactive() -> None:
    h = _cluster()
    fw = next(f for f in h.master.state.frameworks.values() if f.info.name == "s2")
    h.handle("s2", Teardown(framework_id=fw.framework_id))
    summary = _with_client(h, lambda c: _get_json(c, "/state/summary"))
    assert summary["frameworks"]["active"] == 1
    assert summary["frameworks"]["inactive"] == 1


def test_metrics_are_prometheus_text() -> None:
    h = _cluster()
    stats = DaemonStats()
    stats.messages_received = 7
    stats.bad_frames_received = 2
    stats.messages_dropped = 3
    stats.queue_size = lambda: 11
    stats.observe_allocation(0.003)
    stats.observe_allocation(5.0)

    async def run() -> str:
        app = make_app(lambda: h.master, stats, access=OPEN)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            assert resp.content_type == "text/plain"
            return await resp.text()

    text = asyncio.run(asyncio.wait_for(run(), timeout=10))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("agora_master_elected", ())] == 1
    assert samples[("agora_master_agents_active", ())] == 2
    assert samples[("agora_master_agents_unreachable", ())] == 0
    assert samples[("agora_master_frameworks_active", ())] == 2
    assert samples[("agora_master_tasks", (("state", "RUNNING"),))] == 1
    assert samples[("agora_master_tasks", (("state", "FINISHED"),))] == 1
    assert samples[("agora_master_tasks", (("state", "FAILED"),))] == 0
    assert samples[("agora_master_resources_total", (("resource", "cpus"),))] == 6
    assert samples[("agora_master_resources_allocated", (("resource", "cpus"),))] >= 1
    assert samples[("agora_master_messages_received_total", ())] == 7
    assert samples[("agora_master_bad_frames_received_total", ())] == 2
    assert samples[("agora_master_messages_dropped_total", ())] == 3
    assert samples[("agora_master_event_queue_size", ())] == 11
    assert samples[("agora_master_agents_disconnected", ())] == 0
    assert samples[("agora_master_agents_draining", ())] == 0
    assert samples[("agora_master_allocation_run_seconds_count", ())] == 2
    assert samples[("agora_master_allocation_run_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("agora_master_allocation_run_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("agora_master_allocation_run_seconds_sum", ())] == 5.003


def test_two_apps_do_not_share_a_registry() -> None:
    a, b = _cluster(), Harness()

    async def run() -> tuple[str, str]:
        texts = []
        for h in (a, b):
            async with TestClient(
                TestServer(make_app(lambda h=h: h.master, DaemonStats(), access=OPEN))
            ) as client:
                texts.append(await (await client.get("/metrics")).text())
        return texts[0], texts[1]

    ta, tb = asyncio.run(asyncio.wait_for(run(), timeout=10))
    assert "agora_master_agents_active 2.0" in ta
    assert "agora_master_agents_active 0.0" in tb


def test_a_failing_handler_answers_500_and_the_app_keeps_serving() -> None:
    h = _cluster()

    def broken() -> None:
        raise RuntimeError("boom")

    async def body(c: TestClient[Any, Any]) -> tuple[Any, Any]:
        original = h.master.state.allocator.role_share
        h.master.state.allocator.role_share = lambda role: broken()  # type: ignore[method-assign,assignment,func-returns-value]
        try:
            failed = await _get_json(c, "/state", status=500)
        finally:
            h.master.state.allocator.role_share = original  # type: ignore[method-assign]
        return failed, await _get_json(c, "/health")

    failed, health = _with_client(h, body)
    assert failed["error"] == "internal error"
    assert health == {"status": "ok", "leading": True}


def test_http_options() -> None:
    env = {"AGORA_INSECURE": "1"}  # (no CURVE here)
    assert load_settings([], env=env).http_port is None
    on = load_settings(["--http-port", "0", "--http-bind", "0.0.0.0"], env=env)
    assert (on.http_port, on.http_bind) == (0, "0.0.0.0")
    assert load_settings([], env={**env, "AGORA_HTTP_PORT": "8080"}).http_port == 8080
    assert load_settings(["--http-port", "off"], env=env).http_port is None
    with pytest.raises(SystemExit) as exc:
        load_settings(["--http-port", "70000"], env=env)
    assert exc.value.code == 2


def test_metrics_count_silent_and_drained_agents() -> None:
    h = _cluster()
    a1 = next(a for a in h.master.state.agents.values() if a.info.hostname == "a1")
    h.handle("ops", DrainAgent(agent_id=a1.agent_id))
    interval = h.config.agent_ping_interval
    h.tick(interval)  # a ping to each agent; neither answers
    h.tick(interval)  # and another: both missed a whole round

    async def run() -> str:
        app = make_app(lambda: h.master, DaemonStats(), access=OPEN)
        async with TestClient(TestServer(app)) as client:
            return await (await client.get("/metrics")).text()

    text = asyncio.run(asyncio.wait_for(run(), timeout=10))
    samples = {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }
    assert samples["agora_master_agents_draining"] == 1
    assert samples["agora_master_agents_disconnected"] == 2
    assert samples["agora_master_agents_active"] == 2
