"""Mesos-compatible operator endpoints on the master.

- ``GET /version``: the Mesos API level Agora speaks (``1.11.0``); open, as on Mesos.
- ``GET /master/health``: 200, empty body, on any running master (as Mesos); open.
- ``GET /master/redirect``: 307 to ``//host:port`` of the leader (itself when it leads; a
  standby only to a leader URL learnt over an authenticated link); 503 when none is known. Open.
- ``GET /metrics/snapshot``: flat JSON with Mesos's metric names where Agora has counterparts;
  needs the same access as ``/state``.

- ``POST /api/v1`` (JSON only; protobuf: 415): ``GET_HEALTH``, ``GET_VERSION``, ``GET_METRICS``
  in the Mesos v1 operator API's shapes; other known call types 501, unknown ones 400.

- ``GET /master/state`` (also ``/master/state.json``) and ``GET /state.json``, and the
  ``/api/v1`` calls GET_STATE, GET_AGENTS, GET_FRAMEWORKS and GET_TASKS: the state in Mesos's
  shapes (see :mod:`agora.master.server.mesos_state`); a standby answers them as it answers
  ``/state``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
from agora.master.core import Master
from agora.master.core.view import SCALARS
from agora.master.server.mesos_state import STATE_CALLS, master_state, state_call
from agora.master.server.metrics import DaemonStats, count
from aiohttp import web

__all__ = ["MESOS_VERSION", "OPEN_PATHS", "add_routes", "operator_call", "snapshot"]

#: The Mesos API level Agora speaks (what pymesos and other clients check).
MESOS_VERSION: Final = "1.11.0"
#: Served to anyone, as Mesos does.
OPEN_PATHS: Final = frozenset({"/version", "/master/health", "/master/redirect"})


def snapshot(core: Master | None, stats: DaemonStats) -> dict[str, float]:
    """``/metrics/snapshot``: Mesos metric names, from the core's counts (pure)."""
    out: dict[str, float] = {
        "master/elected": 1 if core is not None else 0,
        "master/uptime_secs": float(stats.uptime()),
    }
    if core is None:
        return out
    c = count(core)
    out["master/slaves_active"] = c.agents.get("ACTIVE", 0)
    out["master/slaves_unreachable"] = c.agents.get("UNREACHABLE", 0)
    out["master/slaves_disconnected"] = c.agents.get("DISCONNECTED", 0)
    out["master/slaves_connected"] = c.agents.get("ACTIVE", 0) - c.agents.get("DISCONNECTED", 0)
    out["master/frameworks_active"] = c.frameworks["active"]
    out["master/frameworks_inactive"] = c.frameworks["inactive"]
    out["master/frameworks_connected"] = c.frameworks["connected"]
    out["master/frameworks_disconnected"] = c.frameworks["disconnected"]
    out["master/outstanding_offers"] = c.offers
    for state in (
        "STAGING", "STARTING", "RUNNING", "KILLING", "FINISHED", "FAILED", "KILLED", "LOST",
        "ERROR", "DROPPED", "GONE", "UNREACHABLE",
    ):  # fmt: skip
        out[f"master/tasks_{state.lower()}"] = c.tasks.get(state, 0)
    for name in SCALARS:
        total = c.total.get(name, 0.0)
        used = c.allocated.get(name, 0.0)
        out[f"master/{name}_total"] = total
        out[f"master/{name}_used"] = used
        out[f"master/{name}_percent"] = used / total if total else 0.0
    return out


#: The Mesos v1 master call types (include/mesos/v1/master/master.proto); those not served
#: here or in :data:`~agora.master.server.mesos_state.STATE_CALLS` are answered 501.
V1_CALLS: Final = frozenset({
    "GET_FLAGS", "GET_LOGGING_LEVEL", "SET_LOGGING_LEVEL", "LIST_FILES", "READ_FILE", "GET_STATE",
    "GET_AGENTS", "GET_FRAMEWORKS", "GET_EXECUTORS", "GET_OPERATIONS", "GET_TASKS", "GET_ROLES",
    "GET_WEIGHTS", "UPDATE_WEIGHTS", "GET_MASTER", "SUBSCRIBE", "RESERVE_RESOURCES",
    "UNRESERVE_RESOURCES", "CREATE_VOLUMES", "DESTROY_VOLUMES", "GROW_VOLUME", "SHRINK_VOLUME",
    "GET_MAINTENANCE_STATUS", "GET_MAINTENANCE_SCHEDULE", "UPDATE_MAINTENANCE_SCHEDULE",
    "START_MAINTENANCE", "STOP_MAINTENANCE", "DRAIN_AGENT", "DEACTIVATE_AGENT",
    "REACTIVATE_AGENT", "GET_QUOTA", "UPDATE_QUOTA", "SET_QUOTA", "REMOVE_QUOTA",
    "TEARDOWN", "MARK_AGENT_GONE",
})  # fmt: skip


def operator_call(
    call: Any, core: Master | None, stats: DaemonStats
) -> tuple[int, dict[str, Any] | str]:
    """A decoded ``/api/v1`` JSON body -> (HTTP status, JSON answer or error text). Pure."""
    kind = call.get("type") if isinstance(call, dict) else None
    if kind == "GET_HEALTH":
        return 200, {"type": kind, "get_health": {"healthy": True}}
    if kind == "GET_VERSION":
        info = {"version": MESOS_VERSION, "build_user": "agora"}
        return 200, {"type": kind, "get_version": {"version_info": info}}
    if kind == "GET_METRICS":
        metrics = [{"name": n, "value": v} for n, v in snapshot(core, stats).items()]
        return 200, {"type": kind, "get_metrics": {"metrics": metrics}}
    if isinstance(kind, str) and kind in V1_CALLS - STATE_CALLS:
        return 501, f"Agora does not serve the v1 operator call {kind} yet"
    return 400, f"Failed to validate master::Call: unknown or missing 'type' {kind!r}"


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return "//" + parts.netloc


async def _json_off_loop(translate: Callable[..., Any], *args: Any) -> web.Response:
    """``translate(*args)`` as a JSON response, translated and encoded in a worker thread: it
    reads only the document this request built, and at 100,000 tasks it takes long enough to
    delay the election's heartbeats if it ran on the event loop."""

    def encode() -> bytes:
        return orjson.dumps(translate(*args))

    body = await asyncio.to_thread(encode)
    return web.Response(body=body, content_type="application/json")


def add_routes(
    app: web.Application,
    core: Callable[[], Master | None],
    stats: DaemonStats,
    leader: Callable[[], dict[str, Any]] | None = None,
    *,
    redirect: bool = False,
    document: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
    standby: Callable[[web.Request], web.StreamResponse | None] = lambda _: None,
) -> None:
    """Add the Mesos operator routes to the master's operator ``app``. ``document``: builds
    Agora's ``/state`` document (None on a standby; without it, state is never served);
    ``standby``: a standby's answer to a state request (a redirect to the leader, or 503)."""

    async def state_document() -> dict[str, Any] | None:
        return None if document is None else await document()

    async def version(_: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"version": MESOS_VERSION, "build_user": "agora", "git_tag": MESOS_VERSION}
        )

    async def health(_: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def master_redirect(request: web.Request) -> web.StreamResponse:
        if core() is not None:
            return web.Response(status=307, headers={"Location": "//" + request.host})
        url = (leader() if leader is not None else {}).get("leader_http")
        if url and redirect:
            return web.Response(status=307, headers={"Location": _host_port(url)})
        return web.Response(status=503, text="No leading master")

    async def metrics_snapshot(_: web.Request) -> web.StreamResponse:
        return web.json_response(snapshot(core(), stats))

    async def api_v1(request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return web.Response(
                status=415,
                text=f"Agora serves /api/v1 as application/json only, not {request.content_type}",
            )
        try:
            call = await request.json()
        except ValueError:
            return web.Response(status=400, text="Failed to parse body into JSON")
        kind = call.get("type") if isinstance(call, dict) else None
        if kind in STATE_CALLS:
            doc = await state_document()
            if doc is None:
                return standby(request) or web.Response(status=503, text="No leading master")
            return await _json_off_loop(state_call, str(kind), doc, MESOS_VERSION)
        status, answer = operator_call(call, core(), stats)
        if isinstance(answer, str):
            return web.Response(status=status, text=answer)
        return web.json_response(answer, status=status)

    async def state(request: web.Request) -> web.StreamResponse:
        doc = await state_document()
        if doc is None:
            return standby(request) or web.Response(status=503, text="No leading master")
        return await _json_off_loop(master_state, doc, MESOS_VERSION)

    app.router.add_get("/master/state", state)
    app.router.add_get("/master/state.json", state)
    app.router.add_get("/state.json", state)
    app.router.add_get("/version", version)
    app.router.add_post("/api/v1", api_v1)
    app.router.add_get("/master/health", health)
    app.router.add_get("/master/redirect", master_redirect)
    app.router.add_get("/metrics/snapshot", metrics_snapshot)
