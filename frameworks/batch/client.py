"""A blocking client of the batch service's HTTP API (urllib; one call per endpoint).

The service is found from ``--batch URL``, else ``$AGORA_BATCH``, else the first line of
``$AGORA_HOME/batch`` (written by the service when it starts). Every failure is a
:class:`~agora.sdk.cli.common.CliError` with one line to show: the service's ``{"error": ...}``
for a refused call, or which URL could not be reached and why.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Final

from agora.frameworks.batch.spec import JobSpec
from agora.sdk.cli.common import CliError
from agora.sdk.discovery import agora_home

__all__ = ["BATCH_ENV", "BatchClient", "Unreachable", "find_service"]

BATCH_ENV: Final = "AGORA_BATCH"
#: The file under $AGORA_HOME where the service writes its URL.
ENDPOINT_FILE: Final = "batch"


class Unreachable(CliError):
    """The service did not answer (refused, timed out, unresolvable): perhaps it is restarting."""


def find_service(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The batch service's base URL: ``explicit``, ``$AGORA_BATCH``, else ``$AGORA_HOME/batch``."""
    env = os.environ if environ is None else environ
    for candidate in (explicit, env.get(BATCH_ENV)):
        if candidate is not None and candidate.strip():
            return _normalize(candidate)
    try:
        text = (agora_home(env) / ENDPOINT_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    lines = text.strip().splitlines()
    if lines and lines[0].strip():
        return _normalize(lines[0])
    raise CliError(
        "no batch service found: start one with `agora batch serve` or `agora local` "
        f"(or give --batch URL, or set ${BATCH_ENV})"
    )


def _normalize(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


class BatchClient:
    """Calls to the service at ``url`` (found by :func:`find_service` when None), each bounded
    by ``timeout`` seconds."""

    def __init__(self, url: str | None = None, timeout: float = 10.0) -> None:
        self.url = find_service(url)
        self.timeout = timeout

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
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as exc:
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
        except (OSError, ValueError) as exc:  # refused, unresolvable, a bad URL
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, TimeoutError) and method == "POST":
                raise Unreachable(
                    f"the batch service at {self.url} did not answer in time; the request may "
                    "still have taken effect (see agora batch status)"
                ) from None
            raise Unreachable(f"cannot reach the batch service at {self.url}: {reason}") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise CliError(f"the batch service at {self.url} answered something not JSON") from None
        if not isinstance(answer, dict):
            raise CliError(f"the batch service at {self.url} answered an unexpected {answer!r}")
        return answer


def _refusal(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
    except (OSError, ValueError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return f"the batch service failed: HTTP {exc.code} {exc.reason}"


def _query(**params: Any) -> str:
    given = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(given) if given else ""
