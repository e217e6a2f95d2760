"""The files under deploy/ say only what the daemons understand.

Every example TOML parses; master.toml and agent.toml go through the daemons' own settings loaders
(an unknown key exits 2 there); the ACL goes through ``Acl``; the compose file names only settings
that exist and gives each master a volume of its own; the image copies every package; the
systemd units start real console scripts with the example configs.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from agora.agent.server import config as agent_config
from agora.master.relay import config as relay_config
from agora.master.server import config as master_config
from agora.sdk.daemon.settings import load
from agora.sdk.discovery import parse_masters
from agora.sdk.transport import Acl, generate_keypair

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONFIG = DEPLOY / "config"

#: Environment variables the CLI reads (besides the daemons' own AGORA_* options).
CLI_ENV = frozenset({"AGORA_MASTER", "AGORA_CURVE_SECRET_KEY", "AGORA_CURVE_SERVER_KEY"})


def _read(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def test_every_config_file_is_toml() -> None:
    names = sorted(p.name for p in CONFIG.glob("*.toml"))
    assert {"master.toml", "agent.toml", "acl.toml", "relay.toml"} <= set(names)
    for name in names:
        assert _read(CONFIG / name), f"{name} is empty"


def test_master_toml_loads_through_the_master_settings(tmp_path: Path) -> None:
    argv = ["--config", str(CONFIG / "master.toml"), "--work-dir", str(tmp_path / "work")]
    settings = master_config.load_settings(argv, env={})
    file = _read(CONFIG / "master.toml")
    assert settings.curve, "the production example has CURVE on"
    assert settings.bind == file["bind"]
    assert str(settings.acl) == file["acl"]
    assert settings.log_format == "json"
    # The election group: three masters, this one among them, a heartbeat well inside the timeout.
    assert settings.masters == tuple(file["masters"]) and len(settings.masters) == 3
    assert settings.advertise == file["advertise"] and settings.advertise in settings.masters
    assert settings.election_heartbeat * 2 <= settings.election_timeout
    assert settings.master.heartbeat_interval == file["heartbeat_interval"]
    assert settings.master.recovery_agent_share == file["recovery_agent_share"]
    assert settings.master.agent_reregister_timeout == file["agent_reregister_timeout"]


def test_a_mistyped_key_would_be_caught(tmp_path: Path) -> None:
    """The loader the tests above rely on rejects keys it does not know."""
    bad = tmp_path / "master.toml"
    bad.write_text((CONFIG / "master.toml").read_text() + "\nelection_heartbeat_ms = 100\n")
    with pytest.raises(SystemExit) as exc:
        master_config.load_settings(["--config", str(bad), "--work-dir", str(tmp_path)], env={})
    assert exc.value.code == 2


def test_agent_toml_loads_through_the_agent_settings(tmp_path: Path) -> None:
    public, secret = generate_keypair(tmp_path / "keys", "agent-1")
    argv = ["--config", str(CONFIG / "agent.toml"), "--work-dir", str(tmp_path / "work")]
    # The key files named in the example live on the real host; the loader insists they exist.
    argv += ["--curve-secret-key", str(secret), "--curve-server-key", str(public)]
    values = load(agent_config.PROG, agent_config.DESCRIPTION, agent_config.OPTIONS, argv, env={})
    core, settings = agent_config.build(values)
    file = _read(CONFIG / "agent.toml")
    assert parse_masters(values["master"]) == tuple(file["master"])
    assert file["master"] == _read(CONFIG / "master.toml")["masters"], "agents list every master"
    assert settings.recover == "reconnect", "an agent restart must keep its tasks"
    assert settings.advertise_host == file["advertise_host"]
    assert core.attributes, "attributes from the file reach the core"


def test_acl_loads() -> None:
    acl = Acl.load(CONFIG / "acl.toml")
    # The masters share one key pair, so one principal, named by the shared secret key's file.
    secret = Path(_read(CONFIG / "master.toml")["curve_secret_key"])
    assert secret.name == "master.key_secret"
    assert acl.may_elect("master")
    assert not acl.may_elect("agent-1"), "only masters may send election traffic"
    assert not acl.may_elect("master-1"), "no per-master principals any more"
    assert acl.may_register_agent("agent-1")
    assert not acl.may_register_agent("ops")
    assert acl.may_operate("ops")
    assert acl.may_use_roles("batch-framework", ["batch"]) is None
    assert acl.may_use_roles("batch-framework", ["mpi"]) == "mpi"
    assert acl.may_relay("relay-1") and not acl.may_relay("agent-1")


def test_relay_toml_loads_through_the_relay_settings() -> None:
    settings = relay_config.load_settings(["--config", str(CONFIG / "relay.toml")], env={})
    file = _read(CONFIG / "relay.toml")
    assert settings.curve_secret_key is not None and not settings.insecure
    assert settings.masters == tuple(_read(CONFIG / "master.toml")["masters"])
    assert settings.bind == file["bind"] and settings.log_format == "json"
    # The masters admit the relay's key and their ACL lets it relay.
    assert Acl.load(CONFIG / "acl.toml").may_relay(settings.curve_secret_key.name.split(".")[0])


def test_relay_unit_starts_the_relay_with_its_config() -> None:
    scripts = _read(ROOT / "pyproject.toml")["project"]["scripts"]
    keys = _unit("agora-relay.service")
    (exec_start,) = keys["ExecStart"]
    words = exec_start.split()
    assert Path(words[0]).name == "agora-relay" and "agora-relay" in scripts
    assert words[1:] == ["--config", "/etc/agora/relay.toml"]
    assert keys["User"] != ["root"] and keys["Restart"] == ["on-failure"]


def test_compose_names_only_real_settings() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    known = {opt.env for opt in master_config.OPTIONS + agent_config.OPTIONS}
    known |= CLI_ENV | {"AGORA_CONFIG"}
    used = set(re.findall(r"\b(AGORA_[A-Z0-9_]+)\s*:", text))
    assert "AGORA_MASTERS" in used
    assert used <= known, f"compose.yaml sets unknown variables {sorted(used - known)}"


def test_compose_has_three_masters_with_their_own_volumes() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    masters = [services[f"master-{i}"] for i in (1, 2, 3)]
    for i in (1, 2, 3):
        assert f"agent-{i}" in services
    state = [
        next(v.split(":")[0] for v in m["volumes"] if v.endswith(":/var/lib/agora-master"))
        for m in masters
    ]
    assert len(set(state)) == 3, f"masters share a state volume: {state}"
    assert set(state) <= set(compose["volumes"])
    for m in masters:
        assert len(parse_masters(m["environment"]["AGORA_MASTERS"])) == 3
        assert m["environment"]["AGORA_ADVERTISE"] in m["environment"]["AGORA_MASTERS"]
    # One shared key pair: every master serves with the same secret key, and every client checks
    # the server against its public half, so a client follows a failover to any master.
    secrets = {m["environment"]["AGORA_CURVE_SECRET_KEY"] for m in masters}
    assert secrets == {"/etc/agora/keys/master.key_secret"}, secrets
    clients = [services[f"agent-{i}"] for i in (1, 2, 3)] + [services["cli"]]
    server_keys = {c["environment"]["AGORA_CURVE_SERVER_KEY"] for c in clients}
    assert server_keys == {"/etc/agora/clients/master.key"}, server_keys


def test_image_copies_every_package_dir() -> None:
    project = _read(ROOT / "pyproject.toml")
    package_dirs = set(project["tool"]["setuptools"]["package-dir"].values())
    # pkg/agora/* are symlinks to the top-level folders: the image needs both ends
    linked = {str(p.resolve().relative_to(ROOT)) for p in (ROOT / "pkg" / "agora").iterdir()}
    needed = package_dirs | linked | set(project["project"]["license-files"])
    containerfile = (DEPLOY / "Containerfile").read_text()
    copied = set(re.findall(r"^COPY\s+(\S+)\s+\S+\s*$", containerfile, re.M))
    missing = sorted(needed - copied)
    assert not missing, f"deploy/Containerfile does not COPY {missing}: pip install . would fail"


def _unit(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z]+)=(.*)", line.strip())
        if match:
            out.setdefault(match[1], []).append(match[2])
    return out


@pytest.mark.parametrize(
    ("unit", "script", "config"),
    [
        ("agora-master.service", "agora-master", "master.toml"),
        ("agora-agent.service", "agora-agent", "agent.toml"),
    ],
)
def test_systemd_units_start_real_console_scripts(unit: str, script: str, config: str) -> None:
    scripts = _read(ROOT / "pyproject.toml")["project"]["scripts"]
    keys = _unit(unit)
    (exec_start,) = keys["ExecStart"]
    words = exec_start.split()
    assert Path(words[0]).name == script and script in scripts
    assert words[1:] == ["--config", f"/etc/agora/{config}"]
    # The state directory systemd makes is the work_dir the example config names.
    (state,) = keys["StateDirectory"]
    assert _read(CONFIG / config)["work_dir"] == f"/var/lib/{state}"
    assert keys["Restart"] == ["on-failure"]


def test_agent_unit_leaves_executors_running_on_restart() -> None:
    keys = _unit("agora-agent.service")
    assert keys["KillMode"] == ["process"]
    assert keys.get("User", ["root"]) == ["root"]
    assert _unit("agora-master.service")["User"] != ["root"]
