"""Secure by default: the CURVE identity set `agora local` writes under $AGORA_HOME/keys, its ACL,
the daemons' flags, how clients find their keys without flags, and the master's refusal to run
an election group without authentication unless --insecure."""

from __future__ import annotations

import argparse
import os
import pwd
import stat
import tomllib
from pathlib import Path

import pytest
import zmq.auth
from agora.master.server.config import load_settings
from agora.master.server.http_calls import load_credentials
from agora.sdk.cli.cluster import LocalCluster
from agora.sdk.cli.common import resolve_curve
from agora.sdk.cli.local_keys import acl_text, ensure_local_keys
from agora.sdk.discovery import client_key_files, client_principal, keys_dir
from agora.sdk.operator import OperatorClient
from agora.sdk.transport import Acl, discover_client, generate_keypair

USER = "user-alice"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def no_flags() -> argparse.Namespace:
    return argparse.Namespace(curve_secret_key=None, curve_server_key=None)


def test_the_identity_set_is_private_and_complete(tmp_path: Path) -> None:
    keys = ensure_local_keys(tmp_path / "home" / "keys", USER)
    assert mode(keys.folder) == 0o700
    assert mode(keys.folder.parent) & 0o055 == 0o055  # $AGORA_HOME itself keeps the usual mode
    for name in ("master", "agent", "batch", USER):
        assert mode(keys.secret(name)) == 0o600
        public, secret = zmq.auth.load_certificate(str(keys.secret(name)))
        assert secret is not None and public == zmq.auth.load_certificate(str(keys.public(name)))[0]
    admitted = sorted(p.name for p in keys.authorized.glob("*.key"))
    assert admitted == sorted(f"{n}.key" for n in ("master", "agent", "batch", USER))


def test_keys_are_reused_and_stale_admissions_dropped(tmp_path: Path) -> None:
    keys = ensure_local_keys(tmp_path / "keys", USER)
    before = {n: keys.secret(n).read_bytes() for n in ("master", "agent", "batch", USER)}
    (keys.authorized / "mallory.key").write_text("stale")
    keys.public("agent").unlink()  # half a keypair: made again
    again = ensure_local_keys(tmp_path / "keys", USER)
    assert again.secret("master").read_bytes() == before["master"]
    assert again.secret(USER).read_bytes() == before[USER]
    assert again.secret("agent").read_bytes() != before["agent"]
    assert not (keys.authorized / "mallory.key").exists()
    assert (keys.authorized / "agent.key").read_bytes() == keys.public("agent").read_bytes()


def test_the_users_operator_token_is_private_reused_and_known_to_the_masters(
    tmp_path: Path,
) -> None:
    keys = ensure_local_keys(tmp_path / "keys", USER)
    token = keys.token.read_text().strip()
    assert len(token) >= 32 and mode(keys.token) == 0o600
    assert load_credentials(keys.http_credentials) == {token: USER}
    assert ensure_local_keys(tmp_path / "keys", USER).token.read_text().strip() == token
    master = LocalCluster(tmp_path / "w", 1, keys=keys)._master_argv()
    assert master[master.index("--http-credentials") + 1] == str(keys.http_credentials)


def test_the_acl_admits_each_principal_to_its_part_only(tmp_path: Path) -> None:
    acl = Acl.load(ensure_local_keys(tmp_path / "keys", USER).acl)
    assert acl.may_register_agent("agent")
    assert not acl.may_register_agent(USER) and not acl.may_register_agent("batch")
    assert acl.may_operate(USER)
    assert not any(acl.may_operate(p) for p in ("agent", "batch", "master", None))
    assert acl.may_elect("master")
    assert not any(acl.may_elect(p) for p in ("agent", "batch", USER, None))
    assert acl.may_use_roles(USER, ["*", "analytics"]) is None
    assert acl.may_use_roles("batch", ["*"]) is None


def test_every_daemon_gets_its_own_identity(tmp_path: Path) -> None:
    keys = ensure_local_keys(tmp_path / "keys", USER)
    cluster = LocalCluster(tmp_path / "w", 1, batch=True, keys=keys)
    master = cluster._master_argv()
    assert master[master.index("--curve-secret-key") + 1] == str(keys.secret("master"))
    assert master[master.index("--curve-authorized-keys") + 1] == str(keys.authorized)
    assert master[master.index("--acl") + 1] == str(keys.acl)
    agent = cluster._agent_argv("agent-1", "tcp://127.0.0.1:1")
    assert agent[agent.index("--curve-secret-key") + 1] == str(keys.secret("agent"))
    assert agent[agent.index("--curve-server-key") + 1] == str(keys.public("master"))
    batch = cluster._batch_argv(tmp_path / "url", "tcp://127.0.0.1:1")
    assert batch[batch.index("--curve-secret-key") + 1] == str(keys.secret("batch"))
    assert batch[batch.index("--http-credentials") + 1] == str(keys.http_credentials)
    assert "--insecure-http" in LocalCluster(tmp_path / "w3", 1, batch=True)._batch_argv(
        tmp_path / "url", "tcp://127.0.0.1:1"
    )
    client = cluster.client_curve()
    assert (
        client is not None
        and client.public_key == zmq.auth.load_certificate(str(keys.public(USER)))[0]
    )
    # Without keys: CURVE off, on purpose (a group of masters would refuse otherwise).
    bare = LocalCluster(tmp_path / "w2", 1)
    assert "--insecure" in bare._master_argv() and "--curve-secret-key" not in bare._master_argv()
    assert bare.client_curve() is None


def test_clients_find_this_users_keys_without_flags(tmp_path: Path) -> None:
    env = {"AGORA_HOME": str(tmp_path / "home")}
    assert client_key_files(env) is None and discover_client(env) is None
    assert resolve_curve(no_flags(), env) is None
    keys = ensure_local_keys(keys_dir(env))  # for the user running the test
    assert keys.user == client_principal()
    found = discover_client(env)
    assert found is not None
    assert found.server_key == zmq.auth.load_certificate(str(keys.public("master")))[0]
    assert found.public_key == zmq.auth.load_certificate(str(keys.public(keys.user)))[0]
    resolved = resolve_curve(no_flags(), env)
    assert resolved is not None and resolved.public_key == found.public_key
    # Flags still win over the discovered keys.
    generate_keypair(tmp_path / "other", "ops")
    flags = argparse.Namespace(
        curve_secret_key=str(tmp_path / "other" / "ops.key_secret"),
        curve_server_key=str(keys.public("master")),
    )
    explicit = resolve_curve(flags, env)
    assert explicit is not None and explicit.public_key != found.public_key


def test_operator_client_uses_the_discovered_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_HOME", str(tmp_path))
    assert OperatorClient("tcp://127.0.0.1:1")._curve is None
    keys = ensure_local_keys(tmp_path / "keys")
    curve = OperatorClient("tcp://127.0.0.1:1")._curve
    assert curve is not None
    assert curve.public_key == zmq.auth.load_certificate(str(keys.public(keys.user)))[0]


def test_another_users_keys_are_not_found(tmp_path: Path) -> None:
    env = {"AGORA_HOME": str(tmp_path)}
    keys = ensure_local_keys(tmp_path / "keys", "user-someone-else")
    assert keys.secret("user-someone-else").exists()
    assert client_key_files(env) is None  # this user has no user-<me> key there


def test_client_principal_names_the_login_user() -> None:
    assert client_principal(0) == "user-root"
    unknown = 2**31 - 7
    assert client_principal(unknown) == f"user-{unknown}"


def test_a_group_of_masters_without_curve_needs_insecure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = "tcp://127.0.0.1:7001,tcp://127.0.0.1:7002,tcp://127.0.0.1:7003"
    with pytest.raises(SystemExit) as exc:
        load_settings(["--masters", group], env={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--insecure" in err and "CURVE is off" in err and len(err.strip().splitlines()) == 1
    assert load_settings(["--masters", group, "--insecure"], env={}).insecure
    assert load_settings(["--masters", group], env={"AGORA_INSECURE": "true"}).insecure
    secured = load_settings(
        [
            *("--masters", group),
            *("--curve-secret-key", str(tmp_path / "m.key_secret")),
            *("--curve-authorized-keys", str(tmp_path)),
        ],
        env={},
    )
    assert secured.curve and not secured.insecure
    # A lone master needs --insecure too (tests/unit/test_master_config.py).
    lone = load_settings(["--masters", "tcp://127.0.0.1:7001", "--insecure"], env={})
    assert not lone.curve and lone.insecure


def test_the_acl_lets_the_user_run_tasks_as_themself_and_the_batch_service_as_submitters(
    tmp_path: Path,
) -> None:
    from agora.master.core.run_as import RunAsPolicy

    keys = ensure_local_keys(tmp_path / "keys", USER)
    acl = Acl.load(keys.acl)
    assert acl.run_as is not None
    policy = RunAsPolicy(acl.run_as, acl.default_user)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert policy.default_user(USER) == me == policy.default_user("batch")
    assert policy.problem(USER, me) is None and policy.problem("batch", "nobody") is None
    assert policy.problem("agent", me) is not None  # not a framework's principal
    for login, root in (("alice", False), ("root", True)):
        table = Acl.from_dict(tomllib.loads(acl_text(USER, login, root=root)))
        assert table.run_as is not None
        rule = RunAsPolicy(table.run_as, table.default_user)
        assert rule.default_user(USER) == login
        # Only root's cluster lets its user run tasks as others.
        assert (rule.problem(USER, "root") is None) is root
        assert (rule.problem(USER, "nobody") is None) is root
