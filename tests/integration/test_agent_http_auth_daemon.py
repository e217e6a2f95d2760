"""A real agent's HTTP API with --http-credentials: a task's output goes only to its framework's
principal and to operators; without a token, or with a wrong one, it is refused and logged.
Without credentials (and without --insecure-http) only /health is served. A fake master drives
the agent (support.agent_daemon_kit), and every process is killed on the way out."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

from agora.sdk.ids import TaskID
from agora.sdk.messages import CommandInfo, FrameworkInfo, RunTask, TaskInfo, TaskState
from agora.sdk.resources import Resources
from support.agent_daemon_kit import AGENT_ID, FID, eventually, run, scenario

ALICE, BOB, OPS = "alice-token-0123456789", "bob-token-0123456789", "ops-token-0123456789"


def _get(url: str, token: str | None = None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            raw = r.read()
            return r.status, json.loads(raw) if "json" in r.headers["Content-Type"] else {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _refusals(log: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "http_refused"]


def test_task_output_needs_the_owners_or_an_operators_token(tmp_path: Path) -> None:
    creds = tmp_path / "http-credentials.toml"
    creds.write_text(f'operators = ["ops"]\nalice = "{ALICE}"\nbob = "{BOB}"\nops = "{OPS}"\n')

    async def main() -> None:
        async with scenario(tmp_path, "--http-credentials", str(creds)) as (master, agent):
            reg = await master.register()
            base = f"http://127.0.0.1:{reg.agent_info.http_port}"
            task = TaskInfo(
                task_id=TaskID("t-alice"),
                name="t-alice",
                agent_id=AGENT_ID,
                resources=Resources.parse("cpus:0.1;mem:16"),
                command=CommandInfo(value="echo secret-output; exec sleep 1000"),
            )
            framework = FrameworkInfo(name="alice-fw", framework_id=FID, principal="alice")
            await master.send(RunTask(framework_info=framework, framework_id=FID, task=task))
            await master.ack(await master.update("t-alice", TaskState.RUNNING))
            await eventually(
                lambda: (agent.task_sandbox("t-alice") / "stdout").read_text() != "",
                "the task's output",
            )
            read = f"{base}/files/read?task=t-alice"

            assert await asyncio.to_thread(_get, f"{base}/health") == (200, {"status": "ok"})
            status, body = await asyncio.to_thread(_get, read)
            assert status == 401, body
            assert (await asyncio.to_thread(_get, read, "wrong-token-0123456789"))[0] == 401
            status, body = await asyncio.to_thread(_get, read, BOB)
            assert status == 403, body
            for token in (ALICE, OPS):
                status, body = await asyncio.to_thread(_get, read, token)
                assert (status, body["data"]) == (200, "secret-output\n"), body
            assert (await asyncio.to_thread(_get, f"{base}/state"))[0] == 401
            assert (await asyncio.to_thread(_get, f"{base}/metrics", OPS))[0] == 200
            refused = _refusals(agent.log())
            assert {(r["status"], r["path"]) for r in refused} >= {
                (401, "/files/read"),
                (403, "/files/read"),
            }, refused
            assert any(r["principal"] == "bob" for r in refused), refused

    run(main())


def test_without_credentials_only_health_is_served(tmp_path: Path) -> None:
    async def main() -> None:
        # (--no-insecure-http, the default, keeps the kit from adding --insecure-http.)
        async with scenario(tmp_path, "--no-insecure-http") as (master, agent):
            reg = await master.register()
            base = f"http://127.0.0.1:{reg.agent_info.http_port}"
            assert (await asyncio.to_thread(_get, f"{base}/health"))[0] == 200
            for path in ("/state", "/metrics", "/files/read?task=x"):
                status, body = await asyncio.to_thread(_get, base + path, OPS)
                assert status == 401 and "--http-credentials" in str(body["error"]), body
            assert '"http_api_locked"' in agent.log()

    run(main())
