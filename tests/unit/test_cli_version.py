"""``agora --version``: the installed distribution's version, looked up only when asked."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from agora.sdk.cli.main import DISTRIBUTION, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
#: the module itself (``agora.sdk.cli.main`` as an attribute is the function the package re-exports)
CLI = sys.modules[main.__module__]


def _project() -> dict[str, str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, str] = tomllib.load(f)["project"]
    return project


def test_the_cli_names_the_distribution_pyproject_builds() -> None:
    assert _project()["name"] == DISTRIBUTION


def test_version_prints_agora_and_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code in (0, None)
    assert capsys.readouterr().out == f"agora {_project()['version']}\n"


def test_version_without_the_distribution_installed_still_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(CLI, "DISTRIBUTION", "agora-cluster-not-installed")
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("agora (unknown: ") and "agora-cluster-not-installed" in out


def test_help_lists_version() -> None:
    assert "--version" in build_parser().format_help()


def test_the_command_answers_in_a_fresh_process_loading_no_subcommand() -> None:
    code = (
        "import sys\n"
        "from agora.sdk.cli.main import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "finally:\n"
        "    print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"agora {_project()['version']}\n"
    loaded = set(done.stderr.split())
    assert "importlib.metadata" in loaded  # the path is really there
    heavy = {"structlog", "zmq", "rich", "aiohttp", "prometheus_client"} & loaded
    assert not heavy, heavy
    assert not {n for n in loaded if n.startswith("agora.sdk.cli.") and n != "agora.sdk.cli.main"}
