"""`agora batch ...` against a fake batch service: a small aiohttp app in a thread that records the
requests and answers canned JSON (changing over time, for `wait`)."""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

#: The module (agora.sdk.cli re-exports its ``main`` function under the same name).
cli_main = importlib.import_module("agora.sdk.cli.main")

pytestmark = pytest.mark.timeout(20)

Answer = tuple[int, Any]
Handler = Callable[[str, str, dict[str, str], Any], Answer]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class FakeService:
    """Answers every request with ``handler(method, path, query, body)``; records each one."""

    url: str = ""
    requests: list[Request] = field(default_factory=list)
    handler: Handler = lambda *_: (404, {"error": "not found"})

    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeService]:
    fake = FakeService()

    async def handle(request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        query = dict(request.query)
        fake.requests.append(Request(request.method, request.path, query, body))
        status, answer = fake.handler(request.method, request.path, query, body)
        return web.json_response(answer, status=status)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake.url = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    monkeypatch.setenv("AGORA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGORA_BATCH", fake.url)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def agora(*argv: str) -> int:
    code: int = cli_main.main(list(argv))
    return code


def job_view(job_id: int = 12, state: str = "RUNNING", **counts: int) -> dict[str, Any]:
    tasks = dict.fromkeys(
        ("PENDING", "STARTING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 0
    )
    tasks.update(counts)
    tasks["total"] = sum(tasks.values())
    return {
        "job_id": job_id,
        "name": "sim",
        "user": "alice",
        "queue": "default",
        "priority": 3,
        "state": state,
        "reason": "",
        "submit_time": time.time() - 125,
        "start_time": time.time() - 65,
        "end_time": None,
        "exit_code": None,
        "array": None,
        "ntasks": 1,
        "dependencies": [],
        "tasks": tasks,
    }


def task_json(index: int, state: str = "COMPLETED", **extra: Any) -> dict[str, Any]:
    base = {
        "job_id": 12,
        "index": index,
        "state": state,
        "attempt": 1,
        "failures": 0,
        "losses": 0,
        "task_id": f"batch-12.{index}-1",
        "agent_id": "agent-7",
        "hostname": "node-7",
        "submit_time": 1000.0,
        "start_time": 1010.0,
        "end_time": 1070.0,
        "exit_code": 0,
        "reason": "",
        "cpu_seconds": 1.5,
        "max_rss_bytes": 64 << 20,
    }
    return {**base, **extra}


# ------------------------------------------------------------------ the hook


def test_agora_help_lists_batch() -> None:
    assert "batch" in cli_main.build_parser().format_help()


def test_a_broken_plugin_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = EntryPoint("zzz", "agora_no_such_module_xyz:add_parser", "agora.cli")
    good = EntryPoint("batch", "agora.frameworks.batch.cli:add_parser", "agora.cli")
    monkeypatch.setattr(cli_main, "entry_points", lambda group: [broken, good])
    parser = cli_main.build_parser()
    assert "batch" in parser.format_help()
    err = capsys.readouterr().err
    assert "zzz" in err and "agora_no_such_module_xyz" in err


# ------------------------------------------------------------------ submit


def submitted(fake: FakeService, job_id: int = 12) -> None:
    fake.handler = lambda *_: (201, {"job_id": job_id, "tasks": 1})


def test_submit_a_command(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    submitted(service)
    code = agora("batch", "submit", "-J", "sim", "-c", "2", "--mem", "1G", "-a", "0-9%2",
                 "-t", "5", "--", "echo", "a b")  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out == "Submitted batch job 12\n"
    [post] = service.posts()
    assert post.path == "/jobs"
    spec = post.body["spec"]
    assert spec["command"] == "echo 'a b'"
    assert (spec["name"], spec["cpus"], spec["mem"], spec["time_limit"]) == ("sim", 2, 1024, 300)
    assert spec["array"] == {"ranges": [[0, 9, 1]], "max_running": 2}


def test_submit_json(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    submitted(service, 5)
    assert agora("batch", "submit", "--json", "--", "true") == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": 5, "tasks": 1}


def test_submit_a_script_with_directives_and_overrides(
    service: FakeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "job.sh"
    text = "#!/bin/sh\n#AGORA -c 3 --mem 2G\n#AGORA -J from-script --retries 1\necho $1\n"
    script.write_text(text)
    submitted(service)
    assert agora("batch", "submit", "--mem", "512", str(script), "x", "--verbose") == 0
    spec = service.posts()[0].body["spec"]
    assert (spec["cpus"], spec["mem"], spec["name"], spec["retries"]) == (3, 512, "from-script", 1)
    assert (spec["script"], spec["script_args"], spec["command"]) == (text, ["x", "--verbose"], "")


def test_an_unknown_directive_is_refused_and_nothing_posted(
    service: FakeService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#AGORA -c 1\n#AGORA --bogus\nrun\n")
    submitted(service)
    assert agora("batch", "submit", str(tmp_path / "job.sh")) == 1
    err = capsys.readouterr().err
    assert "job.sh:3: unknown option --bogus" in err and err.count("\n") == 1
    assert service.posts() == []


def test_a_command_without_double_dash_is_refused(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agora("batch", "submit", "-c", "1", "echo", "hi") == 2
    assert "put it after --" in capsys.readouterr().err
    assert service.requests == []


def test_a_refused_submission_is_one_line(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    service.handler = lambda *_: (400, {"error": "no agent has cpus:64"})
    assert agora("batch", "submit", "-c", "64", "--", "true") == 1
    assert capsys.readouterr().err == "agora batch: no agent has cpus:64\n"


# ------------------------------------------------------------------ status, cancel


def test_status_table(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [job_view(12, "RUNNING", COMPLETED=148, FAILED=2, RUNNING=10, PENDING=40)]
    service.handler = lambda *_: (200, {"jobs": jobs})
    assert agora("batch", "status") == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "sim" in line)
    for cell in ("12", "alice", "default", "3", "RUNNING", "150/200 done, 10 running, 2 failed"):
        assert cell in row
    assert "2m05s ago" in row and "00:01:05" in row
    assert service.requests[-1].query["all"] == "0"
    assert agora("batch", "status", "--all", "--user", "bob", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"jobs": jobs}
    assert service.requests[-1].query == {"all": "1", "user": "bob"}


def test_status_of_a_big_array_lists_tasks_not_completed(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = [task_json(i) for i in range(60)]
    tasks[7] = task_json(7, "FAILED", exit_code=3, reason="exited 3")
    view = job_view(12, "RUNNING", COMPLETED=59, FAILED=1)
    service.handler = lambda *_: (200, {"job": view, "tasks": tasks})
    assert agora("batch", "status", "12") == 0
    out = capsys.readouterr().out
    assert "COMPLETED 59" in out and "FAILED 1" in out
    assert "12.7" in out and "exited 3" in out
    assert "12.8 " not in out and "12.0 " not in out


def test_status_of_a_job_shows_its_preempted_tasks(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    why = "requeued: PREEMPTED by job 14 (priority 9)"
    tasks = [task_json(0), task_json(1, "PENDING", attempt=2, preemptions=1, reason=why)]
    view = job_view(12, "RUNNING", COMPLETED=1, PENDING=1)
    service.handler = lambda *_: (200, {"job": view, "tasks": tasks})
    assert agora("batch", "status", "12") == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "TASK" in line)
    row = next(line for line in out.splitlines() if "12.1" in line)
    cells = [c.strip() for c in row.split("│")]
    heads = [c.strip() for c in header.split("┃")]
    assert cells[heads.index("PREEMPTED")] == "1" and cells[heads.index("STATE")] == "PENDING"
    assert why in row
    # Without any preemption, no such column.
    service.handler = lambda *_: (200, {"job": view, "tasks": [task_json(0)]})
    assert agora("batch", "status", "12") == 0
    assert "PREEMPTED" not in capsys.readouterr().out


def test_cancel(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    service.handler = lambda *_: (200, {"cancelled": 1})
    assert agora("batch", "cancel", "12.3") == 0
    assert capsys.readouterr().out == "cancelled 1 task(s) of job 12\n"
    assert (service.requests[-1].path, service.requests[-1].body) == (
        "/jobs/12/cancel",
        {"index": 3},
    )
    assert agora("batch", "cancel", "12") == 0
    assert service.requests[-1].body == {"index": None}


def test_cancel_unknown_job(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    service.handler = lambda *_: (404, {"error": "no job 99"})
    assert agora("batch", "cancel", "99") == 1
    assert capsys.readouterr().err == "agora batch: no job 99\n"


# ------------------------------------------------------------------ history


def test_history(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    records = [{**task_json(3), "name": "sim", "user": "alice", "queue": "default"}]
    service.handler = lambda *_: (200, {"records": records})
    before = time.time()
    assert agora("batch", "history", "--since", "2h", "--job", "12", "--user", "alice") == 0
    query = service.requests[-1].query
    assert before - 7200 - 1 <= float(query["since"]) <= time.time() - 7200
    assert (query["job"], query["user"]) == ("12", "alice")
    row = next(line for line in capsys.readouterr().out.splitlines() if "12.3" in line)
    for cell in ("sim", "alice", "COMPLETED", "node-7", "00:01:00", "1.5", "64.0 MiB"):
        assert cell in row
    assert agora("batch", "history", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"records": records}
    assert "since" not in service.requests[-1].query


def test_history_bad_since(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    assert agora("batch", "history", "--since", "someday") == 2
    assert "bad time 'someday'" in capsys.readouterr().err
    assert service.requests == []


# ------------------------------------------------------------------ finding the service


def test_the_service_unreachable_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AGORA_HOME", str(tmp_path))
    (tmp_path / "batch").write_text(f"http://127.0.0.1:{port}\n")
    monkeypatch.delenv("AGORA_BATCH", raising=False)
    assert agora("batch", "status") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"agora batch: cannot reach the batch service at http://127.0.0.1:{port}")
    assert err.count("\n") == 1


def test_no_service_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGORA_HOME", str(tmp_path))
    monkeypatch.delenv("AGORA_BATCH", raising=False)
    assert agora("batch", "status") == 1
    assert "no batch service found: start one with `agora batch serve`" in capsys.readouterr().err
