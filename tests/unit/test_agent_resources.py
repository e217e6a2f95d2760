"""The agent daemon's host detection, --resources override, --attributes and option plumbing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec
import pytest
from agora.agent.server import resources as res
from agora.agent.server.config import OPTIONS, PROG, ConfigError, build, option_env_names
from agora.agent.server.daemon import advertised_endpoint
from agora.agent.server.processes import LaunchError, executor_argv, resolve_sandbox
from agora.sdk.daemon.settings import load
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import CommandInfo, ExecutorInfo
from agora.sdk.resources import Resources


def _meminfo(tmp_path: Path, total_kib: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total_kib} kB\nMemFree:        1234 kB\n")
    return str(path)


# ---- detection -----------------------------------------------------------------------------------


def test_detects_cpus_mem_disk_ports(tmp_path: Path) -> None:
    detected = res.detect_resources(str(tmp_path), meminfo=_meminfo(tmp_path, 8 * 1024 * 1024))
    assert detected.scalar("cpus") == os.cpu_count()
    assert detected.scalar("mem") == 8 * 1024 - 1024  # 8 GB minus the 1 GB reserve
    free = shutil.disk_usage(tmp_path).free // (1024 * 1024)
    expected_disk = free - min(5 * 1024, free // 2)
    assert abs(detected.scalar("disk") - expected_disk) <= 64  # the fs may change meanwhile
    assert detected.ranges("ports") == ((31000, 32000),)
    assert detected.names() == {"cpus", "mem", "disk", "ports"}


def test_small_host_keeps_half_its_memory(tmp_path: Path) -> None:
    detected = res.detect_resources(str(tmp_path), meminfo=_meminfo(tmp_path, 1024 * 1024))
    assert detected.scalar("mem") == 512


def test_real_meminfo_is_read() -> None:
    total = res.total_memory_mb()
    assert total is not None and total > 0


def test_unreadable_meminfo_leaves_mem_out(tmp_path: Path) -> None:
    detected = res.detect_resources(str(tmp_path), meminfo=str(tmp_path / "missing"))
    assert "mem" not in detected.names()
    assert res.total_memory_mb(str(tmp_path / "missing")) is None
    garbage = tmp_path / "garbage"
    garbage.write_text("MemTotal: lots\n")
    assert res.total_memory_mb(str(garbage)) is None


def test_disk_of_a_work_dir_not_created_yet(tmp_path: Path) -> None:
    detected = res.detect_resources(str(tmp_path / "a" / "b" / "c"))
    assert detected.scalar("disk") > 0


# ---- --resources override ------------------------------------------------------------------------


def test_override_replaces_named_resources_only(tmp_path: Path) -> None:
    got = res.host_resources(str(tmp_path), "cpus:3;gpus:1")
    detected = res.detect_resources(str(tmp_path))
    assert got.scalar("cpus") == 3
    assert got.scalar("gpus") == 1
    assert got.scalar("mem") == detected.scalar("mem")
    assert got.ranges("ports") == ((31000, 32000),)


def test_override_replaces_every_role_of_a_name() -> None:
    detected = Resources.parse("cpus:8;cpus(batch):2;mem:100;ports:[1-2]")
    got = res.apply_override(detected, Resources.parse("cpus(web):1;ports:[5-6]"))
    assert got == Resources.parse("cpus(web):1;mem:100;ports:[5-6]")


def test_empty_override_is_detection(tmp_path: Path) -> None:
    assert res.host_resources(str(tmp_path), "  ").names() == {"cpus", "mem", "disk", "ports"}
    assert res.host_resources(str(tmp_path), None).scalar("cpus") == os.cpu_count()


@pytest.mark.parametrize("bad", ["cpus:x", "cpus:-1", "mem", "ports:[5-"])
def test_bad_override_is_an_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="bad resources"):
        res.host_resources(str(tmp_path), bad)


# ---- attributes ----------------------------------------------------------------------------------


def test_attributes_parse() -> None:
    assert res.parse_attributes("rack:a;zone:w") == {"rack": "a", "zone": "w"}
    assert res.parse_attributes(" rack : a ;; url:http://x:1 ;") == {
        "rack": "a",
        "url": "http://x:1",
    }
    assert res.parse_attributes("") == {}
    assert res.parse_attributes(None) == {}
    assert res.parse_attributes("empty:") == {"empty": ""}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("rack", "expected name:value"),
        (":a", "empty name"),
        ("rack:a;rack:b", "given twice"),
        ("x:" + "v" * 300, "at most 255"),
    ],
)
def test_bad_attributes(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        res.parse_attributes(bad)


# ---- options -> AgentConfig ----------------------------------------------------------------------


def _values(argv: list[str]) -> dict[str, object]:
    return load(PROG, "test", OPTIONS, [*argv, "--insecure"], env={})  # (no CURVE here)


def test_build_config_from_flags(tmp_path: Path) -> None:
    values = _values(
        [
            "--work-dir",
            str(tmp_path),
            "--resources",
            "cpus:2;mem:512",
            "--attributes",
            "rack:r1",
            "--hostname",
            "node-7",
            "--master-timeout",
            "30",
            "--status-update-retry",
            "250ms",
            "--executor-shutdown-grace-period",
            "2",
            "--no-switch-user",
        ]
    )
    config, settings = build(values)
    assert config.hostname == "node-7"
    assert config.resources.scalar("cpus") == 2
    assert config.resources.scalar("mem") == 512
    assert "disk" in config.resources.names()
    assert dict(config.attributes) == {"rack": "r1"}
    assert config.master_timeout == 30
    assert config.status_update_retry == 0.25
    assert config.executor_shutdown_grace_period == 2
    assert settings.work_dir == str(tmp_path)
    assert settings.master == "tcp://127.0.0.1:5050"
    assert settings.executor_bind == ""  # the Unix socket in the work dir
    assert settings.recovery_timeout == 900
    assert settings.switch_user is False


def test_environment_configures_too(tmp_path: Path) -> None:
    env = {
        "AGORA_WORK_DIR": str(tmp_path),
        "AGORA_ATTRIBUTES": "zone:z",
        "AGORA_MASTER": "tcp://m:1",
        "AGORA_INSECURE": "1",
    }
    config, settings = build(load(PROG, "test", OPTIONS, [], env=env))
    assert dict(config.attributes) == {"zone": "z"}
    assert settings.master == "tcp://m:1"
    assert "AGORA_WORK_DIR" in option_env_names()
    assert "AGORA_CONFIG" in option_env_names()


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--resources", "cpus:nope"], "--resources"),
        (["--attributes", "rack"], "--attributes"),
        (["--curve-secret-key", "/nonexistent"], "go together"),
        (["--registration-backoff", "5", "--registration-backoff-max", "1"], "backoff"),
    ],
)
def test_bad_combinations(tmp_path: Path, argv: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        build(_values(["--work-dir", str(tmp_path), *argv]))


@pytest.mark.parametrize(
    "argv",
    [["--master-timeout", "0"], ["--log-format", "xml"], ["--master", "localhost"]],
)
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _values(argv)
    assert exc.value.code == 2


# ---- small pieces of the daemon ------------------------------------------------------------------


def test_advertised_endpoint() -> None:
    assert advertised_endpoint("tcp://0.0.0.0:4000") == "tcp://127.0.0.1:4000"
    assert advertised_endpoint("tcp://127.0.0.1:4000") == "tcp://127.0.0.1:4000"
    assert advertised_endpoint("ipc:///tmp/x") == "ipc:///tmp/x"


def test_sandbox_paths_stay_in_the_work_dir(tmp_path: Path) -> None:
    good = resolve_sandbox(str(tmp_path), "frameworks/f/executors/e")
    assert good == str(tmp_path.resolve() / "frameworks/f/executors/e")
    for bad in ["/etc", "../x", "frameworks/../../x", "", ".", "a/\x00"]:
        with pytest.raises(LaunchError):
            resolve_sandbox(str(tmp_path), bad)
    os.symlink("/", tmp_path / "escape")
    with pytest.raises(LaunchError, match="escapes"):
        resolve_sandbox(str(tmp_path), "escape/tmp")


def test_executor_argv() -> None:
    def info(command: CommandInfo) -> ExecutorInfo:
        return ExecutorInfo(
            executor_id=ExecutorID("e"), framework_id=FrameworkID("f"), command=command
        )

    assert executor_argv(info(CommandInfo(value="echo hi")), False) == ["/bin/sh", "-c", "echo hi"]
    assert executor_argv(info(CommandInfo(argv=("a", "b"), shell=False)), False) == ["a", "b"]
    assert executor_argv(info(CommandInfo(value="/bin/true", shell=False)), False) == ["/bin/true"]
    assert executor_argv(info(CommandInfo(value="x")), True)[1:] == [
        "-m",
        "agora.agent.executors.command",
    ]
    # No command at all: Mesos's DEFAULT executor, i.e. ours.
    assert executor_argv(info(CommandInfo()), False)[1:] == ["-m", "agora.agent.executors.command"]
    # A Mesos executor runs through the bridge, which runs its command line.
    bridge = ["-m", "agora.agent.executors.mesos_bridge"]
    mesos = msgspec.structs.replace(info(CommandInfo(value="./exec --x 1")), mesos=True)
    assert executor_argv(mesos, False)[1:] == [*bridge, "./exec --x 1"]
    argv = msgspec.structs.replace(
        info(CommandInfo(argv=("./exec", "a b"), shell=False)), mesos=True
    )
    assert executor_argv(argv, False)[1:] == [*bridge, "./exec 'a b'"]
