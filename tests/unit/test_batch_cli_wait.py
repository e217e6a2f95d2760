"""`agora batch wait`, `logs` and `serve` against the fake batch service of test_batch_cli."""

from __future__ import annotations

import io
import itertools
import json
import sys
import time
import types
import urllib.parse
from typing import Any

import pytest
from agora.frameworks.batch.cli_show import wait_exit_code, wait_job
from agora.frameworks.batch.client import BatchClient, Unreachable
from agora.sdk.cli import logs as cli_logs
from agora.sdk.ids import AgentID
from agora.sdk.messages import AgentSummary, MasterInfo, StateReply
from agora.sdk.resources import Resources
from test_batch_cli import Answer, FakeService, agora, job_view, service, task_json

pytestmark = pytest.mark.timeout(20)
__all__ = ["service"]  # the fixture, used by name

# ------------------------------------------------------------------ wait


def serve_views(fake: FakeService, views: list[dict[str, Any]]) -> None:
    """Each GET /jobs/12 answers the next view; the last one for ever."""
    calls = iter(range(10**9))

    def handler(method: str, path: str, query: dict[str, str], body: Any) -> Answer:
        if path != "/jobs/12":
            return 404, {"error": f"no {path}"}
        return 200, {"job": views[min(next(calls), len(views) - 1)], "tasks": []}

    fake.handler = handler


def ended(state: str, exit_code: int | None, **counts: int) -> dict[str, Any]:
    view = job_view(12, state, **counts)
    view.update(exit_code=exit_code, end_time=time.time())
    return view


@pytest.mark.parametrize(
    ("final", "code"),
    [
        (ended("COMPLETED", 0, COMPLETED=2), 0),
        (ended("FAILED", 3, COMPLETED=1, FAILED=1), 3),
        (ended("TIMEOUT", 1, TIMEOUT=2), 124),
        (ended("CANCELLED", 1, CANCELLED=2), 130),
    ],
)
def test_wait_exit_codes(
    service: FakeService, capsys: pytest.CaptureFixture[str], final: dict[str, Any], code: int
) -> None:
    serve_views(service, [job_view(12, "PENDING", PENDING=2), final])
    assert agora("batch", "wait", "12", "--interval", "0.01") == code
    assert all(r.query == {"tasks": "0"} for r in service.requests)
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"job 12 {final['state']}")


def test_wait_prints_progress_lines_without_a_terminal(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    views = [job_view(12, "PENDING", PENDING=4)]
    views += [job_view(12, "RUNNING", RUNNING=2, COMPLETED=i, PENDING=2 - i) for i in range(3)]
    views += [ended("COMPLETED", 0, COMPLETED=4)]
    serve_views(service, views)
    started = time.monotonic()
    assert agora("batch", "wait", "12", "--interval", "0.01", "--json") == 0
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0] == "job 12: 0/4 tasks ended (0 running)"
    assert lines[-2:] == ["job 12: 4/4 tasks ended (0 running)", "job 12 COMPLETED"]
    assert len(lines) - 1 <= elapsed / 1.0 + 2  # at most one a second, plus the last
    assert json.loads(captured.out)["state"] == "COMPLETED"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_wait_shows_a_progress_bar_on_a_terminal(service: FakeService) -> None:
    serve_views(
        service,
        [
            job_view(12, "RUNNING", RUNNING=1, COMPLETED=1),
            ended("FAILED", 2, COMPLETED=1, FAILED=1),
        ],
    )
    err = Tty()
    code = wait_job(BatchClient(service.url), 12, interval=0.01, as_json=False, patience=5, err=err)
    assert code == 2
    text = err.getvalue()
    assert "2/2" in text and text.rstrip().endswith("job 12 FAILED (exit code 2)")


def test_wait_rides_out_a_service_restart(
    service: FakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_views(service, [ended("COMPLETED", 0, COMPLETED=1)])
    client = BatchClient(service.url)
    real = client.job
    outages = iter([False, True, True, False])

    def flaky(job_id: int, tasks: bool = True) -> dict[str, Any]:
        if next(outages, False):
            raise Unreachable("cannot reach the batch service")
        return real(job_id, tasks)

    monkeypatch.setattr(client, "job", flaky)
    serve_views(service, [job_view(12, "RUNNING", RUNNING=1), ended("COMPLETED", 0, COMPLETED=1)])
    err = io.StringIO()
    assert wait_job(client, 12, interval=0.01, as_json=False, patience=5, err=err) == 0
    assert err.getvalue().endswith("job 12 COMPLETED\n")
    outages = itertools.chain([False], itertools.repeat(True))  # gone for good
    serve_views(service, [job_view(12, "RUNNING", RUNNING=1)])
    with pytest.raises(Unreachable):
        wait_job(client, 12, interval=0.01, as_json=False, patience=0.05, err=io.StringIO())
    outages = iter([True])
    with pytest.raises(Unreachable):  # unreachable at the start: at once
        wait_job(client, 12, interval=0.01, as_json=False, patience=5, err=io.StringIO())


def test_wait_for_an_unknown_job(service: FakeService, capsys: pytest.CaptureFixture[str]) -> None:
    service.handler = lambda *_: (404, {"error": "no job 12"})
    assert agora("batch", "wait", "12") == 1
    assert capsys.readouterr().err == "agora batch: no job 12\n"


def test_wait_exit_code_of_a_signalled_or_odd_job() -> None:
    assert wait_exit_code({"state": "FAILED", "exit_code": None}) == 1
    assert wait_exit_code({"state": "FAILED", "exit_code": -9}) == 137
    assert wait_exit_code({"state": "FAILED", "exit_code": 0}) == 1


# ------------------------------------------------------------------ logs, serve


def test_logs_needs_an_index_for_a_job_of_many_tasks(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    service.handler = lambda *_: (200, {"job": job_view(12, PENDING=200), "tasks": []})
    assert agora("batch", "logs", "12") == 1
    assert capsys.readouterr().err == "agora batch: job 12 has 200 tasks: name one as 12.IDX\n"


def test_logs_of_a_task_not_started(
    service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    pending = task_json(3, "PENDING", task_id="", agent_id="", attempt=0)
    service.handler = lambda *_: (200, {"task": pending, "framework_id": "fw-1"})
    assert agora("batch", "logs", "12.3") == 1
    assert capsys.readouterr().err == "agora batch: task 12.3 has not started\n"


def test_logs_reads_from_the_agent_the_master_forgot_the_task_on(
    service: FakeService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fake plays the batch service and the agent; the master lists the agent, not the task."""
    port = urllib.parse.urlsplit(service.url).port
    assert port is not None
    agent = AgentSummary(
        agent_id=AgentID("agent-7"),
        hostname="node-7",
        address="127.0.0.1",
        http_port=port,
        status="ACTIVE",
        resources=Resources.parse("cpus:1;mem:64"),
    )
    state = StateReply(
        master_info=MasterInfo(master_id="m", address="tcp://127.0.0.1:5050", epoch=1),
        agents=(agent,),
    )

    async def fake_state(*_: Any) -> StateReply:
        return state

    monkeypatch.setattr(cli_logs, "_state", fake_state)

    def handler(method: str, path: str, query: dict[str, str], body: Any) -> Answer:
        if path == "/jobs/12":
            return 200, {"job": job_view(12, "COMPLETED", COMPLETED=1), "tasks": [task_json(0)]}
        if path == "/jobs/12/tasks/0":
            return 200, {"task": task_json(0), "framework_id": "fw-1"}
        if path == "/files/read":
            return 200, {"data": "hello\n", "next_offset": 6, "eof_offset": 6}
        return 404, {"error": "?"}

    service.handler = handler
    assert agora("batch", "logs", "12", "--stderr") == 0
    assert capsys.readouterr().out == "hello\n"
    read = service.requests[-1]
    assert read.path == "/files/read"
    assert (read.query["task"], read.query["file"], read.query["framework"]) == (
        "batch-12.0-1",
        "stderr",
        "fw-1",
    )


def test_serve_hands_every_argument_to_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    module = types.ModuleType("agora.frameworks.batch.__main__")

    def fake_main(argv: list[str]) -> int:
        seen.append(list(argv))
        return 7

    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agora.frameworks.batch.__main__", module)
    assert agora("batch", "serve", "--port", "0", "--help") == 7
    assert agora("batch", "serve") == 7
    assert seen == [["--port", "0", "--help"], []]
