"""Who may use the agent HTTP API: everything but ``/health`` needs ``Authorization: Bearer
TOKEN`` with a token from ``--http-credentials FILE`` (see
:mod:`agora.sdk.daemon.http_auth`), unless the agent runs ``--insecure-http``. With neither,
every other endpoint answers 401.

A request with an ``Origin`` header (a web page's) is refused with 403. Any known token may read
``/state`` and ``/metrics``; a task's files only the principal of the task's framework (as its
FrameworkInfo says) or an operator (the file's ``operators``, by default every principal in it).
Refusals are logged, at most a few lines a second per client address.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import structlog
from agora.sdk.daemon.http_auth import HttpCredentials, bearer_principal
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = ["PRINCIPAL", "HttpAuth", "auth_middleware", "may_read_files"]

log = structlog.get_logger("agora.agent.http")

#: The request key the middleware stores the caller's principal under (unset: insecure).
PRINCIPAL: Final = web.RequestKey("agora_principal", str)
#: Served to anyone.
OPEN_PATHS: Final = frozenset({"/health"})
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="agora"'}


@dataclass(frozen=True, slots=True)
class HttpAuth:
    """The agent's HTTP policy: its credentials, or ``insecure`` (no tokens needed); neither:
    only /health is served."""

    credentials: HttpCredentials | None = None
    insecure: bool = False


def may_read_files(principal: str | None, owner: str | None, auth: HttpAuth) -> bool:
    """Whether ``principal`` (None: an insecure agent's anonymous caller) may read the files of a
    task whose framework's principal is ``owner`` (None: none, or the agent forgot it)."""
    if auth.insecure:
        return True
    if principal is None or auth.credentials is None:
        return False
    return principal in auth.credentials.operators or (owner is not None and principal == owner)


def auth_middleware(auth: HttpAuth, limiter: KeyedLogLimiter | None = None) -> Middleware:
    """The aiohttp middleware enforcing ``auth``; it stores the principal as ``PRINCIPAL``."""
    limiter = limiter or KeyedLogLimiter()

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        if "Origin" in request.headers:
            return refuse(request, 403, "the agent HTTP API is not served to web pages (Origin)")
        if auth.insecure:
            return await handler(request)  # no principal: anonymous
        if auth.credentials is None:
            return refuse(
                request,
                401,
                "this agent serves its HTTP API only with --http-credentials (or --insecure-http)",
            )
        principal = bearer_principal(
            request.headers.get("Authorization", ""), auth.credentials.tokens
        )
        if principal is None:
            why = "unknown token" if "Authorization" in request.headers else "no token"
            return refuse(request, 401, f"an Authorization: Bearer token is required ({why})")
        request[PRINCIPAL] = principal
        return await handler(request)

    def refuse(request: web.Request, status: int, text: str) -> web.StreamResponse:
        log_refusal(request, status, text, limiter)
        headers = _CHALLENGE if status == 401 else None
        return web.json_response({"error": text}, status=status, headers=headers)

    return middleware


def log_refusal(
    request: web.Request, status: int, text: str, limiter: KeyedLogLimiter, principal: str = ""
) -> None:
    """Log a refused request, rate-limited per client address."""
    peer = request.remote or "?"
    if limiter.allow(peer, time.monotonic()):
        log.warning(
            "http_refused",
            status=status,
            path=request.path,
            peer=peer,
            principal=principal or None,
            reason=text,
        )
