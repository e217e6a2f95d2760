"""``AGORA_INSECURE=1``: a user whose ``$AGORA_HOME/keys`` holds keys (from ``agora local``)
reaches a master started ``--insecure`` elsewhere: clients skip key (and token) discovery; keys
and tokens named explicitly still win."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import zmq.auth
from agora.sdk.cli.cluster import LocalCluster
from agora.sdk.cli.common import describe_handshake_error, resolve_curve
from agora.sdk.cli.local_keys import ensure_local_keys
from agora.sdk.discovery import client_key_files, http_token, insecure_client, keys_dir
from agora.sdk.transport import discover_client, generate_keypair

TOKEN = "explicit-token-0123456789"


def _no_flags() -> argparse.Namespace:
    return argparse.Namespace(curve_secret_key=None, curve_server_key=None)


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An $AGORA_HOME where `agora local` left this user's keys and the operator token."""
    env = {"AGORA_HOME": str(tmp_path / "home")}
    ensure_local_keys(keys_dir(env))
    (keys_dir(env) / "operator.token").write_text("local-operator-token-0123456789\n")
    assert client_key_files(env) is not None and discover_client(env) is not None
    assert resolve_curve(_no_flags(), env) is not None
    assert http_token(env) == "local-operator-token-0123456789"
    return env


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_agora_insecure_skips_the_keys_and_the_token_in_agora_home(
    home: dict[str, str], value: str
) -> None:
    env = {**home, "AGORA_INSECURE": value}
    assert insecure_client(env)
    assert client_key_files(env) is None and discover_client(env) is None
    assert resolve_curve(_no_flags(), env) is None  # the CLI: no CURVE
    assert http_token(env) is None  # the local cluster's token is not sent elsewhere


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_other_values_keep_discovery(home: dict[str, str], value: str) -> None:
    env = {**home, "AGORA_INSECURE": value}
    assert not insecure_client(env)
    assert discover_client(env) is not None and http_token(env) is not None


def test_explicit_keys_and_token_still_win(home: dict[str, str], tmp_path: Path) -> None:
    public, secret = generate_keypair(tmp_path / "mine", "ops")
    env = {
        **home,
        "AGORA_INSECURE": "1",
        "AGORA_CURVE_SECRET_KEY": str(secret),
        "AGORA_CURVE_SERVER_KEY": str(public),
        "AGORA_HTTP_TOKEN": TOKEN,
    }
    curve = resolve_curve(_no_flags(), env)
    assert curve is not None and curve.server_key == zmq.auth.load_certificate(str(public))[0]
    flags = argparse.Namespace(curve_secret_key=str(secret), curve_server_key=str(public))
    assert resolve_curve(flags, {**home, "AGORA_INSECURE": "1"}) is not None
    assert http_token(env) == TOKEN


def test_a_refused_handshake_with_a_keyless_master_points_at_agora_insecure() -> None:
    line = describe_handshake_error("protocol error", "tcp://m:5050", curve=True)
    assert "does not use CURVE" in line and "AGORA_INSECURE=1" in line
    # (when the master hung up first, the handshake just failed: the way out is named too)
    line = describe_handshake_error("handshake failed", "tcp://m:5050", curve=True)
    assert "does the master use CURVE" in line and "AGORA_INSECURE=1" in line


def test_agora_local_keeps_agora_insecure_from_its_daemons_and_runs_keyless_agents_insecure(
    tmp_path: Path,
) -> None:
    from agora.sdk.cli import cluster

    # Set for the CLI, the variable would be each daemon's --insecure.
    assert "AGORA_INSECURE" in cluster._DAEMON_ENV
    bare = LocalCluster(tmp_path / "w", 1)
    agent = bare._agent_argv("agent-1", "tcp://127.0.0.1:1")
    assert "--insecure" in agent and "--insecure-http" not in agent


def test_sdk_drivers_take_the_keys_named_in_the_environment_like_the_cli(
    home: dict[str, str], tmp_path: Path
) -> None:
    """A framework started with $AGORA_CURVE_* uses those keys, not the ones agora local left."""
    public, secret = generate_keypair(tmp_path / "mine", "fw")
    env = {**home, "AGORA_CURVE_SECRET_KEY": str(secret), "AGORA_CURVE_SERVER_KEY": str(public)}
    found = discover_client(env)
    assert found is not None
    assert found.public_key == zmq.auth.load_certificate(str(public))[0]
    assert found.server_key == found.public_key  # (the test named its own key as the server's)
    with pytest.raises(ValueError, match="both"):
        discover_client({**home, "AGORA_CURVE_SECRET_KEY": str(secret)})
    with pytest.raises(ValueError, match="no secret key"):
        discover_client({**env, "AGORA_CURVE_SECRET_KEY": str(public)})  # not a secret key
