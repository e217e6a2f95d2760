"""Operator calls over the master's HTTP API: each route's message, the answers' statuses,
authentication by bearer token, hostile bodies, and a standby's redirect to the leader.

The daemon's ``call`` is played by a recorder; the real path (daemon, ACL, core) is covered by
tests/integration/test_master_http_daemon.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agora.master.server.daemon import NotActing
from agora.master.server.http import make_app
from agora.master.server.http_calls import MAX_BODY, Operator, load_credentials
from agora.master.server.metrics import DaemonStats
from agora.master.server.process import _advertised_http
from agora.sdk.daemon.httpd import start_http
from agora.sdk.messages import (
    CancelMaintenance,
    DrainAgent,
    Error,
    ErrorCode,
    MarkAgentGone,
    Message,
    OperatorDone,
    OperatorKill,
    ReactivateAgent,
    RoleWeight,
    ScheduleMaintenance,
    TeardownFramework,
    UpdateQuota,
    UpdateWeights,
)
from agora.sdk.resources import Resources
from aiohttp.test_utils import TestClient, TestServer
from support.master_kit import Harness

T = TypeVar("T")
TOKEN = "s3cret-token-of-ops"


class Recorder:
    """Plays the daemon: records (message, principal) and answers as told."""

    def __init__(self, answer: Message | BaseException | None = None) -> None:
        self.calls: list[tuple[Message, str | None]] = []
        self.answer = answer

    async def __call__(self, message: Message, principal: str | None, timeout: float) -> Message:
        self.calls.append((message, principal))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer or OperatorDone(call=message.NAME, message="done")


def _run(
    operator: Operator,
    body: Callable[[TestClient[Any, Any]], Awaitable[T]],
    *,
    leading: bool = True,
    leader_http: str | None = None,
    redirect: bool = True,
) -> T:
    h = Harness()

    async def run() -> T:
        app = make_app(
            lambda: h.master if leading else None,
            DaemonStats(),
            lambda: {"leader": "tcp://10.0.0.1:5050", "leader_http": leader_http},
            operator=operator,
            redirect=redirect,
        )
        async with TestClient(TestServer(app)) as client:
            return await asyncio.wait_for(body(client), timeout=10)

    return asyncio.run(run())


async def _post(
    client: TestClient[Any, Any],
    path: str,
    json: Any = None,
    *,
    status: int = 200,
    token: str | None = None,
    method: str = "POST",
) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = await client.request(method, path, json=json, headers=headers, allow_redirects=False)
    assert resp.status == status, await resp.text()
    return await resp.json()


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        (
            "POST",
            "/weights",
            {"weights": {"batch": 2, "mpi": 0.5}},
            UpdateWeights(
                weights=(RoleWeight(role="batch", weight=2.0), RoleWeight(role="mpi", weight=0.5))
            ),
        ),
        (
            "POST",
            "/quota",
            {"role": "batch", "guarantee": "cpus:4;mem:1024", "limit": "cpus:8"},
            UpdateQuota(
                role="batch",
                guarantee=Resources.parse("cpus:4;mem:1024"),
                limit=Resources.parse("cpus:8"),
            ),
        ),
        ("DELETE", "/quota/batch", None, UpdateQuota(role="batch")),
        ("POST", "/agents/e1-A3/drain", None, DrainAgent(agent_id="e1-A3")),  # type: ignore[arg-type]
        ("POST", "/agents/e1-A3/reactivate", None, ReactivateAgent(agent_id="e1-A3")),  # type: ignore[arg-type]
        (
            "POST",
            "/agents/e1-A3/drain",
            {"deadline": 1700000000},
            DrainAgent(agent_id="e1-A3", deadline=1.7e9),  # type: ignore[arg-type]
        ),
        (
            "POST",
            "/maintenance",
            {"agents": ["e1-A3", "e1-A4"], "start": 1700000000, "duration": 3600},
            ScheduleMaintenance(agent_ids=("e1-A3", "e1-A4"), start=1.7e9, duration=3600.0),  # type: ignore[arg-type]
        ),
        (
            "POST",
            "/maintenance/cancel",
            {"agents": ["e1-A3"]},
            CancelMaintenance(agent_ids=("e1-A3",)),  # type: ignore[arg-type]
        ),
        ("POST", "/agents/e1-A3/gone", None, MarkAgentGone(agent_id="e1-A3")),  # type: ignore[arg-type]
        (
            "POST",
            "/frameworks/e1-F2/teardown",
            None,
            TeardownFramework(framework_id="e1-F2"),  # type: ignore[arg-type]
        ),
        (
            "POST",
            "/tasks/t1/kill?framework_id=e1-F2",
            None,
            OperatorKill(task_id="t1", framework_id="e1-F2"),  # type: ignore[arg-type]
        ),
    ],
)
def test_each_route_makes_its_call(method: str, path: str, body: Any, expected: Message) -> None:
    calls = Recorder()
    got = _run(Operator(calls), lambda c: _post(c, path, body, method=method))
    assert got == {"ok": True, "call": expected.NAME, "message": "done"}
    assert calls.calls == [(expected, None)]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.BAD_REQUEST, 400),
        (ErrorCode.FORBIDDEN, 403),
        (ErrorCode.UNKNOWN_AGENT, 404),
        (ErrorCode.UNKNOWN_FRAMEWORK, 404),
        (ErrorCode.NOT_LEADER, 503),
        (ErrorCode.INTERNAL, 500),
    ],
)
def test_a_refusal_keeps_its_reason_and_gets_a_matching_status(
    code: ErrorCode, status: int
) -> None:
    calls = Recorder(Error(message="DRAIN_AGENT: no agent x", code=code))
    got = _run(Operator(calls), lambda c: _post(c, "/agents/x/drain", status=status))
    assert got == {"error": "DRAIN_AGENT: no agent x", "code": code.value}


def test_not_acting_is_503_and_no_answer_is_504() -> None:
    got = _run(
        Operator(Recorder(NotActing("lease lapsed"))),
        lambda c: _post(c, "/agents/x/drain", status=503),
    )
    assert "lease lapsed" in got["error"]
    got = _run(
        Operator(Recorder(TimeoutError()), timeout=0.5),
        lambda c: _post(c, "/agents/x/drain", status=504),
    )
    assert "may still take effect" in got["error"]


@pytest.mark.parametrize(
    ("path", "body", "why"),
    [
        ("/weights", {"weights": {"batch": 0}}, "weights"),
        ("/weights", {"weights": {"batch": -1}}, "weights"),
        ("/weights", {"weights": {"batch": True}}, "number"),
        ("/weights", {"weights": {"batch": "2"}}, "number"),
        ("/weights", {"weights": {}}, "expected"),
        ("/weights", [1, 2], "JSON object"),
        ("/weights", {"weights": {"x" * 5000: 1}}, "weights"),
        ("/quota", {"role": "batch", "guarantee": 4}, "text form"),
        ("/quota", {"role": "batch", "guarantee": "cpus:four"}, "cpus"),
        ("/quota", {"role": "batch", "guarantee": "cpus:1", "extra": 1}, "unknown fields"),
        ("/quota", {"guarantee": "cpus:1"}, "expected"),
        ("/quota", {"role": "batch"}, "DELETE"),
        ("/agents/x/drain", {"deadline": "soon"}, "deadline must be a number"),
        ("/agents/x/drain", {"when": 1}, "expected"),
        ("/maintenance", {"agents": ["x"], "start": 1}, "expected"),
        ("/maintenance", {"agents": [], "start": 1, "duration": 60}, "non-empty list"),
        ("/maintenance", {"agents": ["x"], "start": 1, "duration": -60}, "duration"),
        ("/maintenance/cancel", {"agents": "x"}, "non-empty list"),
    ],
)
def test_bad_bodies_are_400_and_make_no_call(path: str, body: Any, why: str) -> None:
    calls = Recorder()
    got = _run(Operator(calls), lambda c: _post(c, path, body, status=400))
    assert why in got["error"]
    assert calls.calls == []


def test_malformed_and_oversized_bodies_are_refused() -> None:
    calls = Recorder()

    async def scenario(client: TestClient[Any, Any]) -> None:
        resp = await client.post("/weights", data=b"{not json")
        assert resp.status == 400 and "not JSON" in (await resp.json())["error"]
        resp = await client.post("/weights", data=b"[" * 100_000 + b"]" * 100_000)
        assert resp.status == 400 and "not JSON" in (await resp.json())["error"]
        resp = await client.post("/weights", data=b"x" * (MAX_BODY + 10))
        assert resp.status == 413

    _run(Operator(calls), scenario)
    assert calls.calls == []


def test_with_credentials_a_call_needs_a_known_token_and_runs_as_its_principal() -> None:
    calls = Recorder()
    operator = Operator(calls, {TOKEN: "ops"})

    async def scenario(client: TestClient[Any, Any]) -> None:
        await _post(client, "/agents/x/drain", status=401)
        await _post(client, "/agents/x/drain", status=401, token="wrong-token-wrong-token")
        resp = await client.post("/agents/x/drain", headers={"Authorization": "Basic abc"})
        assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        await _post(client, "/agents/x/drain", token=TOKEN)

    _run(operator, scenario)
    assert calls.calls == [(DrainAgent(agent_id="x"), "ops")]  # type: ignore[arg-type]


def test_without_credentials_curve_masters_refuse_http_calls_and_reads() -> None:
    calls = Recorder()

    async def scenario(client: TestClient[Any, Any]) -> list[dict[str, Any]]:
        got = [await _post(client, "/agents/x/drain", status=401)]
        for path in ("/state", "/state/summary", "/metrics"):
            got.append(await _post(client, path, method="GET", status=401))
        resp = await client.get("/health")
        assert resp.status == 200
        return got

    answers = _run(Operator(calls, authenticated=True), scenario)
    assert all("--http-credentials" in got["error"] for got in answers)
    assert calls.calls == []


def test_with_credentials_reads_need_a_known_token_too() -> None:
    """/state tells every framework's tasks and commands' ids, /metrics the cluster's size:
    readers need a token like callers do (any known token reads)."""

    async def scenario(client: TestClient[Any, Any]) -> None:
        for path in ("/state", "/state/summary", "/metrics"):
            await _post(client, path, method="GET", status=401)
            await _post(client, path, method="GET", status=401, token="wrong-token-wrong-token")
            resp = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert resp.status == 200, path
        resp = await client.get("/health")
        assert resp.status == 200 and (await resp.json())["leading"] is True

    _run(Operator(Recorder(), {TOKEN: "reader"}, authenticated=True), scenario)


def test_an_insecure_master_serves_anonymous_reads() -> None:
    async def scenario(client: TestClient[Any, Any]) -> None:
        for path in ("/state", "/state/summary", "/metrics"):
            resp = await client.get(path)
            assert resp.status == 200, path

    _run(Operator(Recorder()), scenario)


def test_a_standby_redirects_reads_and_calls_to_the_leader() -> None:
    calls = Recorder()

    async def scenario(client: TestClient[Any, Any]) -> None:
        for method, path in (
            ("GET", "/state?x=1"),
            ("GET", "/state/summary"),
            ("POST", "/agents/a/drain"),
        ):
            resp = await client.request(method, path, allow_redirects=False)
            assert resp.status == 307, path
            assert resp.headers["Location"] == "http://10.0.0.1:8080" + path
            assert (await resp.json())["leader"] == "tcp://10.0.0.1:5050"
        resp = await client.get("/health")
        assert resp.status == 200 and (await resp.json())["leading"] is False

    _run(Operator(calls), scenario, leading=False, leader_http="http://10.0.0.1:8080/")
    assert calls.calls == []


def test_a_standby_does_not_redirect_to_a_leader_url_it_could_not_authenticate() -> None:
    """Without CURVE anyone could have planted the leader's URL, and clients follow a redirect
    with their bearer token: the standby says where the leader is, but sends nobody there."""

    async def scenario(client: TestClient[Any, Any]) -> None:
        for method, path in (("GET", "/state"), ("POST", "/agents/a/drain")):
            resp = await client.request(
                method,
                path,
                allow_redirects=False,
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert resp.status == 503 and "Location" not in resp.headers, path

    calls = Recorder()
    _run(
        Operator(calls, {TOKEN: "ops"}),
        scenario,
        leading=False,
        leader_http="http://10.6.6.6:8080/",
        redirect=False,
    )
    assert calls.calls == []


def test_a_standby_that_does_not_know_the_leader_answers_503() -> None:
    got = _run(
        Operator(Recorder()),
        lambda c: _post(c, "/state", method="GET", status=503),
        leading=False,
        leader_http=None,
    )
    assert got["error"] == "this master is not the leader"


def test_credentials_file(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(f'ops = "{TOKEN}"\nci = "another-long-token-1234"\n')
    assert load_credentials(good) == {TOKEN: "ops", "another-long-token-1234": "ci"}
    for text, why in (
        ('ops = "short"', "16 characters"),
        (f'a = "{TOKEN}"\nb = "{TOKEN}"', "reuses"),
        ("", "no principal"),
        ("ops = [", "credentials"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=why):
            load_credentials(bad)


def test_a_body_that_arrives_in_pieces_is_read_whole() -> None:
    """A body split over several TCP segments (or chunked) is one call, not a parse error."""
    calls = Recorder()
    body = json.dumps({"weights": {f"role-{i}": 1 + i % 5 for i in range(200)}}).encode()

    async def scenario() -> list[bytes]:
        app = make_app(lambda: Harness().master, DaemonStats(), operator=Operator(calls))
        runner, host, port = await start_http(app, "127.0.0.1", 0)
        try:
            answers = []
            for framing in ("length", "chunked"):
                reader, writer = await asyncio.open_connection(host, port)
                if framing == "length":
                    head = f"Content-Length: {len(body)}"
                    pieces = [body[:20], body[20:]]
                else:
                    head = "Transfer-Encoding: chunked"
                    pieces = [
                        b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:20], body[20:])
                    ] + [b"0\r\n\r\n"]
                request = f"POST /weights HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}"
                writer.write(request.encode() + b"\r\n\r\n")
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.05)  # a separate segment, as a slow network sends it
                answers.append(await asyncio.wait_for(reader.read(), 10))
                writer.close()
            return answers
        finally:
            await runner.cleanup()

    answers = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), answers
    assert len(calls.calls) == 2 and len(calls.calls[0][0].weights) == 200  # type: ignore[attr-defined]


def test_calls_from_web_pages_are_refused() -> None:
    calls = Recorder()

    async def scenario(client: TestClient[Any, Any]) -> None:
        resp = await client.post(
            "/agents/a/gone", headers={"Origin": "https://evil.example"}, allow_redirects=False
        )
        assert resp.status == 403 and "web pages" in (await resp.json())["error"]

    _run(Operator(calls), scenario)
    assert calls.calls == []


@pytest.mark.parametrize(
    ("url", "me", "advertised"),
    [
        ("http://0.0.0.0:8080", "tcp://m1.example:5050", "http://m1.example:8080"),
        ("http://[::]:8080", "tcp://[fd00::1]:5050", "http://[fd00::1]:8080"),
        ("http://0.0.0.0:8080", "tcp://*:5050", ""),
        ("http://10.0.0.5:8080", "tcp://m1.example:5050", "http://10.0.0.5:8080"),
        # a loopback API is reachable only from the same machine: fine for `agora local`
        ("http://127.0.0.1:8080", "tcp://127.0.0.1:5050", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080", "tcp://m1.example:5050", ""),
    ],
)
def test_the_url_standbys_redirect_to(url: str, me: str, advertised: str) -> None:
    assert _advertised_http(url, me) == advertised
