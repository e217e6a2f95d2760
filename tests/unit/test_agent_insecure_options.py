"""An agent without CURVE refuses to start unless told --insecure, which also serves its HTTP API
without tokens (unless it has --http-credentials or --no-insecure-http)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agora.agent.server.config import OPTIONS, PROG, ConfigError, DaemonSettings, build
from agora.agent.server.main import run
from agora.sdk.daemon.settings import load
from agora.sdk.transport import generate_keypair

TOKEN = "ops-token-0123456789"


def _settings(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> DaemonSettings:
    values = load(PROG, "test", OPTIONS, ["--work-dir", str(tmp_path / "w"), *argv], env or {})
    return build(values)[1]


def _keys(tmp_path: Path) -> list[str]:
    _, secret = generate_keypair(tmp_path / "keys", "agent-1")
    public, _ = generate_keypair(tmp_path / "keys", "master")
    return ["--curve-secret-key", str(secret), "--curve-server-key", str(public)]


def test_without_curve_or_insecure_it_refuses_naming_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path)
    text = str(err.value)
    assert "CURVE is off" in text and "--curve-secret-key" in text and "--insecure" in text
    # --insecure-http alone is about HTTP only: the master link still needs the word.
    with pytest.raises(ConfigError, match="CURVE is off"):
        _settings(tmp_path, "--insecure-http")


def test_the_refusal_is_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--work-dir", str(tmp_path / "w")], env={}) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{PROG}: error: CURVE is off") and "--insecure" in err


def test_insecure_serves_http_without_tokens_unless_told_otherwise(tmp_path: Path) -> None:
    plain = _settings(tmp_path, "--insecure")
    assert plain.insecure and plain.insecure_http
    assert _settings(tmp_path, env={"AGORA_INSECURE": "1"}).insecure_http
    closed = _settings(tmp_path, "--insecure", "--no-insecure-http")
    assert closed.insecure and not closed.insecure_http
    creds = tmp_path / "http.toml"
    creds.write_text(f'ops = "{TOKEN}"\n')
    tokens = _settings(tmp_path, "--insecure", "--http-credentials", str(creds))
    assert not tokens.insecure_http and tokens.http_credentials is not None
    with pytest.raises(ConfigError, match="contradict"):
        _settings(tmp_path, "--insecure-http", "--http-credentials", str(creds), "--insecure")


def test_with_curve_insecure_changes_nothing_and_insecure_http_still_works(
    tmp_path: Path,
) -> None:
    keys = _keys(tmp_path)
    secure = _settings(tmp_path, *keys)
    assert not secure.insecure and not secure.insecure_http
    told = _settings(tmp_path, *keys, "--insecure")
    assert not told.insecure and not told.insecure_http and told.curve_secret_key is not None
    assert _settings(tmp_path, *keys, "--insecure-http").insecure_http
