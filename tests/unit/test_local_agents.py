"""``agora local`` gives agents their own resources and attributes: one value for every agent,
or one per agent, in order; anything else is refused before a daemon starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from agora.sdk.cli.cluster import LocalCluster
from agora.sdk.cli.main import main


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_each_agent_gets_its_own_resources_and_attributes(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path,
        2,
        agent_resources=("cpus:4;mem:4096", "cpus:1;mem:512;gpus:1"),
        agent_attributes=("rack:a;zone:w",),
    )
    first = cluster._agent_argv("agent-1", "tcp://127.0.0.1:1")
    second = cluster._agent_argv("agent-2", "tcp://127.0.0.1:1")
    assert _flag(first, "--resources") == "cpus:4;mem:4096"
    assert _flag(second, "--resources") == "cpus:1;mem:512;gpus:1"
    assert _flag(first, "--attributes") == _flag(second, "--attributes") == "rack:a;zone:w"
    plain = LocalCluster(tmp_path / "plain", 2)._agent_argv("agent-2", "tcp://127.0.0.1:1")
    assert _flag(plain, "--resources") is None and _flag(plain, "--attributes") is None


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--agent-resources", "cpus:1", "--agent-resources", "cpus:2"], "given 2 times"),
        (["--agent-resources", "cpus:lots"], "--agent-resources 'cpus:lots'"),
        (["--agent-attributes", "rack"], "expected name:value"),
        (["--agent-attributes", "rack:a;rack:b"], "given twice"),
    ],
)
def test_bad_per_agent_values_exit_2_before_anything_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    said: str,
) -> None:
    monkeypatch.setenv("AGORA_HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    code = main(["local", "--agents", "3", "--work-dir", str(work), "--no-batch", *extra])
    assert code == 2
    assert said in capsys.readouterr().err
    assert not work.exists() and not (tmp_path / "home").exists()  # nothing was made
