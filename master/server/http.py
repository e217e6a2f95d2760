"""The operator HTTP API: JSON views of the master, Prometheus metrics, and operator calls.

Served by aiohttp in the daemon's own event loop. Handlers read the core synchronously (no
``await`` while building a reply), so every reply is a consistent view between two core calls.

- ``GET /health``: ``{"status": "ok", "leading": ...}`` and where the leader is. ``leading`` (and
  everything else that says this master leads) holds only while its leader lease does: ``core()``
  is None otherwise, see ``Leadership.leading``.
- ``GET /state``: the masters, agents, frameworks (DRF share, offers, tasks by state), tasks,
  outstanding offers, roles (weight, quota, share).
- ``GET /state/summary``: counts only.
- ``GET /metrics``: Prometheus text format, from the daemon's own registry.
- Operator calls (POST): see :mod:`http_calls`.
- The Mesos operator endpoints and scheduler API: see :mod:`mesos_operator` and
  :mod:`mesos_scheduler`.

Everything but ``/health`` needs a bearer token, unless the master runs ``--insecure``; a standby
redirects only to a leader URL it learnt over an authenticated link: see :mod:`http_access`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agora.master.core import Master
from agora.master.server import mesos_operator, mesos_scheduler
from agora.master.server.http_access import HttpAccess, access_middleware
from agora.master.server.http_calls import MAX_BODY, Operator, add_routes
from agora.master.server.metrics import DaemonStats, count, make_registry
from agora.master.server.state_doc import StateDocument
from agora.sdk.daemon.httpd import json_errors
from agora.sdk.daemon.httpd import start_http as listen
from agora.sdk.messages import (
    MasterMember,
)
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["Operator", "make_app", "start_http", "state_json", "summary_json"]


def state_json(
    core: Master, stats: DaemonStats, masters: tuple[MasterMember, ...] = ()
) -> dict[str, Any]:
    """The full ``/state`` document, as plain JSON values (``masters``: the election group)."""
    return StateDocument().build(core, stats, masters)


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


def make_app(
    core: Callable[[], Master | None],
    stats: DaemonStats,
    leader: Callable[[], dict[str, Any]] | None = None,
    *,
    members: Callable[[], tuple[MasterMember, ...]] = tuple,
    operator: Operator | None = None,
    access: HttpAccess | None = None,
    redirect: bool = False,
) -> web.Application:
    """The operator app around the current core (None on a standby). ``operator``: make operator
    calls (POST routes); without it there are none. ``access``: who may use the app (by default
    ``operator``'s tokens, or nobody without an operator): every path but ``/health`` needs it.

    With ``redirect`` (the leader's URL came over an authenticated link), a standby redirects
    ``/state``, ``/state/summary`` and operator calls to the leader's API (307, from
    ``leader()["leader_http"]``); otherwise, or when that URL is not known, it answers 503 with
    where the leader is. Metrics go to a registry of this app's own."""
    registry = make_registry(core, stats)
    document = StateDocument()

    def standby(request: web.Request) -> web.StreamResponse | None:
        if core() is not None:
            return None
        where = leader() if leader is not None else {}
        url = where.get("leader_http")
        body = {"error": "this master is not the leader", **where}
        if url and redirect:
            location = url.rstrip("/") + request.path_qs
            return web.json_response(body, status=307, headers={"Location": location})
        return web.json_response(body, status=503, headers={"Retry-After": "1"})

    async def health(_: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = {"status": "ok", "leading": core() is not None}
        if leader is not None:
            body.update(leader())
        return web.json_response(body)

    async def state(request: web.Request) -> web.StreamResponse:
        current = core()
        if current is None:
            return _redirected(standby(request))
        body = await document.encode(current, stats, members())
        if core() is not current:  # leadership changed while it was built, a turn at a time
            return _redirected(standby(request))
        return web.Response(body=body, content_type="application/json")

    async def summary(request: web.Request) -> web.StreamResponse:
        current = core()
        if current is None:
            return _redirected(standby(request))
        return web.json_response(summary_json(current))

    async def metrics(_: web.Request) -> web.StreamResponse:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    if access is None:
        access = operator.access if operator is not None else HttpAccess()
    app = web.Application(
        middlewares=[json_errors, access_middleware(access)], client_max_size=MAX_BODY
    )
    app.router.add_get("/health", health)
    app.router.add_get("/state", state)
    app.router.add_get("/state/summary", summary)
    app.router.add_get("/metrics", metrics)

    async def state_document() -> dict[str, Any] | None:
        current = core()
        if current is None:
            return None
        built = await document.build_async(current, stats, members())
        return built if core() is current else None

    mesos_operator.add_routes(
        app, core, stats, leader, redirect=redirect, document=state_document, standby=standby
    )
    if operator is not None:
        add_routes(app, operator, standby)
        if operator.submit is not None and operator.streams is not None:
            mesos_scheduler.add_routes(
                app,
                core=core,
                streams=operator.streams,
                submit=operator.submit,
                standby=standby,
                timeout=operator.timeout,
            )
    return app


def _redirected(answer: web.StreamResponse | None) -> web.StreamResponse:
    # (A response is a mapping, so ``answer or ...`` would test its length, not None.)
    return answer if answer is not None else web.json_response({"error": "no leader"}, status=503)


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Listen on ``host:port`` (0: ephemeral); the runner (``cleanup()`` it) and the base URL."""
    runner, bound_host, bound_port = await listen(app, host, port)
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{shown}:{bound_port}"
