"""`agora mpirun` on a machine without what MPI needs says what is missing, and bad options are
refused before anything is asked of the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AGORA = (sys.executable, "-m", "agora.sdk.cli")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGORA, "mpirun", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_a_machine_without_open_mpi_is_told_what_to_install(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["PATH"] = str(tmp_path)  # no mpirun, no orted
    env["AGORA_MASTER"] = "tcp://127.0.0.1:9"  # never reached
    done = _run("-n", "2", "--", "python", "-m", "mpi4py", "app.py", env=env)
    assert done.returncode == 1
    assert "cannot run MPI jobs" in done.stderr
    assert "apt-get install openmpi-bin libopenmpi-dev" in done.stderr


def test_bad_options_are_refused_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["AGORA_HOME"] = str(tmp_path)
    env["AGORA_MASTER"] = "tcp://127.0.0.1:9"
    from agora.frameworks.mpi.setup import missing

    if missing():  # the option checks come after the machine check
        return
    for args, named in (
        (["-n", "0", "--", "true"], "-n must be"),
        (["-n", "2"], "give the program after --"),
        (["-n", "2", "--cpus-per-rank", "0", "--", "true"], "--cpus-per-rank"),
        (["-n", "2", "--interface", "a b", "--", "true"], "bad interface"),
    ):
        done = _run(*args, env=env)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("agora mpirun: "), done.stderr
        assert named in done.stderr, (args, done.stderr)
