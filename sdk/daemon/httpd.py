"""The daemons' read-only HTTP APIs share this: JSON errors and starting a server in the loop.

aiohttp runs inside the daemon's own event loop; a handler that fails answers a JSON error and
never takes the daemon down.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

__all__ = ["HttpError", "json_errors", "start_http"]

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """A request that cannot be served: ``status`` is the HTTP status, the message its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors as ``{"error", "path"}`` JSON; anything unexpected is logged and answers 500."""
    try:
        return await handler(request)
    except HttpError as exc:
        return web.json_response({"error": str(exc), "path": request.path}, status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "path": request.path}, status=exc.status)
    except Exception:
        log.exception("http_handler_failed", path=request.path)
        return web.json_response({"error": "internal error", "path": request.path}, status=500)


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str, int]:
    """Listen on ``host:port`` (0: any free port); the runner (``cleanup()`` it), host and port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, str(bound_host), int(bound_port)
