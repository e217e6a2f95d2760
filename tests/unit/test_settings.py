"""Layered settings: flag > AGORA_* environment > TOML file > default, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from agora.sdk.daemon.settings import Option, load, parse_duration, parse_optional_float

OPTIONS = [
    Option("allocation_interval", parse_duration, 1.0, "seconds between allocation runs"),
    Option("bind", str, "tcp://127.0.0.1:5050", "endpoint"),
    Option("offer_timeout", parse_optional_float, None, "offer timeout"),
    Option("verbose", bool, False, "chatty", flag=True),
]


def test_defaults_when_nothing_is_given() -> None:
    got = load("t", "", OPTIONS, argv=[], env={})
    assert got == {
        "allocation_interval": 1.0,
        "bind": "tcp://127.0.0.1:5050",
        "offer_timeout": None,
        "verbose": False,
    }


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "agora.toml"
    cfg.write_text('allocation-interval = "250ms"\nbind = "tcp://0.0.0.0:1"\nverbose = true\n')
    env = {"AGORA_CONFIG": str(cfg), "AGORA_BIND": "tcp://127.0.0.1:2"}
    got = load("t", "", OPTIONS, argv=["--offer-timeout", "30s"], env=env)
    assert got["allocation_interval"] == 0.25  # file
    assert got["bind"] == "tcp://127.0.0.1:2"  # env over file
    assert got["offer_timeout"] == 30.0  # flag
    assert got["verbose"] is True
    got = load("t", "", OPTIONS, argv=["--bind", "tcp://h:3", "--no-verbose"], env=env)
    assert got["bind"] == "tcp://h:3" and got["verbose"] is False


def test_numbers_in_toml_are_accepted(tmp_path: Path) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text("allocation_interval = 2\n")
    assert load("t", "", OPTIONS, argv=["--config", str(cfg)], env={})["allocation_interval"] == 2.0


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--allocation-interval", "soon"], {}, "--allocation-interval"),
        ([], {"AGORA_ALLOCATION_INTERVAL": "-1"}, "AGORA_ALLOCATION_INTERVAL"),
        ([], {"AGORA_VERBOSE": "maybe"}, "AGORA_VERBOSE"),
        (["--config", "/nonexistent/agora.toml"], {}, "cannot read config file"),
    ],
)
def test_bad_values_exit_2_naming_their_source(
    argv: list[str], env: dict[str, str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        load("t", "", OPTIONS, argv=argv, env=env)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_bad_toml_and_unknown_keys_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("bind = \n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("bnid = 'x'\n")
    for path, needle in ((broken, "not valid TOML"), (unknown, "unknown setting 'bnid'")):
        with pytest.raises(SystemExit):
            load("t", "", OPTIONS, argv=["--config", str(path)], env={})
        assert needle in capsys.readouterr().err
