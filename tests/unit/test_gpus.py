"""GPU discovery from nvidia-smi's output (a stand-in script on PATH), and the GPU allocator."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import structlog
from agora.agent.containers.gpus import (
    QUERY_ARGS,
    Gpu,
    GpuAllocator,
    GpuError,
    device_paths,
    discover_gpus,
    minor_from_proc,
    parse_nvidia_smi,
    visible_devices_env,
)

TWO_GPUS = """\
0, GPU-8f6b2c1e-4d3a-11ee-9c1b-0242ac120002, NVIDIA GeForce RTX 3090, 00000000:01:00.0, 24576
1, GPU-a1b2c3d4-4d3a-11ee-9c1b-0242ac120003, NVIDIA GeForce RTX 3090, 00000000:21:00.0, 24576
"""

FOUR_GPUS = """\
0, GPU-11111111-2222-3333-4444-555555555550, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 40960
1, GPU-11111111-2222-3333-4444-555555555551, NVIDIA A100-SXM4-40GB, 00000000:0F:00.0, 40960
2, GPU-11111111-2222-3333-4444-555555555552, NVIDIA A100-SXM4-40GB, 00000000:47:00.0, 40960
3, GPU-11111111-2222-3333-4444-555555555553, NVIDIA A100-SXM4-40GB, 00000000:4E:00.0, 40960
"""


def four() -> list[Gpu]:
    return parse_nvidia_smi(FOUR_GPUS)


# --- parsing ------------------------------------------------------------------------------


def test_parse_two_gpu_machine() -> None:
    gpus = parse_nvidia_smi(TWO_GPUS)
    assert gpus == [
        Gpu(0, "GPU-8f6b2c1e-4d3a-11ee-9c1b-0242ac120002", "NVIDIA GeForce RTX 3090", 0, 24576),
        Gpu(1, "GPU-a1b2c3d4-4d3a-11ee-9c1b-0242ac120003", "NVIDIA GeForce RTX 3090", 1, 24576),
    ]


def test_parse_four_gpu_machine_sorted_by_index_blank_lines_ignored() -> None:
    shuffled = "\n".join(reversed(FOUR_GPUS.splitlines())) + "\n\n"
    gpus = parse_nvidia_smi(shuffled)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert all(g.name == "NVIDIA A100-SXM4-40GB" and g.memory_mib == 40960 for g in gpus)
    assert gpus[2].uuid == "GPU-11111111-2222-3333-4444-555555555552"


def test_parse_name_with_comma_and_unknown_memory() -> None:
    (gpu,) = parse_nvidia_smi("0, GPU-x, Tesla K80, rev B, 00000000:01:00.0, [N/A]\n")
    assert gpu.name == "Tesla K80, rev B"
    assert gpu.memory_mib == 0


@pytest.mark.parametrize(
    "line",
    [
        "0, GPU-x, 00000000:01:00.0, 100",  # a field short
        "zero, GPU-x, Tesla, 00000000:01:00.0, 100",
        "0, GPU-x, Tesla, 00000000:01:00.0, lots",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    ],
)
def test_parse_malformed_line_names_it(line: str) -> None:
    text = TWO_GPUS + line + "\n"
    with pytest.raises(ValueError, match="line 3") as caught:
        parse_nvidia_smi(text)
    assert line[:20] in str(caught.value)


def test_parse_duplicate_index_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_nvidia_smi(TWO_GPUS + TWO_GPUS)


def test_minor_comes_from_the_driver_when_known(tmp_path: Path) -> None:
    # The driver's directory uses a 4-digit PCI domain, lower case.
    info = tmp_path / "0000:0f:00.0"
    info.mkdir()
    (info / "information").write_text("Model: \t\t NVIDIA A100\nDevice Minor: \t 6\n")
    assert minor_from_proc("00000000:0F:00.0", str(tmp_path)) == 6
    assert minor_from_proc("00000000:07:00.0", str(tmp_path)) is None

    gpus = parse_nvidia_smi(FOUR_GPUS, lambda bus: minor_from_proc(bus, str(tmp_path)))
    assert [g.minor for g in gpus] == [0, 6, 2, 3]


# --- discovery ----------------------------------------------------------------------------


def fake_nvidia_smi(folder: Path, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def test_discover_finds_gpus_through_nvidia_smi_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "out.txt"
    output.write_text(FOUR_GPUS)
    # It answers only to the query the parser expects.
    args = " ".join(QUERY_ARGS)
    fake_nvidia_smi(
        tmp_path / "bin",
        f'[ "$*" = "{args}" ] || {{ echo "bad args: $*" >&2; exit 2; }}\ncat {output}\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    gpus = discover_gpus()
    # Minors come from the driver's /proc files where there is a driver; here, the indices.
    assert [(g.index, g.uuid, g.name, g.memory_mib) for g in gpus] == [
        (g.index, g.uuid, g.name, g.memory_mib) for g in four()
    ]


def test_discover_without_nvidia_smi_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert discover_gpus() == []


def test_discover_failing_nvidia_smi_is_empty_with_a_warning(tmp_path: Path) -> None:
    script = fake_nvidia_smi(
        tmp_path, "echo 'Failed to initialize NVML: Driver mismatch'\nexit 9\n"
    )
    with structlog.testing.capture_logs() as logs:
        assert discover_gpus(str(script)) == []
    (event,) = [e for e in logs if e["event"] == "gpu_discovery_failed"]
    assert event["log_level"] == "warning"
    assert event["exit_code"] == 9
    assert "Driver mismatch" in event["error"]


def test_discover_garbage_output_is_empty_with_a_warning(tmp_path: Path) -> None:
    script = fake_nvidia_smi(tmp_path, "echo 'No devices were found, sorry'\n")
    with structlog.testing.capture_logs() as logs:
        assert discover_gpus(str(script)) == []
    assert [e["log_level"] for e in logs if e["event"] == "gpu_discovery_failed"] == ["warning"]


def test_discover_hung_nvidia_smi_times_out(tmp_path: Path) -> None:
    # A wrapper whose child hangs: killing the shell alone would leave the pipes open.
    pidfile = tmp_path / "child.pid"
    script = fake_nvidia_smi(tmp_path, f"sleep 60 &\necho $! > {pidfile}\nwait\n")
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        assert discover_gpus(str(script), timeout=0.5) == []
    assert time.monotonic() - started < 5
    assert any(e["event"] == "gpu_discovery_failed" for e in logs)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(child), "the hung child was left running"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- devices and environment --------------------------------------------------------------


def test_device_paths_per_gpu_minor_and_control_devices() -> None:
    gpus = [Gpu(2, "GPU-c", "A100", 5, 1), Gpu(0, "GPU-a", "A100", 0, 1)]
    assert device_paths(gpus) == [
        "/dev/nvidia0",
        "/dev/nvidia5",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    assert device_paths([]) == []


def test_visible_devices_env() -> None:
    gpus = four()
    env = visible_devices_env([gpus[2], gpus[0]])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA numbers GPUs as nvidia-smi does
    none = visible_devices_env([])
    assert none["CUDA_VISIBLE_DEVICES"] == "" and none["NVIDIA_VISIBLE_DEVICES"] == ""


# --- allocator ----------------------------------------------------------------------------


def test_allocate_lowest_free_exclusively() -> None:
    alloc = GpuAllocator(four())
    a = alloc.allocate("a", 2)
    b = alloc.allocate("b", 1)
    assert [g.index for g in a] == [0, 1]
    assert [g.index for g in b] == [2]
    assert alloc.free == 1
    assert alloc.held("a") == a and alloc.held("nobody") == ()


def test_release_frees_for_the_next() -> None:
    alloc = GpuAllocator(four())
    alloc.allocate("a", 1)
    alloc.allocate("b", 2)
    alloc.release("a")
    alloc.release("a")  # twice is harmless
    assert alloc.free == 2
    assert [g.index for g in alloc.allocate("c", 2)] == [0, 3]
    assert alloc.held("a") == ()


def test_not_enough_is_an_error_and_changes_nothing() -> None:
    alloc = GpuAllocator(parse_nvidia_smi(TWO_GPUS))
    alloc.allocate("a", 1)
    with pytest.raises(GpuError, match="1 of 2 are free"):
        alloc.allocate("b", 2)
    assert alloc.free == 1 and alloc.held("b") == ()
    with pytest.raises(GpuError, match="already"):
        alloc.allocate("a", 1)
    with pytest.raises(GpuError):
        alloc.allocate("c", -1)
    assert alloc.allocate("d", 0) == ()
    assert alloc.free == 1


def test_restore_after_agent_restart() -> None:
    alloc = GpuAllocator(four())
    alloc.restore("a", [3, 1])
    assert [g.index for g in alloc.held("a")] == [1, 3]
    assert [g.index for g in alloc.allocate("b", 2)] == [0, 2]
    alloc.restore("a", [1, 3])  # again: the same
    assert alloc.free == 0
    with pytest.raises(GpuError, match="another owner"):
        alloc.restore("c", [0])
    with pytest.raises(GpuError, match="does not have"):
        alloc.restore("c", [7])
    assert alloc.held("c") == ()
    alloc.release("a")
    assert alloc.free == 2
