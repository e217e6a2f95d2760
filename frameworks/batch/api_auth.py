"""Who is calling the batch service's HTTP API, and its Unix socket.

The same API is served on two listeners. On the Unix socket the caller is the peer the kernel
names (SO_PEERCRED: its uid, then its login from the password database); nothing else is asked.
On TCP every path but ``/health`` needs ``Authorization: Bearer TOKEN`` with a token from
``--http-credentials`` (see :mod:`agora.sdk.daemon.http_auth`), unless the service runs
``--insecure-http``; with neither, TCP serves only ``/health``. A request from a web page
(an ``Origin`` header) is refused on TCP. The identified caller
(:class:`~agora.frameworks.batch.access.Caller`) is stored in the request under :data:`CALLER`;
what it may do is decided by the handlers, with :mod:`agora.frameworks.batch.access`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
from agora.frameworks.batch.access import Caller
from agora.sdk.daemon.http_auth import HttpCredentials, bearer_principal
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "CALLER",
    "ApiAuth",
    "SocketInUse",
    "auth_middleware",
    "caller_of",
    "prepare_socket_path",
    "remove_socket",
    "start_unix",
]

log = structlog.get_logger(__name__)

#: The request key holding the identified Caller.
CALLER: Final = web.RequestKey("agora.batch.caller", Caller)
#: Served to anyone, on either listener.
OPEN_PATHS: Final = frozenset({"/health"})
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="agora-batch"'}
_UCRED: Final = struct.Struct("3i")  # pid, uid, gid

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ApiAuth:
    """The TCP listener's policy: token ``credentials``, or ``insecure_http`` (no tokens)."""

    credentials: HttpCredentials | None = None
    insecure_http: bool = False


class SocketInUse(Exception):
    """Another process serves the Unix socket path (or it is something else than a socket)."""


def caller_of(request: web.Request) -> Caller:
    try:
        return request[CALLER]
    except KeyError:  # pragma: no cover - the middleware always sets it
        raise web.HTTPUnauthorized() from None


def peer_caller(sock: Any) -> Caller:
    """The Unix user at the other end of ``sock`` (AF_UNIX), from SO_PEERCRED."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    _pid, uid, _gid = _UCRED.unpack(raw)
    try:
        login = pwd.getpwuid(uid).pw_name
    except KeyError:
        login = str(uid)
    return Caller.local_user(uid, login)


def auth_middleware(auth: ApiAuth, limiter: KeyedLogLimiter | None = None) -> Middleware:
    """Identify every request's caller (see the module's text), or refuse it. Refusals are
    logged through ``limiter``: a few lines a second per peer (a flood must not flood the log)."""
    limiter = limiter or KeyedLogLimiter()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                request[CALLER] = peer_caller(sock)
            except OSError as exc:
                return refuse(request, 403, f"cannot tell who is calling: {exc}", "unix")
            return await handler(request)
        if request.path in OPEN_PATHS:
            request[CALLER] = Caller()
            return await handler(request)
        if "Origin" in request.headers:
            return refuse(request, 403, "the batch API is not served to web pages (Origin)")
        if auth.insecure_http:
            request[CALLER] = Caller.anonymous()
            return await handler(request)
        if auth.credentials is None:
            return refuse(
                request,
                401,
                "this batch service serves TCP only with --http-credentials (or --insecure-http); "
                "use its Unix socket",
            )
        principal = bearer_principal(
            request.headers.get("Authorization", ""), auth.credentials.tokens
        )
        if principal is None:
            why = "unknown token" if "Authorization" in request.headers else "no token"
            return refuse(request, 401, f"an Authorization: Bearer token is required ({why})")
        request[CALLER] = Caller.token(principal)
        return await handler(request)

    def refuse(
        request: web.Request, status: int, text: str, peer: str | None = None
    ) -> web.StreamResponse:
        who = peer or request.remote or "?"
        if limiter.allow(who, time.monotonic()):
            log.warning(
                "batch_http_refused", status=status, path=request.path, peer=who, reason=text
            )
        headers = _CHALLENGE if status == 401 else None
        return web.json_response({"error": text}, status=status, headers=headers)

    return middleware


def prepare_socket_path(path: Path) -> None:
    """Make ``path``'s directory (mode 0755 when made here) and clear a stale socket left by a
    service that died; SocketInUse when a live service answers there or it is not a socket."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o755)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:  # nobody listens: a dead service's socket
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise SocketInUse(f"another batch service listens on {path}")


async def start_unix(runner: web.AppRunner, path: Path) -> int:
    """Serve ``runner``'s app on the Unix socket ``path`` (mode 0666: every local user may
    connect; each is then who the kernel says). Returns the socket's inode, to tell it is ours."""
    prepare_socket_path(path)
    site = web.UnixSite(runner, str(path))
    await site.start()
    os.chmod(path, 0o666)
    return path.stat().st_ino


def remove_socket(path: Path, inode: int) -> None:
    """Remove ``path`` if it is still the socket this service made."""
    with contextlib.suppress(OSError):
        if path.lstat().st_ino == inode:
            path.unlink()
