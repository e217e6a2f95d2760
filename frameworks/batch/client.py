"""A blocking client of the batch service's HTTP API (http.client; one call per endpoint).

The service is found from ``--batch``, else ``$AGORA_BATCH`` (either a URL, or ``unix:PATH`` for
its Unix socket), else its Unix socket ``$AGORA_HOME/batch.sock`` when it is there, else the
first line of ``$AGORA_HOME/batch`` (its URL, written by the service when it starts). Through the
socket the service knows who calls (the kernel tells it) and runs the jobs submitted as that
user; over TCP the call carries a bearer token, ``$AGORA_HTTP_TOKEN`` or
``$AGORA_HOME/keys/operator.token``. Every failure is a :class:`~agora.sdk.cli.common.CliError`
with one line to show: the service's ``{"error": ...}`` for a refused call, or which address
could not be reached and why.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agora.frameworks.batch.spec import JobSpec
from agora.sdk.cli.common import CliError
from agora.sdk.discovery import agora_home, http_token

__all__ = ["BATCH_ENV", "BatchClient", "ServiceAddress", "Unreachable", "find_service"]

BATCH_ENV: Final = "AGORA_BATCH"
#: The file under $AGORA_HOME where the service writes its URL.
ENDPOINT_FILE: Final = "batch"
#: The service's Unix socket under $AGORA_HOME (its default ``--unix-socket``).
SOCKET_FILE: Final = "batch.sock"
UNIX_PREFIX: Final = "unix:"


class Unreachable(CliError):
    """The service did not answer (refused, timed out, unresolvable): perhaps it is restarting."""


@dataclass(frozen=True, slots=True)
class ServiceAddress:
    """Where the service is: its Unix ``socket`` (tried first) and/or its TCP ``url``."""

    socket: str | None = None
    url: str | None = None

    def __str__(self) -> str:
        return UNIX_PREFIX + self.socket if self.socket is not None else str(self.url)


def find_service(explicit: str | None, environ: Mapping[str, str] | None = None) -> ServiceAddress:
    """Where the batch service is: ``explicit``, ``$AGORA_BATCH``, ``$AGORA_HOME/batch.sock``,
    else the URL in ``$AGORA_HOME/batch`` (also kept as the fallback of the socket found)."""
    env = os.environ if environ is None else environ
    for candidate in (explicit, env.get(BATCH_ENV)):
        if candidate is not None and candidate.strip():
            return _parse_address(candidate.strip())
    home = agora_home(env)
    try:
        text = (home / ENDPOINT_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    lines = text.strip().splitlines()
    url = _normalize(lines[0]) if lines and lines[0].strip() else None
    sock = home / SOCKET_FILE
    try:
        is_socket = stat.S_ISSOCK(sock.stat().st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        return ServiceAddress(socket=str(sock), url=url)
    if url is not None:
        return ServiceAddress(url=url)
    raise CliError(
        "no batch service found: start one with `agora batch serve` or `agora local` "
        f"(or give --batch URL or --batch unix:PATH, or set ${BATCH_ENV})"
    )


def _parse_address(text: str) -> ServiceAddress:
    if text.startswith(UNIX_PREFIX):
        return ServiceAddress(socket=text[len(UNIX_PREFIX) :])
    if text.startswith(("/", "./")):
        return ServiceAddress(socket=text)
    return ServiceAddress(url=_normalize(text))


def _normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix stream socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _Refused(Exception):
    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(status)
        self.status, self.reason, self.body = status, reason, body


class BatchClient:
    """Calls to the service at ``url`` (found by :func:`find_service` when None), each bounded
    by ``timeout`` seconds."""

    def __init__(
        self,
        url: str | None = None,
        timeout: float = 10.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.address = find_service(url, environ)
        self.url = str(self.address)
        self.timeout = timeout
        self._token = http_token(environ)

    # ---------------------------------------------------------------- calls

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def submit(self, spec: JobSpec) -> dict[str, Any]:
        """``{"job_id": int, "tasks": int}``."""
        return self._call("POST", "/jobs", {"spec": spec.to_json()})

    def jobs(
        self, all: bool = False, user: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """JobViews, newest first (without ``all``: not ended, or ended in the last minutes)."""
        query = _query(all=int(all), user=user, limit=limit)
        return list(self._call("GET", f"/jobs{query}")["jobs"])

    def job(self, job_id: int, tasks: bool = True) -> dict[str, Any]:
        """``{"job": JobView, "tasks": [TaskRecord JSON, ...]}``."""
        query = "" if tasks else _query(tasks=0)
        return self._call("GET", f"/jobs/{job_id}{query}")

    def cancel(self, job_id: int, index: int | None = None) -> int:
        """How many tasks were stopped or dropped."""
        return int(self._call("POST", f"/jobs/{job_id}/cancel", {"index": index})["cancelled"])

    def history(
        self,
        user: str | None = None,
        since: float | None = None,
        job_id: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Ended tasks, by end time, each with its job's name, user and queue."""
        query = _query(user=user, since=since, job=job_id, limit=limit)
        return list(self._call("GET", f"/history{query}")["records"])

    def task(self, job_id: int, index: int) -> dict[str, Any]:
        """``{"task": TaskRecord JSON, "framework_id": str}``."""
        return self._call("GET", f"/jobs/{job_id}/tasks/{index}")

    # ---------------------------------------------------------------- HTTP

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        try:
            raw = self._send(method, path, data)
        except _Refused as exc:
            raise CliError(_refusal(exc)) from None
        except TimeoutError:
            if method == "POST":  # it may have been done: do not invite a blind retry
                raise Unreachable(
                    f"the batch service at {self.url} did not answer within {self.timeout:g}s; "
                    "the request may still have taken effect (see agora batch status)"
                ) from None
            raise Unreachable(
                f"the batch service at {self.url} did not answer within {self.timeout:g}s"
            ) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, a bad URL
            raise Unreachable(f"cannot reach the batch service at {self.url}: {exc}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise CliError(f"the batch service at {self.url} answered something not JSON") from None
        if not isinstance(answer, dict):
            raise CliError(f"the batch service at {self.url} answered an unexpected {answer!r}")
        return answer

    def _send(self, method: str, path: str, data: bytes | None) -> bytes:
        """The body of a 2xx answer; _Refused for another status. Through the Unix socket when
        there is one; over TCP when there is none, or it cannot be connected to and a URL is
        known (a service that had to do without its socket)."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        address = self.address
        conn: http.client.HTTPConnection
        prefix = ""
        if address.socket is not None:
            conn = _UnixConnection(address.socket, self.timeout)
            try:
                conn.connect()
            except OSError:
                conn.close()
                if address.url is None:
                    raise
                self.address = address = ServiceAddress(url=address.url)
                self.url = str(address)
        if address.socket is None:
            assert address.url is not None
            parts = urllib.parse.urlsplit(address.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {address.url!r}")
            kind = (
                http.client.HTTPSConnection
                if parts.scheme == "https"
                else http.client.HTTPConnection
            )
            conn = kind(parts.hostname, parts.port, timeout=self.timeout)
            prefix = parts.path.rstrip("/")
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn.request(method, prefix + path, body=data, headers=headers)
            reply = conn.getresponse()
            raw = reply.read()
        finally:
            conn.close()
        if not 200 <= reply.status < 300:
            raise _Refused(reply.status, reply.reason, raw)
        return raw


def _refusal(exc: _Refused) -> str:
    try:
        body = json.loads(exc.body)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        text = str(body["error"])
    else:
        text = f"the batch service failed: HTTP {exc.status} {exc.reason}"
    if exc.status == 401:
        text += (
            " (over TCP the batch service needs a token: set AGORA_HTTP_TOKEN, or use its Unix "
            "socket, --batch unix:PATH)"
        )
    return text


def _query(**params: Any) -> str:
    given = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""
