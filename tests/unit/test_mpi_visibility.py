"""Paths the ranks cannot see (under their private /tmp) are named in one line before anything
starts: the program, an interpreter's script, the working directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from agora.frameworks.mpi.visibility import script_of, unseen
from agora.sdk.runtime import runtime_paths

SHARED = "/work/project"


@pytest.mark.parametrize(
    ("command", "script"),
    [
        (["python", "-m", "mpi4py", "app.py", "--x"], "app.py"),
        (["python3.11", "-u", "-X", "dev", "-m", "mpi4py", "-rc", "threads=0", "a.py"], "a.py"),
        (["/usr/bin/python3", "app.py"], "app.py"),
        (["python", "-c", "print(1)"], None),
        (["python", "-m", "mpi4py", "-c", "print(1)"], None),
        (["python", "-m", "http.server", "/tmp/x.py"], None),
        (["bash", "-x", "run.sh"], "run.sh"),
        (["./ring", "/tmp/data"], None),
        (["pythonista", "x.py"], None),
        ([], None),
    ],
)
def test_the_script_an_interpreter_runs(command: list[str], script: str | None) -> None:
    assert script_of(command) == script


def test_a_script_under_tmp_is_named_with_why() -> None:
    line = unseen(["python", "-m", "mpi4py", "/tmp/x.py"], SHARED)
    assert line is not None
    assert line.startswith("the script /tmp/x.py is under /tmp, which every rank sees as its own")
    assert "\n" not in line


def test_relative_paths_are_taken_from_the_working_directory() -> None:
    assert unseen(["python", "../../tmp/x.py"], SHARED) is not None
    assert unseen(["./ring"], SHARED) is None
    line = unseen(["../../tmp/ring"], SHARED)
    assert line is not None and line.startswith("the program /tmp/ring ")


def test_a_working_directory_under_tmp_is_refused_first() -> None:
    line = unseen(["python", "-m", "mpi4py", "app.py"], "/tmp/job")
    assert line is not None and line.startswith("the working directory /tmp/job is under /tmp")
    assert "--chdir" in line


def test_shared_paths_and_the_kept_runtime_pass() -> None:
    assert unseen(["python", "-m", "mpi4py", "app.py"], SHARED) is None
    assert unseen(["/tmpfoo/bin/ring"], SHARED) is None  # a sibling of /tmp, not under it
    assert unseen(["python", "-m", "mpi4py", "-c", "pass"], SHARED) is None
    venv = "/tmp/venv"
    assert unseen(["/tmp/venv/bin/python", "-m", "mpi4py", "app.py"], SHARED, (venv,)) is None
    assert unseen(["/tmp/venv/bin/python", "/tmp/x.py"], SHARED, (venv,)) is not None
    # A checkout of Agora under /tmp is kept visible whole: running from inside it is fine.
    assert unseen(["python", "ring.py"], "/tmp/checkout/examples", ("/tmp/checkout",)) is None


def test_the_kept_runtime_holds_this_python_and_agoras_packages() -> None:
    import agora.agent
    import agora.sdk

    kept = runtime_paths()
    assert sys.prefix in kept
    for package in (agora.sdk, agora.agent):  # the agent's executors run from beside the SDK
        for path in package.__path__:  # as imported (an editable install: through pkg/agora)
            for where in (path, os.path.realpath(path)):
                assert any(where.startswith(k + os.sep) for k in kept), (where, kept)


def test_the_cli_prints_one_line_and_submits_nothing(tmp_path: Path) -> None:
    if not str(tmp_path.resolve()).startswith("/tmp/"):
        pytest.skip(f"pytest's temporary directory {tmp_path} is not under /tmp")
    script = tmp_path / "x.py"
    script.write_text("print('never run')\n")
    with socket.socket() as master:  # a master that would see any connection attempt
        master.bind(("127.0.0.1", 0))
        master.listen()
        master.setblocking(False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
        env["AGORA_HOME"] = str(tmp_path / "home")
        endpoint = f"tcp://127.0.0.1:{master.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "agora.sdk.cli", "mpirun", "--master", endpoint, "-n", "2",
             "--", "python", "-m", "mpi4py", str(script)],
            capture_output=True, text=True, timeout=60, env=env, cwd=Path(__file__).parent,
        )  # fmt: skip
        with pytest.raises(BlockingIOError):
            master.accept()
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"agora mpirun: the script {script} is under /tmp"), lines[0]
    assert done.stdout == ""
    assert not (tmp_path / "home").exists()  # not even the job log was opened
