"""The master daemon's operator HTTP API, as a real process on ephemeral ports."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import zmq
import zmq.asyncio
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    FrameworkInfo,
    Heartbeat,
    LeaderInfo,
    RegisterAgent,
    Subscribe,
    Subscribed,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import ZmqClient
from prometheus_client.parser import text_string_to_metric_families
from support.master_process import MasterProcess, master_process

DEADLINE = 10.0


def _http_url(master: MasterProcess) -> str:
    """The URL the master wrote beside its endpoint file (before that file itself)."""
    url = master.endpoint_file.with_name(master.endpoint_file.name + ".http").read_text().strip()
    assert url.startswith("http://127.0.0.1:")
    return url


async def _expect(client: ZmqClient, kind: type[Any]) -> Any:
    async with asyncio.timeout(DEADLINE):
        while True:
            message = (await client.recv()).message
            if not isinstance(message, Heartbeat | LeaderInfo):  # pushes, not replies
                assert isinstance(message, kind), message
                return message


async def _populate(endpoint: str) -> None:
    """One agent, one framework, and one bad frame."""
    agent = ZmqClient.connect(endpoint)
    framework = ZmqClient.connect(endpoint)
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(endpoint)
    try:
        info = AgentInfo(hostname="h1", resources=Resources.parse("cpus:4;mem:4096"))
        await agent.send(RegisterAgent(agent_info=info))
        await _expect(agent, AgentRegistered)
        await framework.send(Subscribe(framework_info=FrameworkInfo(name="fw", roles=("*",))))
        await _expect(framework, Subscribed)
        await raw.send_multipart([b"\xc1garbage"])
        async with asyncio.timeout(DEADLINE):
            await raw.recv_multipart()  # the ERROR: the daemon counted the bad frame
    finally:
        agent.close()
        framework.close()
        raw.close()
        ctx.term()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_health_state_and_metrics_agree(tmp_path: Path) -> None:
    with master_process(tmp_path, "--http-port", "0", "--allocation-interval", "0.05") as master:
        url = _http_url(master)

        async def scenario() -> tuple[Any, Any, str]:
            await _populate(master.endpoint)
            timeout = aiohttp.ClientTimeout(total=DEADLINE)
            async with aiohttp.ClientSession(url, timeout=timeout) as http:
                async with http.get("/health") as resp:
                    assert resp.status == 200
                    health = await resp.json()
                async with http.get("/state") as resp:
                    assert resp.status == 200
                    state = await resp.json()
                async with http.get("/metrics") as resp:
                    assert resp.status == 200
                    metrics = await resp.text()
                async with http.get("/no/such/path") as resp:
                    assert resp.status == 404
                    assert "error" in await resp.json()
            return health, state, metrics

        health, state, metrics = asyncio.run(asyncio.wait_for(scenario(), 30))
        # A lone master leads its group of one, at epoch >= 1 (its term, kept in its work dir).
        assert health["status"] == "ok" and health["leading"] is True
        assert health["leader"] == master.endpoint and health["masters"] == [master.endpoint]
        assert health["epoch"] >= 1
        assert state["master"]["address"] == master.endpoint
        assert [a["hostname"] for a in state["agents"]] == ["h1"]
        assert [f["name"] for f in state["frameworks"]] == ["fw"]
        samples = _samples(metrics)
        active = sum(1 for a in state["agents"] if a["status"] == "ACTIVE")
        assert samples[("agora_master_agents_active", ())] == active == 1
        live = sum(1 for f in state["frameworks"] if f["active"])
        assert samples[("agora_master_frameworks_active", ())] == live == 1
        cpus = sum(a["resources"].get("cpus", 0) for a in state["agents"])
        assert samples[("agora_master_resources_total", (("resource", "cpus"),))] == cpus
        running = sum(1 for t in state["tasks"] if t["state"] == "RUNNING")
        assert samples[("agora_master_tasks", (("state", "RUNNING"),))] == running
        assert samples[("agora_master_elected", ())] == 1
        assert samples[("agora_master_messages_received_total", ())] >= 2
        assert samples[("agora_master_bad_frames_received_total", ())] == 1
        assert samples[("agora_master_allocation_run_seconds_count", ())] >= 1

        master.proc.send_signal(signal.SIGTERM)
        assert master.proc.wait(timeout=DEADLINE) == 0
        assert not master.endpoint_file.exists()
        assert not master.endpoint_file.with_name(master.endpoint_file.name + ".http").exists()


def test_operator_calls_over_http_go_through_the_acl_and_the_core(tmp_path: Path) -> None:
    credentials = tmp_path / "http.toml"
    credentials.write_text('ops = "token-of-ops-0123456789"\nguest = "token-of-guest-0123456"\n')
    acl = tmp_path / "acl.toml"
    acl.write_text('agents = ["*"]\noperators = ["ops"]\n[roles]\n"*" = ["*"]\n')
    args = ("--http-port", "0", "--http-credentials", str(credentials), "--acl", str(acl))
    with master_process(tmp_path, *args) as master:
        url = _http_url(master)

        async def scenario() -> dict[str, Any]:
            await _populate(master.endpoint)
            timeout = aiohttp.ClientTimeout(total=DEADLINE)
            async with aiohttp.ClientSession(url, timeout=timeout) as http:
                async with http.get("/state") as resp:
                    assert resp.status == 401  # reads need a token too
                guest = {"Authorization": "Bearer token-of-guest-0123456"}
                async with http.get("/state", headers=guest) as resp:
                    [agent] = (await resp.json())["agents"]
                drain = f"/agents/{agent['id']}/drain"
                async with http.post(drain) as resp:
                    assert resp.status == 401
                async with http.post(drain, headers=guest) as resp:
                    assert resp.status == 403
                    assert "may not make operator calls" in (await resp.json())["error"]
                ops = {"Authorization": "Bearer token-of-ops-0123456789"}
                async with http.post(drain, headers=ops) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["call"] == "DRAIN_AGENT"
                async with http.post("/agents/no-such-agent/drain", headers=ops) as resp:
                    assert resp.status == 404
                body = {"weights": {"batch": 3}}
                async with http.post("/weights", json=body, headers=ops) as resp:
                    assert resp.status == 200, await resp.text()
                async with http.get("/state", headers=guest) as resp:
                    return dict(await resp.json())

        state = asyncio.run(asyncio.wait_for(scenario(), 30))
        assert [a["draining"] for a in state["agents"]] == [True]
        assert {r["name"]: r["weight"] for r in state["roles"]}["batch"] == 3.0
