"""master_address: explicit > $AGORA_MASTER > $AGORA_HOME/master > the default."""

from __future__ import annotations

from pathlib import Path

from agora.sdk.discovery import DEFAULT_MASTER, agora_home, master_address


def test_precedence(tmp_path: Path) -> None:
    (tmp_path / "master").write_text("tcp://10.0.0.3:5050\n")
    env = {"AGORA_HOME": str(tmp_path), "AGORA_MASTER": "tcp://10.0.0.2:5050"}
    assert master_address("tcp://10.0.0.1:5050", environ=env) == "tcp://10.0.0.1:5050"
    assert master_address(None, environ=env) == "tcp://10.0.0.2:5050"
    assert master_address("", environ={**env, "AGORA_MASTER": " "}) == "tcp://10.0.0.3:5050"
    assert master_address(None, environ={"AGORA_HOME": str(tmp_path / "none")}) == DEFAULT_MASTER
    assert DEFAULT_MASTER == "tcp://127.0.0.1:5050"


def test_bare_host_port_and_home(tmp_path: Path) -> None:
    assert master_address("example:5050", environ={}) == "tcp://example:5050"
    (tmp_path / "master").write_text("\n")  # empty file: ignored
    assert master_address(None, environ={"AGORA_HOME": str(tmp_path)}) == DEFAULT_MASTER
    assert agora_home({"AGORA_HOME": str(tmp_path)}) == tmp_path
    assert agora_home({}) == Path.home() / ".agora"
