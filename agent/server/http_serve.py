"""Starting the agent's HTTP API (``--http-port``) from its settings, and saying how it serves.

Imported by the daemon only when it serves HTTP: :mod:`agora.agent.server.http` loads
prometheus_client, which an agent without HTTP does not need. Without ``--http-credentials`` and
without ``--insecure-http`` every endpoint but /health answers 401; a warning at start says so.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from agora.agent.core import Agent
from agora.agent.server.config import DaemonSettings
from agora.agent.server.http import make_app
from agora.agent.server.http_auth import HttpAuth
from agora.agent.server.metrics import AgentCounters
from agora.sdk.daemon.httpd import start_http
from aiohttp import web

__all__ = ["serve_http"]

log = structlog.get_logger(__name__)


async def serve_http(
    settings: DaemonSettings,
    port: int,
    core: Callable[[], Agent | None],
    work_dir: str,
    counters: AgentCounters,
) -> tuple[web.AppRunner, int] | None:
    """The running app and its bound port (``port`` 0: any free one); None (and logged) when
    it cannot be bound."""
    auth = HttpAuth(settings.http_credentials, insecure=settings.insecure_http)
    app = make_app(core, work_dir, counters, auth)
    try:
        runner, _, bound = await start_http(app, settings.http_bind, port)
    except OSError as exc:
        log.error(
            "http_bind_failed",
            host=settings.http_bind,
            port=port,
            error=str(exc),
        )
        return None
    log.info(
        "http_listening",
        host=settings.http_bind,
        port=bound,
        credentials=settings.http_credentials is not None,
        insecure=settings.insecure_http,
    )
    if settings.http_credentials is None and not settings.insecure_http:
        log.warning(
            "http_api_locked",
            detail="no --http-credentials: every endpoint but /health answers 401; give "
            'a TOML file of principal = "token" lines (agora local writes '
            "$AGORA_HOME/keys/http-credentials.toml), or --insecure-http (implied by "
            "--insecure) to serve without tokens",
        )
    return runner, bound
