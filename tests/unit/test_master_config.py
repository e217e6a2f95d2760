"""The master daemon's settings: parsing, precedence (flag > env > TOML > default), validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core import MasterConfig
from agora.master.server.config import (
    OPTIONS,
    load_settings,
    parse_quotas,
    parse_roles,
    parse_weights,
)
from agora.sdk.resources import Resources


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "master.toml"
    path.write_text(text)
    return path


def test_defaults_match_the_spec_and_the_core() -> None:
    s = load_settings(["--insecure"], env={})
    assert s.bind == "tcp://127.0.0.1:5050"
    assert s.work_dir == Path("/tmp/agora/master")
    assert s.endpoint_file is None
    assert s.peer_timeout == 45.0
    assert (s.log_format, s.log_level) == ("console", "info")
    assert not s.curve and s.acl is None and s.insecure
    assert s.master == MasterConfig(insecure=True)  # (the state shows it)
    assert s.tick_interval == pytest.approx(0.1)


def test_every_option_is_a_flag_an_env_var_and_a_toml_key() -> None:
    names = {opt.name for opt in OPTIONS}
    assert {
        "bind",
        "work_dir",
        "allocation_interval",
        "offer_timeout",
        "agent_ping_interval",
        "max_agent_ping_timeouts",
        "heartbeat_interval",
        "peer_timeout",
        "roles",
        "weights",
        "quota",
        "quota_limit",
        "reclaim",
        "reclaim_interval",
        "reclaim_min_runtime",
        "reclaim_max_victims",
        "log_format",
        "log_level",
        "endpoint_file",
        "curve_secret_key",
        "curve_authorized_keys",
        "acl",
    } <= names


def test_flags_map_onto_master_config(tmp_path: Path) -> None:
    s = load_settings(
        [
            "--bind",
            "tcp://127.0.0.1:0",
            "--work-dir",
            str(tmp_path / "w"),
            "--endpoint-file",
            str(tmp_path / "ep"),
            "--allocation-interval",
            "0.05",
            "--offer-timeout",
            "30",
            "--agent-ping-interval",
            "2",
            "--max-agent-ping-timeouts",
            "3",
            "--heartbeat-interval",
            "500ms",
            "--peer-timeout",
            "9",
            "--roles",
            "batch,mpi",
            "--weights",
            "batch=2,mpi=0.5",
            "--quota",
            "batch:cpus:4;mem:1024",
            "--quota-limit",
            "batch:cpus:8, mpi:cpus:2",
            "--log-format",
            "json",
            "--log-level",
            "DEBUG",
            "--reclaim",
            "off",
            "--reclaim-interval",
            "2",
            "--reclaim-min-runtime",
            "0",
            "--reclaim-max-victims",
            "7",
            "--insecure",
        ],
        env={},
    )
    m = s.master
    assert m.reclaim == ReclaimConfig(enabled=False, interval=2.0, min_runtime=0.0, max_victims=7)
    assert s.bind == "tcp://127.0.0.1:0"
    assert s.work_dir == tmp_path / "w" and s.endpoint_file == tmp_path / "ep"
    assert m.allocation_interval == 0.05 and s.tick_interval == 0.05
    assert m.offer_timeout == 30.0
    assert m.agent_ping_interval == 2.0 and m.max_agent_ping_timeouts == 3
    assert m.heartbeat_interval == 0.5
    assert s.peer_timeout == 9.0
    assert m.roles == frozenset({"batch", "mpi"})
    assert m.weights == {"batch": 2.0, "mpi": 0.5}
    assert m.quotas == {
        "batch": (Resources.parse("cpus:4;mem:1024"), Resources.parse("cpus:8")),
        "mpi": (Resources(), Resources.parse("cpus:2")),
    }
    assert (s.log_format, s.log_level) == ("json", "debug")


def test_precedence_flag_over_env_over_toml_over_default(tmp_path: Path) -> None:
    cfg = _toml(tmp_path, 'allocation_interval = 3\npeer_timeout = 30\nroles = ["a", "b"]\n')
    env = {"AGORA_CONFIG": str(cfg), "AGORA_ALLOCATION_INTERVAL": "2", "AGORA_ROLES": "c"}
    env["AGORA_INSECURE"] = "1"
    s = load_settings(["--allocation-interval", "1.5"], env=env)
    assert s.master.allocation_interval == 1.5  # flag beats env and file
    assert s.master.roles == frozenset({"c"})  # env beats file
    assert s.peer_timeout == 30.0  # file beats default
    assert s.master.heartbeat_interval == 15.0  # default
    s = load_settings([], env=env)
    assert s.master.allocation_interval == 2.0
    s = load_settings(["--config", str(cfg), "--insecure"], env={})
    assert s.master.allocation_interval == 3.0
    assert s.master.roles == frozenset({"a", "b"})


def test_toml_lists_and_tables_for_role_options(tmp_path: Path) -> None:
    cfg = _toml(
        tmp_path,
        'quota = ["batch:cpus:4; mem:1024", "mpi:cpus:1"]\n'
        "offer_timeout = 'none'\n"
        "[weights]\nbatch = 3\nmpi = 1.5\n"
        '[quota_limit]\nbatch = "cpus:6;mem:2048"\n',
    )
    s = load_settings(["--config", str(cfg), "--insecure"], env={})
    assert s.master.weights == {"batch": 3.0, "mpi": 1.5}
    assert s.master.offer_timeout is None
    assert s.master.quotas == {
        "batch": (Resources.parse("cpus:4;mem:1024"), Resources.parse("cpus:6;mem:2048")),
        "mpi": (Resources.parse("cpus:1"), None),
    }


def test_role_option_parsers() -> None:
    assert parse_roles("") == frozenset()
    assert parse_roles(" a, b  c ") == frozenset({"a", "b", "c"})
    assert parse_weights("a=1,b=2.5") == {"a": 1.0, "b": 2.5}
    assert parse_quotas("a:cpus:1;mem:64,b=gpus:1") == {
        "a": Resources.parse("cpus:1;mem:64"),
        "b": Resources.parse("gpus:1"),
    }
    # (the range of weights the state and operator calls carry: 0.0001 to 1e6)
    for bad in ("a", "a=0", "a=-1", "a=x", "a=inf", "a=1,a=2", "b@d=1", "a=0.00005", "a=2e6"):
        with pytest.raises(ValueError):
            parse_weights(bad)
    for bad in ("a", "a:", "a:cpus:x", "a:cpus:1,a:cpus:2", ":cpus:1"):
        with pytest.raises(ValueError):
            parse_quotas(bad)
    with pytest.raises(ValueError):
        parse_roles("ok,has space(")


@pytest.mark.parametrize(
    "argv",
    [
        ["--allocation-interval", "0"],
        ["--allocation-interval", "soon"],
        ["--offer-timeout", "-1"],
        ["--max-agent-ping-timeouts", "0"],
        ["--max-agent-ping-timeouts", "1.5"],
        ["--peer-timeout", "nan"],
        ["--bind", "127.0.0.1:5050"],
        ["--log-format", "xml"],
        ["--log-level", "loud"],
        ["--weights", "a"],
        ["--quota", "a:ports:[1-2]"],  # quota is scalars only
        ["--quota", "a:cpus:4", "--quota-limit", "a:cpus:2"],  # guarantee above limit
        ["--roles", "a", "--weights", "b=2"],  # a weight for a role frameworks cannot use
        ["--curve-secret-key", "/k/master.key_secret"],  # without authorized keys
        ["--no-such-flag", "1"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings([*argv, "--insecure"], env={})
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_bad_env_and_toml_values_exit_2_naming_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings(["--insecure"], env={"AGORA_PEER_TIMEOUT": "never"})
    assert exc.value.code == 2
    assert "AGORA_PEER_TIMEOUT" in capsys.readouterr().err
    cfg = _toml(tmp_path, 'heartbeat_interval = "often"\n')
    with pytest.raises(SystemExit) as exc:
        load_settings(["--config", str(cfg), "--insecure"], env={})
    assert exc.value.code == 2
    assert "heartbeat_interval" in capsys.readouterr().err


def test_curve_and_acl_paths(tmp_path: Path) -> None:
    s = load_settings(
        [
            "--curve-secret-key",
            str(tmp_path / "master.key_secret"),
            "--curve-authorized-keys",
            str(tmp_path / "clients"),
            "--acl",
            str(tmp_path / "acl.toml"),
        ],
        env={},
    )
    assert s.curve
    assert s.curve_secret_key == tmp_path / "master.key_secret"
    assert s.curve_authorized_keys == tmp_path / "clients"
    assert s.acl == tmp_path / "acl.toml"
    assert not s.insecure and not s.master.insecure  # CURVE on: the state says so


def test_without_curve_a_master_refuses_to_start_unless_insecure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings([], env={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # one line saying what to give
    assert "CURVE is off" in err and "--curve-secret-key" in err and "--insecure" in err
    for argv, env in ((["--insecure"], {}), ([], {"AGORA_INSECURE": "true"})):
        s = load_settings(argv, env=env)
        assert s.insecure and not s.curve and s.master.insecure
