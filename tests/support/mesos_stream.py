"""A bare Mesos v1 scheduler API client for tests: one SUBSCRIBE stream read event by event,
and calls answered with their HTTP status, so a test sees exactly what the master answered."""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


def basic(principal: str, token: str) -> dict[str, str]:
    """The ``Authorization`` header Mesos clients send."""
    raw = base64.b64encode(f"{principal}:{token}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def post(
    url: str, call: Any, headers: dict[str, str] | None = None, *, raw: bytes | None = None
) -> tuple[int, str, dict[str, str]]:
    """POST one call to ``/api/v1/scheduler``: status, body text, headers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        body = raw if raw is not None else json.dumps(call).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request("POST", "/api/v1/scheduler", body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace"), dict(resp.headers)
    finally:
        conn.close()


@dataclass
class Subscription:
    """An open SUBSCRIBE stream."""

    conn: http.client.HTTPConnection
    response: http.client.HTTPResponse
    stream_id: str
    headers: dict[str, str]
    seen: list[dict[str, Any]] = field(default_factory=list)

    def next_event(self) -> dict[str, Any] | None:
        """The next event (None: the master closed the stream)."""
        line = self.response.readline()
        if not line:
            return None
        data = self.response.read(int(line))
        event = json.loads(data)
        self.seen.append(event)
        return dict(event)

    def wait(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> dict[str, Any]:
        """The first event from now on that ``match`` accepts (HEARTBEATs are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.next_event()
            if event is None:
                raise AssertionError(f"the stream ended; events: {self.seen}")
            if match(event):
                return event
        raise AssertionError(f"no matching event in {timeout} s; events: {self.seen}")

    def call(self, call: dict[str, Any], url: str) -> tuple[int, str]:
        status, text, _ = post(url, call, {**self.headers, "Mesos-Stream-Id": self.stream_id})
        return status, text

    def close(self) -> None:
        self.conn.close()


def subscribe(
    url: str, framework_info: dict[str, Any], headers: dict[str, str] | None = None
) -> Subscription | tuple[int, str]:
    """SUBSCRIBE; the open stream, or (status, text) when refused."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    body: dict[str, Any] = {"type": "SUBSCRIBE", "subscribe": {"framework_info": framework_info}}
    if "id" in framework_info:
        body["framework_id"] = framework_info["id"]
    hdrs = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    conn.request("POST", "/api/v1/scheduler", body=json.dumps(body).encode(), headers=hdrs)
    resp = conn.getresponse()
    if resp.status != 200:
        text = resp.read().decode(errors="replace")
        conn.close()
        return resp.status, text
    return Subscription(conn, resp, resp.headers["Mesos-Stream-Id"], dict(headers or {}))
