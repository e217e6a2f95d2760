"""Without CURVE a daemon says so loudly at start (`running_insecure`), and a group of masters
without CURVE refuses to start (exit 2) unless it is told --insecure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agora.sdk.cli.cluster import free_ports
from support.polling import wait_for

MASTER = (sys.executable, "-m", "agora.master.server")


def test_a_master_without_curve_warns_at_start(tmp_path: Path) -> None:
    log = tmp_path / "master.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*MASTER, "--bind", "tcp://127.0.0.1:0", "--work-dir", str(tmp_path / "m")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin"},
        )
    try:
        wait_for(lambda: "running_insecure" in log.read_text(), 20, "running_insecure logged")
        assert proc.poll() is None  # a lone master still runs (a warning, not a refusal)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_group_without_curve_refuses_to_start_unless_insecure(tmp_path: Path) -> None:
    group = ",".join(f"tcp://127.0.0.1:{p}" for p in free_ports(3))
    first = group.split(",")[0]
    argv = [*MASTER, "--bind", first, "--masters", group, "--work-dir", str(tmp_path / "m")]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2, refused
    assert "--insecure" in refused.stderr and "CURVE is off" in refused.stderr
    log = tmp_path / "insecure.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--insecure"], stdout=out, stderr=subprocess.STDOUT, env={"PATH": "/usr/bin"}
        )
    try:
        wait_for(lambda: "running_insecure" in log.read_text(), 20, "running_insecure logged")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=15)
