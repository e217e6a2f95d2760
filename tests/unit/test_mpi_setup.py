"""`agora mpirun`'s setup check: what is missing, said so a person knows how to get it."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from agora.frameworks.mpi.setup import missing

OPEN_MPI_4 = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/"


def stub(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that is the whole of $PATH."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


@pytest.fixture
def good_python(tmp_path: Path) -> str:
    return stub(tmp_path / "python", "exit 0")


def install_open_mpi(bin_dir: Path, version_text: str = OPEN_MPI_4) -> None:
    stub(bin_dir / "mpirun", f"printf '%s\\n' '{version_text}'")  # $PATH has no cat
    stub(bin_dir / "orted", "exit 0")


def test_nothing_missing(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(bin_dir)
    assert missing(good_python) == []


def test_no_open_mpi(bin_dir: Path, good_python: str) -> None:
    problems = missing(good_python)
    assert len(problems) == 1
    assert "mpirun, orted not on PATH" in problems[0]
    assert "apt-get install openmpi-bin libopenmpi-dev" in problems[0]


def test_orted_alone_missing(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(bin_dir)
    (bin_dir / "orted").unlink()
    problems = missing(good_python)
    assert len(problems) == 1
    assert "orted not on PATH" in problems[0]
    assert "mpirun" not in problems[0].split(";")[0]


def test_open_mpi_5_is_refused(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(bin_dir, "mpirun (Open MPI) 5.0.3")
    assert missing(good_python) == [
        "found Open MPI 5.0; Agora's launcher supports 4.1: "
        "apt-get install openmpi-bin libopenmpi-dev"
    ]


def test_open_mpi_4_0_is_accepted(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(bin_dir, "mpirun (Open MPI) 4.0.3")
    assert missing(good_python) == []


def test_mpich_is_not_open_mpi(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(
        bin_dir, "HYDRA build details:\n    Version:                                 4.0"
    )
    problems = missing(good_python)
    assert len(problems) == 1
    assert "is not Open MPI" in problems[0]
    assert "supports Open MPI 4.1" in problems[0]


def test_broken_mpirun(bin_dir: Path, good_python: str) -> None:
    install_open_mpi(bin_dir)
    stub(bin_dir / "mpirun", "echo 'error while loading shared libraries' >&2; exit 127")
    problems = missing(good_python)
    assert len(problems) == 1
    assert "--version` failed (error while loading shared libraries)" in problems[0]


def test_python_without_mpi4py(bin_dir: Path, tmp_path: Path) -> None:
    install_open_mpi(bin_dir)
    python = stub(
        tmp_path / "python",
        "echo 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'mpi4py'\" >&2\nexit 1",
    )
    problems = missing(python)
    assert len(problems) == 1
    assert problems[0].startswith("mpi4py: pip install mpi4py")
    assert python in problems[0]
    assert "No module named 'mpi4py'" in problems[0]
    assert "\n" not in problems[0]


def test_python_that_does_not_exist(bin_dir: Path, tmp_path: Path) -> None:
    install_open_mpi(bin_dir)
    problems = missing(str(tmp_path / "no-such-python"))
    assert len(problems) == 1
    assert problems[0].startswith("mpi4py: pip install mpi4py")


def test_hanging_python_is_bounded(bin_dir: Path, tmp_path: Path) -> None:
    install_open_mpi(bin_dir)
    python = stub(tmp_path / "python", "exec /bin/sleep 30")
    started = time.monotonic()
    problems = missing(python, timeout=0.5)
    assert time.monotonic() - started < 5
    assert len(problems) == 1
    assert "timed out" in problems[0]


def test_everything_missing_gives_one_line_each(bin_dir: Path, tmp_path: Path) -> None:
    problems = missing(str(tmp_path / "no-such-python"))
    assert [p.split(":")[0] for p in problems] == ["Open MPI", "mpi4py"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI installed")
def test_this_machine_with_the_real_tools() -> None:
    assert missing(sys.executable) == []
