"""`agora mpirun` on a local cluster (two agents on this machine, as root: each member executor
gets its own UTS namespace and host name, so Open MPI's per-host files never collide)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import LocalCluster
from support.polling import wait_for
from support.procs import mpi_pids

ROOT = Path(__file__).resolve().parents[2]


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root: member executors need their own UTS namespace on one machine"
    from agora.frameworks.mpi.setup import missing

    lacking = missing()
    return f"MPI is not installed: {'; '.join(lacking)}" if lacking else None


pytestmark = pytest.mark.skipif(bool(_why_skip()), reason=str(_why_skip()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("mpi-local"), agents=2, agent_resources="cpus:4;mem:4096"
    ) as c:
        yield c


def mpirun(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env["AGORA_HOME"] = str(cluster.work_dir / "home")
    return subprocess.run(
        [sys.executable, "-m", "agora.sdk.cli", "mpirun", "--master", cluster.endpoint, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_allreduce_prints_each_ranks_line_and_exits_0(cluster: LocalCluster) -> None:
    done = mpirun(
        cluster, "-n", "4", "--ntasks-per-node", "2", "--",
        "python", "-m", "mpi4py", "examples/mpi_allreduce.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert [ln.split(": ", 1)[0] for ln in lines] == ["0", "1", "2", "3"]
    assert all("sum 10 (expected 10)" in ln for ln in lines), lines
    assert {ln.rsplit(" on ", 1)[1].split(":")[0] for ln in lines} == {"agent-0", "agent-1"}
    log = (cluster.work_dir / "home" / "mpi" / "last.log").read_text()
    assert "[1,0]<stdout>:rank 0 of 4" in log  # the job's log keeps mpirun's tagged output


def test_a_rank_that_aborts_fails_the_job_and_leaves_no_mpi_process(
    cluster: LocalCluster,
) -> None:
    done = mpirun(
        cluster, "-n", "4", "--ntasks-per-node", "2", "--",
        "python", "-m", "mpi4py", "examples/mpi_allreduce.py", "--abort", "2",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "2: rank 2: aborting the job with code 3" in done.stdout
    assert "MPI_ABORT was invoked on rank 2" in done.stderr
    wait_for(lambda: not mpi_pids(), 15, "every MPI process to be gone")
