"""Who may use the agent HTTP API: the credentials file, the token check, the files decision, and
the app refusing or serving accordingly (an in-process server over a temporary work dir)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agora.agent.core import Agent
from agora.agent.server.http import make_app, sandbox_owner
from agora.agent.server.http_auth import HttpAuth, may_read_files
from agora.sdk.daemon.http_auth import (
    HttpCredentials,
    bearer_principal,
    load_credentials,
    load_http_credentials,
)
from agora.sdk.discovery import http_token
from aiohttp.test_utils import TestClient, TestServer
from msgspec.structs import replace
from support.agent_kit import FID, AgentHarness

ALICE, BOB, OPS = "alice-token-0123456789", "bob-token-0123456789", "ops-token-0123456789"
CREDS = HttpCredentials(
    tokens={ALICE: "alice", BOB: "bob", OPS: "ops"}, operators=frozenset({"ops"})
)


def test_the_file_maps_tokens_to_principals_and_every_principal_is_an_operator(
    tmp_path: Path,
) -> None:
    path = tmp_path / "creds.toml"
    path.write_text(f'alice = "{ALICE}"\nops = "{OPS}"\n')
    creds = load_http_credentials(path)
    assert creds.tokens == {ALICE: "alice", OPS: "ops"}
    assert creds.operators == {"alice", "ops"}
    assert load_credentials(path) == {ALICE: "alice", OPS: "ops"}  # the master's view


def test_the_file_can_name_its_operators(tmp_path: Path) -> None:
    path = tmp_path / "creds.toml"
    path.write_text(f'operators = ["ops"]\nalice = "{ALICE}"\nops = "{OPS}"\n')
    creds = load_http_credentials(path)
    assert creds.operators == {"ops"} and creds.tokens == {ALICE: "alice", OPS: "ops"}


@pytest.mark.parametrize(
    "text",
    ['alice = "short"', f'operators = "ops"\nalice = "{ALICE}"', f'a = "{ALICE}"\nb = "{ALICE}"'],
)
def test_an_unusable_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "creds.toml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match="HTTP credentials"):
        load_http_credentials(path)


def test_a_bearer_token_names_its_principal() -> None:
    assert bearer_principal(f"Bearer {ALICE}", CREDS.tokens) == "alice"
    assert bearer_principal(f"bearer  {OPS} ", CREDS.tokens) == "ops"
    assert bearer_principal("Bearer not-a-known-token-at-all", CREDS.tokens) is None
    assert bearer_principal(f"Basic {ALICE}", CREDS.tokens) is None
    assert bearer_principal("Bearer ", CREDS.tokens) is None
    assert bearer_principal("", CREDS.tokens) is None


def test_files_go_to_the_framework_principal_and_operators_only() -> None:
    auth = HttpAuth(CREDS)
    assert may_read_files("alice", "alice", auth)
    assert may_read_files("ops", "alice", auth)
    assert may_read_files("ops", None, auth)  # a framework the agent forgot: operators only
    assert not may_read_files("bob", "alice", auth)
    assert not may_read_files("alice", None, auth)
    assert not may_read_files(None, "alice", auth)
    assert not may_read_files("ops", "alice", HttpAuth())  # no credentials: nobody
    assert may_read_files(None, None, HttpAuth(insecure=True))


def test_the_cli_token_comes_from_the_environment_or_agora_local(tmp_path: Path) -> None:
    assert http_token({"AGORA_HOME": str(tmp_path)}) is None
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "operator.token").write_text(OPS + "\n")
    assert http_token({"AGORA_HOME": str(tmp_path)}) == OPS
    assert http_token({"AGORA_HOME": str(tmp_path), "AGORA_HTTP_TOKEN": ALICE}) == ALICE


def owned_core(work: Path, principal: str) -> Agent:
    """A core running t1 for framework FID of principal ``principal``; its sandbox on disk."""
    h = AgentHarness()
    h.register()
    h.run("t1")
    framework = h.agent.state.frameworks[FID]
    framework.info = replace(framework.info, principal=principal)
    (task,) = h.agent.state.tasks.values()
    sandbox = work / "frameworks" / FID / "executors" / task.executor_id / "tasks" / "t1"
    sandbox.mkdir(parents=True)
    (sandbox / "stdout").write_text("alice's output\n")
    return h.agent


def call(
    work: Path, core: Agent | None, auth: HttpAuth, path: str, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    async def go() -> tuple[int, dict[str, Any]]:
        app = make_app(lambda: core, str(work), auth=auth)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get(path, headers=headers)
            return resp.status, await resp.json()

    return asyncio.run(go())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_app_serves_files_to_their_owner_and_operators(tmp_path: Path) -> None:
    core = owned_core(tmp_path, "alice")
    assert (
        sandbox_owner(
            str(tmp_path),
            core,
            str(tmp_path / "frameworks" / FID / "executors" / "x" / "tasks" / "t1"),
        )
        == "alice"
    )
    auth, read = HttpAuth(CREDS), "/files/read?task=t1"
    assert call(tmp_path, core, auth, "/health", {}) == (200, {"status": "ok"})
    assert call(tmp_path, core, auth, read, {})[0] == 401
    assert call(tmp_path, core, auth, read, bearer("wrong-token-0123456789"))[0] == 401
    status, body = call(tmp_path, core, auth, read, bearer(BOB))
    assert status == 403 and "bob" in body["error"]
    for token in (ALICE, OPS):
        status, body = call(tmp_path, core, auth, read, bearer(token))
        assert (status, body["data"]) == (200, "alice's output\n")
    assert call(tmp_path, core, auth, "/state", bearer(BOB))[0] == 200
    assert call(tmp_path, core, auth, "/state", {})[0] == 401
    # A web page's request, even with a token: refused.
    assert call(tmp_path, core, auth, read, {**bearer(OPS), "Origin": "http://evil"})[0] == 403


def test_without_credentials_only_health_is_served(tmp_path: Path) -> None:
    core = owned_core(tmp_path, "alice")
    locked = HttpAuth()
    assert call(tmp_path, core, locked, "/health", {})[0] == 200
    for path in ("/state", "/files/read?task=t1"):
        status, body = call(tmp_path, core, locked, path, bearer(OPS))
        assert status == 401 and "--http-credentials" in body["error"]
    open_ = HttpAuth(insecure=True)
    assert call(tmp_path, core, open_, "/files/read?task=t1", {})[0] == 200


def test_state_names_a_frameworks_tasks_only_to_its_principal_and_operators(
    tmp_path: Path,
) -> None:
    """The ids in /state are what an attacker needs to aim at an executor: another principal
    sees the agent, not alice's frameworks, executors or tasks."""
    core = owned_core(tmp_path, "alice")
    auth = HttpAuth(CREDS)
    for token, sees in ((ALICE, True), (OPS, True), (BOB, False)):
        status, body = call(tmp_path, core, auth, "/state", bearer(token))
        assert status == 200 and body["agent_id"] == core.state.agent_id
        assert [t["id"] for t in body["tasks"]] == (["t1"] if sees else []), token
        assert bool(body["frameworks"]) is sees and bool(body["executors"]) is sees, token
