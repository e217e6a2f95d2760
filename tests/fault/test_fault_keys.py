"""The fault suite's CURVE identity set (no root needed): what each principal may do, and that the
masters' and agents' option parsers take the flags it hands out."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from agora.agent.server.config import OPTIONS as AGENT_OPTIONS
from agora.agent.server.config import PROG as AGENT_PROG
from agora.agent.server.config import build as build_agent
from agora.master.server.config import load_settings as master_settings
from agora.sdk.daemon.http_auth import load_http_credentials
from agora.sdk.daemon.settings import load
from agora.sdk.transport import Acl, CurveServer
from fault.fault_cluster import AGENTS, CLIENTS
from fault.fault_keys import OPERATOR_KEY, FaultKeys

AGENT_NAMES = [name for _, name in AGENTS]
MASTERS = ["tcp://10.9.0.1:5050", "tcp://10.9.0.2:5050", "tcp://10.9.0.3:5050"]


@pytest.fixture
def keys(tmp_path: Path) -> FaultKeys:
    return FaultKeys.create(tmp_path / "keys", AGENT_NAMES, CLIENTS)


def test_every_process_has_its_own_key_and_only_the_owner_reads_them(keys: FaultKeys) -> None:
    assert stat.S_IMODE(keys.folder.stat().st_mode) == 0o700
    names = ["master", *AGENT_NAMES, *CLIENTS, OPERATOR_KEY]
    for name in names:
        assert stat.S_IMODE(keys.secret(name).stat().st_mode) == 0o600
    server = CurveServer(keys.secret("master"), keys.authorized)
    assert sorted(server.principals.values()) == sorted(names)  # distinct keys, one each


def test_the_acl_lets_only_agents_register_masters_elect_and_the_operator_operate(
    keys: FaultKeys,
) -> None:
    acl = Acl.load(keys.acl)
    assert all(acl.may_register_agent(a) for a in AGENT_NAMES)
    assert not any(acl.may_register_agent(c) for c in (*CLIENTS, "master"))
    assert acl.may_elect("master") and not acl.may_elect(AGENT_NAMES[0])
    assert acl.may_operate(OPERATOR_KEY) and not acl.may_operate("fw1")
    assert acl.may_use_roles("fw1", ["*"]) is None


def test_agent_http_tokens_name_their_principal(keys: FaultKeys) -> None:
    creds = load_http_credentials(keys.http_credentials)
    env = keys.client_env("run")
    assert creds.tokens[env["AGORA_HTTP_TOKEN"]] == "run"
    assert creds.operators == frozenset({OPERATOR_KEY})
    assert (
        keys.client("fw1").server_key
        == CurveServer(keys.secret("master"), keys.authorized).public_key
    )


def test_the_daemons_start_with_curve_from_these_flags(keys: FaultKeys, tmp_path: Path) -> None:
    settings = master_settings(
        [
            "--bind",
            MASTERS[0],
            "--masters",
            ",".join(MASTERS),
            "--advertise",
            MASTERS[0],
            "--work-dir",
            str(tmp_path / "m"),
            *keys.master_flags(),
        ],
        env={},
    )
    assert settings.curve and not settings.insecure and settings.acl == keys.acl
    name = AGENT_NAMES[0]
    argv = ["--work-dir", str(tmp_path / "a"), "--master", MASTERS[0], *keys.agent_flags(name)]
    _, agent = build_agent(load(AGENT_PROG, "test", AGENT_OPTIONS, argv, {}))
    assert not agent.insecure and not agent.insecure_http
    assert agent.http_credentials is not None
    with pytest.raises(KeyError):
        keys.agent_flags("fw1")  # a framework's key is no agent's
