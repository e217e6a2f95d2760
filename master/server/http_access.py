"""Who may use the master's operator HTTP API, and where a standby may send them.

Everything but :data:`OPEN_PATHS` needs ``Authorization: Bearer TOKEN`` with a token from
``--http-credentials FILE`` (or ``Basic`` with that token's principal and the token, as Mesos tools
send; see :mod:`agora.sdk.daemon.http_auth`); the request is then made as
that token's principal, which the ACL checks like a CURVE principal (operator calls), while any
known token may read ``/state``, ``/state/summary`` and ``/metrics``. A master without credentials
serves nothing but ``/health`` when CURVE is on (a token-less HTTP API would bypass the
authenticated socket); only a master started ``--insecure`` (no CURVE, no credentials) serves
anonymous requests.

A standby redirects to the leader's API only when the leader's URL came over an authenticated
link (CURVE, election traffic only from the masters' principal): otherwise anyone who could
reach the election port could plant a URL, and clients follow a redirect with their bearer token.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import structlog
from agora.sdk.daemon.http_auth import header_principal
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = ["CHALLENGE", "OPEN", "PRINCIPAL", "HttpAccess", "Refused", "access_middleware"]

log = structlog.get_logger("agora.master.http")

#: The request key the caller's principal is stored under (unset: anonymous).
PRINCIPAL: Final = web.RequestKey("agora_principal", str)
#: Served to anyone: load balancers and `agora` itself find the leader through them; the Mesos
#: ones are open on Mesos too (see :mod:`agora.master.server.mesos_operator`).
OPEN_PATHS: Final = frozenset({"/health", "/version", "/master/health", "/master/redirect"})

#: Sent with every 401.
CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="agora"'}


class Refused(Exception):
    """A request refused before it reaches the master: its HTTP status and text."""

    def __init__(self, status: int, text: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.headers = dict(headers or {})


@dataclass(frozen=True, slots=True)
class HttpAccess:
    """The API's policy. ``tokens``: token -> principal. ``anonymous``: with no tokens, serve
    requests without one (the master runs ``--insecure``). The default serves nobody."""

    tokens: Mapping[str, str] = field(default_factory=dict)
    anonymous: bool = False

    def principal(self, authorization: str) -> str | None:
        """The caller's principal from its ``Authorization`` header (None: anonymous, allowed);
        raises :class:`Refused` when the request may not be served."""
        if not self.tokens:
            if self.anonymous:
                return None
            raise Refused(
                401,
                "this master's HTTP API needs --http-credentials (it runs with CURVE on); "
                "use a token from that file, or the CLI over CURVE",
                CHALLENGE,
            )
        principal = header_principal(authorization, self.tokens)
        if principal is None:
            why = "unknown token" if authorization else "no token"
            raise Refused(
                401, f"an Authorization: Bearer token (or Basic) is required ({why})", CHALLENGE
            )
        return principal


#: For tests and tools that serve a master's views to anyone.
OPEN: Final = HttpAccess(anonymous=True)


def access_middleware(access: HttpAccess, limiter: KeyedLogLimiter | None = None) -> Middleware:
    """Enforce ``access`` on every path but :data:`OPEN_PATHS`; the principal goes to
    ``request[PRINCIPAL]``. Refusals are logged, at most a few lines a second per address."""
    limiter = limiter or KeyedLogLimiter()

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        try:
            principal = access.principal(request.headers.get("Authorization", ""))
        except Refused as exc:
            peer = request.remote or "?"
            if limiter.allow(peer, time.monotonic()):
                log.warning(
                    "http_refused", status=exc.status, path=request.path, peer=peer, reason=str(exc)
                )
            return web.json_response({"error": str(exc)}, status=exc.status, headers=exc.headers)
        if principal is not None:
            request[PRINCIPAL] = principal
        return await handler(request)

    return middleware
