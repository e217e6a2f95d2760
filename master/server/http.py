"""The operator HTTP API: read-only JSON views of the master and Prometheus metrics.

Served by aiohttp in the daemon's own event loop. Handlers read the core synchronously (no
``await`` while building a reply), so every reply is a consistent view between two core calls.

- ``GET /health``: ``{"status": "ok"}``.
- ``GET /state``: master info, agents, frameworks (with DRF share), tasks, offers, roles.
- ``GET /state/summary``: counts only.
- ``GET /metrics``: Prometheus text format, from the daemon's own registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agora.master.allocator import AllocatorError
from agora.master.core import Master
from agora.master.core.operator import snapshot
from agora.master.server.metrics import DaemonStats, count, make_registry
from agora.sdk.httpd import json_errors
from agora.sdk.httpd import start_http as listen
from agora.sdk.messages import AgentSummary, ContainerUsage, FrameworkSummary, TaskSummary
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["make_app", "start_http", "state_json", "summary_json"]


def state_json(core: Master, stats: DaemonStats) -> dict[str, Any]:
    """The full ``/state`` document, as plain JSON values."""
    st = core.state
    snap = snapshot(st)
    alloc = st.allocator
    info = snap.master_info
    cfg = st.config
    roles = set(cfg.roles) | cfg.weights.keys() | cfg.quotas.keys()
    for fw in st.frameworks.values():
        roles.update(fw.info.roles)
    role_rows = []
    for role in sorted(roles):
        quota = cfg.quotas.get(role)
        role_rows.append(
            {
                "name": role,
                "weight": cfg.weights.get(role, 1.0),
                "quota": None
                if quota is None
                else {
                    "guarantee": quota[0].to_dict(),
                    "limit": None if quota[1] is None else quota[1].to_dict(),
                },
                "share": alloc.role_share(role),
            }
        )
    return {
        "master": {
            "id": info.master_id,
            "epoch": info.epoch,
            "address": info.address,
            "uptime": stats.uptime(),
            "elected": True,
        },
        "agents": [_agent(a) for a in snap.agents],
        "frameworks": [_framework(core, f) for f in snap.frameworks],
        "tasks": [_task(t) for t in snap.tasks],
        "offers": {"outstanding": len(st.offers)},
        "roles": role_rows,
    }


def summary_json(core: Master) -> dict[str, Any]:
    """The ``/state/summary`` document: counts, no per-object rows."""
    c = count(core)
    return {
        "agents": c.agents,
        "frameworks": c.frameworks,
        "tasks": {state: n for state, n in c.tasks.items() if n},
        "offers": {"outstanding": c.offers},
        "resources": {"total": c.total, "allocated": c.allocated},
    }


def _agent(a: AgentSummary) -> dict[str, Any]:
    return {
        "id": a.agent_id,
        "hostname": a.hostname,
        "port": a.port,
        "http_port": a.http_port,
        "address": a.address,
        "status": a.status,
        "resources": a.resources.to_dict(),
        "allocated": a.allocated.to_dict(),
        "attributes": dict(a.attributes),
    }


def _framework(core: Master, f: FrameworkSummary) -> dict[str, Any]:
    share: float | None = None
    if f.active:
        try:
            share = core.state.allocator.share(f.framework_id)
        except AllocatorError:
            share = None
    return {
        "id": f.framework_id,
        "name": f.name,
        "roles": list(f.roles),
        "active": f.active,
        "connected": f.connected,
        "user": f.user,
        "principal": f.principal,
        "share": share,
    }


def _task(t: TaskSummary) -> dict[str, Any]:
    return {
        "id": t.task_id,
        "name": t.name,
        "framework_id": t.framework_id,
        "agent_id": t.agent_id,
        "state": t.state.value,
        "reason": None if t.reason is None else t.reason.value,
        "message": t.message,
        "exit_code": t.exit_code,
        "resources": t.resources.to_dict(),
        "timestamp": t.timestamp,
        "usage": None if t.usage is None else _usage(t.usage),
    }


def _usage(u: ContainerUsage) -> dict[str, Any]:
    return {
        "cpu_seconds": u.cpu_seconds,
        "rss_bytes": u.rss_bytes,
        "mem_limit_bytes": u.mem_limit_bytes,
        "cpu_limit": u.cpu_limit,
        "timestamp": u.timestamp,
    }


def make_app(
    core: Callable[[], Master | None],
    stats: DaemonStats,
    leader: Callable[[], dict[str, Any]] | None = None,
) -> web.Application:
    """The operator app around the current core (None on a standby, which answers /state with
    503 and ``leader()``: where the leader is); metrics go to a registry of this app's own."""
    registry = make_registry(core, stats)

    def _standby() -> web.StreamResponse:
        body = {"error": "this master is not the leader", **(leader() if leader else {})}
        return web.json_response(body, status=503)

    async def health(_: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = {"status": "ok", "leading": core() is not None}
        if leader is not None:
            body.update(leader())
        return web.json_response(body)

    async def state(_: web.Request) -> web.StreamResponse:
        current = core()
        return _standby() if current is None else web.json_response(state_json(current, stats))

    async def summary(_: web.Request) -> web.StreamResponse:
        current = core()
        return _standby() if current is None else web.json_response(summary_json(current))

    async def metrics(_: web.Request) -> web.StreamResponse:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/health", health)
    app.router.add_get("/state", state)
    app.router.add_get("/state/summary", summary)
    app.router.add_get("/metrics", metrics)
    return app


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Listen on ``host:port`` (0: ephemeral); the runner (``cleanup()`` it) and the base URL."""
    runner, bound_host, bound_port = await listen(app, host, port)
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{shown}:{bound_port}"
