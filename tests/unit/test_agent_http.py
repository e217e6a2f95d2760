"""The agent HTTP API: /health, /state and /files/read over a temporary work dir."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agora.agent.core import Agent, AgentConfig
from agora.agent.server.http import MAX_READ, FileReadError, find_sandbox, make_app, read_task_file
from agora.agent.server.http_auth import HttpAuth
from agora.sdk.resources import Resources
from aiohttp.test_utils import TestClient, TestServer

#: These tests are about what is served, not who may ask (tests/unit/test_agent_http_auth.py).
OPEN = HttpAuth(insecure=True)


def sandbox(work: Path, fid: str, eid: str, tid: str, out: bytes = b"", err: bytes = b"") -> Path:
    path = work / "frameworks" / fid / "executors" / eid / "tasks" / tid
    path.mkdir(parents=True)
    (path / "stdout").write_bytes(out)
    (path / "stderr").write_bytes(err)
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    sandbox(w, "fw-1", "agora-command", "t1", b"hello\nworld\n", b"oops\n")
    return w


def get(work: Path, path: str, **query: Any) -> tuple[int, dict[str, Any]]:
    """One request to a fresh app (no core: only on-disk sandboxes are found)."""

    async def go() -> tuple[int, dict[str, Any]]:
        app = make_app(lambda: None, str(work), auth=OPEN)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get(path, params={k: str(v) for k, v in query.items()})
            return resp.status, await resp.json()

    return asyncio.run(go())


def test_health(work: Path) -> None:
    assert get(work, "/health") == (200, {"status": "ok"})


def test_reads_a_whole_file(work: Path) -> None:
    status, body = get(work, "/files/read", task="t1", file="stdout")
    assert status == 200
    assert body == {"data": "hello\nworld\n", "offset": 0, "next_offset": 12, "eof_offset": 12}
    status, body = get(work, "/files/read", task="t1", file="stderr")
    assert (status, body["data"]) == (200, "oops\n")


def test_offset_and_length(work: Path) -> None:
    status, body = get(work, "/files/read", task="t1", file="stdout", offset=6, length=3)
    assert status == 200
    assert body == {"data": "wor", "offset": 6, "next_offset": 9, "eof_offset": 12}
    _, past = get(work, "/files/read", task="t1", file="stdout", offset=100)
    assert (past["data"], past["next_offset"], past["eof_offset"]) == ("", 100, 12)


def test_length_is_capped(tmp_path: Path) -> None:
    path = sandbox(tmp_path, "f", "e", "big", b"x" * (MAX_READ + 10))
    body = read_task_file(str(path), "stdout", 0, 10 * MAX_READ)
    assert len(body["data"]) == MAX_READ and body["eof_offset"] == MAX_READ + 10


def test_a_cut_character_waits_for_the_next_read(tmp_path: Path) -> None:
    path = sandbox(tmp_path, "f", "e", "u", "aé".encode())  # é is two bytes
    first = read_task_file(str(path), "stdout", 0, 2)
    assert (first["data"], first["next_offset"]) == ("a", 1)
    rest = read_task_file(str(path), "stdout", first["next_offset"], 2)
    assert (rest["data"], rest["next_offset"]) == ("é", 3)


def test_bad_requests_are_refused(work: Path) -> None:
    assert get(work, "/files/read", task="t1", file="passwd")[0] == 400
    assert get(work, "/files/read", task="t1", file="../stdout")[0] == 400
    assert get(work, "/files/read", task="t1", offset=-1)[0] == 400
    assert get(work, "/files/read", task="t1", offset="x")[0] == 400
    assert get(work, "/files/read")[0] == 400


def test_unknown_task_is_404_json(work: Path) -> None:
    status, body = get(work, "/files/read", task="nope", file="stdout")
    assert status == 404 and "nope" in body["error"]


@pytest.mark.parametrize("task", ["..", ".", "../x", "a/b", "t1/../t1", "*", "t?", "[t]1"])
def test_path_escapes_are_refused(work: Path, task: str) -> None:
    (work / "x").mkdir()
    (work / "x" / "stdout").write_text("secret")
    status, body = get(work, "/files/read", task=task, file="stdout")
    assert status in (400, 404), body
    assert "secret" not in json.dumps(body)


def test_bad_framework_id_is_refused(work: Path) -> None:
    assert get(work, "/files/read", task="t1", framework="../fw-1")[0] == 400
    assert get(work, "/files/read", task="t1", framework="fw-2")[0] == 404
    assert get(work, "/files/read", task="t1", framework="fw-1")[0] == 200


def test_symlinks_are_not_followed(work: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("secret")
    path = sandbox(work, "fw-1", "e2", "linked")
    (path / "stdout").unlink()
    (path / "stdout").symlink_to(secret)
    assert get(work, "/files/read", task="linked", file="stdout")[0] == 404
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdout").write_text("secret")
    tasks = work / "frameworks" / "fw-1" / "executors" / "e3" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "escaped").symlink_to(outside)
    assert get(work, "/files/read", task="escaped", file="stdout")[0] == 404


def test_find_sandbox_checks_ids_directly(work: Path) -> None:
    with pytest.raises(FileReadError) as err:
        find_sandbox(str(work), None, "a/b")
    assert err.value.status == 400
    assert find_sandbox(str(work), None, "t1").endswith("/tasks/t1")


def test_state_without_and_with_a_core(work: Path) -> None:
    assert get(work, "/state")[0] == 503

    async def go() -> dict[str, Any]:
        core = Agent(AgentConfig(hostname="h", resources=Resources.parse("cpus:1")))
        async with TestClient(TestServer(make_app(lambda: core, str(work), auth=OPEN))) as client:
            resp = await client.get("/state")
            assert resp.status == 200
            body: dict[str, Any] = await resp.json()
            return body

    state = asyncio.run(go())
    assert state["registered"] is False and state["tasks"] == [] and state["hostname"] == "h"


@pytest.fixture
def served(work: Path) -> Iterator[str]:
    """A real listening server (start_http), for one plain urllib request."""
    import threading

    from agora.sdk.daemon.httpd import start_http

    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()

    async def serve() -> None:
        runner, _, port = await start_http(
            make_app(lambda: None, str(work), auth=OPEN), "127.0.0.1", 0
        )
        started["runner"], started["port"] = runner, port
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=10)
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{started['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(started["runner"].cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_start_http_serves_on_a_free_port(served: str) -> None:
    query = urllib.parse.urlencode({"task": "t1", "file": "stdout"})
    with urllib.request.urlopen(f"{served}/files/read?{query}", timeout=10) as reply:
        assert json.loads(reply.read())["data"] == "hello\nworld\n"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{served}/files/read?task=zz", timeout=10)
    assert err.value.code == 404


def _settings(tmp_path: Path, *argv: str) -> Any:
    from agora.agent.server.config import OPTIONS, PROG, build
    from agora.sdk.daemon.settings import load

    values = load(PROG, "", OPTIONS, ["--work-dir", str(tmp_path), "--insecure", *argv], {})
    return build(values)[1]


def test_http_options(tmp_path: Path) -> None:
    default = _settings(tmp_path)
    assert (default.http_port, default.http_bind, default.advertise_host) == (
        0,
        "127.0.0.1",
        "127.0.0.1",
    )
    assert _settings(tmp_path, "--http-port", "off").http_port is None
    assert _settings(tmp_path, "--http-port", "none").http_port is None
    assert _settings(tmp_path, "--http-port", "5051").http_port == 5051
    wild = _settings(tmp_path, "--http-bind", "0.0.0.0")
    assert (wild.http_bind, wild.advertise_host) == ("0.0.0.0", "127.0.0.1")
    named = _settings(tmp_path, "--http-bind", "0.0.0.0", "--advertise-host", "node-7.example")
    assert named.advertise_host == "node-7.example"
    with pytest.raises(SystemExit):
        _settings(tmp_path, "--http-port", "70000")
