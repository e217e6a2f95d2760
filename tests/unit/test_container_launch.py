"""Container launcher without namespaces (any user): argv, env, cwd, fds, errors, spec checks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.launch import Bind, ContainerSpec, LaunchError, spawn
from support.polling import wait_for

PATH = {"PATH": "/usr/bin:/bin"}


class Stdio:
    """stdin from a file, stdout and stderr to files, all under a test's tmp_path."""

    def __init__(self, root: Path, stdin_text: str = "") -> None:
        self.root = root
        (root / "in").write_text(stdin_text)
        self.stdin = os.open(root / "in", os.O_RDONLY | os.O_CLOEXEC)
        self.stdout = os.open(root / "out", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.stderr = os.open(root / "err", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def out(self) -> str:
        return (self.root / "out").read_text()

    def err(self) -> str:
        return (self.root / "err").read_text()

    def close(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr):
            os.close(fd)


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[Stdio]:
    io = Stdio(tmp_path, stdin_text="from stdin\n")
    yield io
    io.close()


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


def spec_for(
    io: Stdio, sandbox: Path, *argv: str, env: dict[str, str] | None = None
) -> ContainerSpec:
    return ContainerSpec(
        argv=argv,
        env=PATH if env is None else env,
        sandbox=str(sandbox),
        stdin=io.stdin,
        stdout=io.stdout,
        stderr=io.stderr,
    )


def wait_exit(pid: int, timeout: float = 10.0) -> int:
    """The exit code of child ``pid``, polled with a deadline."""

    def done() -> int | None:
        got, status = os.waitpid(pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) + 1000 if got == pid else None

    return wait_for(done, timeout=timeout, what=f"pid {pid} to exit") - 1000


def test_runs_argv_in_the_sandbox_with_the_given_stdio(stdio: Stdio, sandbox: Path) -> None:
    script = 'printf "%s|%s|" "$1" "$(pwd)"; cat; echo oops >&2; exit 3'
    pid = spawn(spec_for(stdio, sandbox, "sh", "-c", script, "sh", "first arg"))
    assert wait_exit(pid) == 3
    assert stdio.out() == f"first arg|{sandbox}|from stdin\n"
    assert stdio.err() == "oops\n"


def test_environment_is_exactly_the_given_one(stdio: Stdio, sandbox: Path) -> None:
    pid = spawn(spec_for(stdio, sandbox, "/usr/bin/env", env={"ONLY": "this one"}))
    assert wait_exit(pid) == 0
    assert stdio.out() == "ONLY=this one\n"


def test_program_is_found_on_the_task_path(stdio: Stdio, sandbox: Path) -> None:
    bin_dir = sandbox / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "agora-test-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    pid = spawn(spec_for(stdio, sandbox, "agora-test-tool", env=env))
    assert wait_exit(pid) == 0
    assert stdio.out() == "tool ran\n"


def test_only_stdio_is_inherited(stdio: Stdio, sandbox: Path) -> None:
    leak = os.open(os.devnull, os.O_RDONLY)  # inheritable on purpose
    os.set_inheritable(leak, True)
    try:
        pid = spawn(spec_for(stdio, sandbox, "sh", "-c", "ls /proc/$$/fd"))
        assert wait_exit(pid) == 0
    finally:
        os.close(leak)
    assert stdio.out().split() == ["0", "1", "2"]


def test_signals_are_not_ignored_or_blocked_in_the_command(stdio: Stdio, sandbox: Path) -> None:
    # Python ignores SIGPIPE; the command must get the default (die on a closed pipe).
    # `exec`: grep reads its own status. Reading the shell's races with dash, which blocks every
    # signal around its wait for a child.
    pid = spawn(
        spec_for(stdio, sandbox, "sh", "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status")
    )
    assert wait_exit(pid) == 0
    masks = dict(line.split(":\t") for line in stdio.out().splitlines())
    assert int(masks["SigBlk"], 16) == 0
    assert int(masks["SigIgn"], 16) & (1 << (13 - 1)) == 0  # SIGPIPE


def test_exec_failure_raises_naming_the_command(stdio: Stdio, sandbox: Path) -> None:
    with pytest.raises(LaunchError, match=r"no-such-agora-command.*No such file"):
        spawn(spec_for(stdio, sandbox, "no-such-agora-command"))


def test_missing_sandbox_is_refused(stdio: Stdio, tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="not a directory"):
        spawn(spec_for(stdio, tmp_path / "missing", "true"))


def test_closed_stdout_is_refused(stdio: Stdio, sandbox: Path) -> None:
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    spec = ContainerSpec(("true",), PATH, str(sandbox), stdio.stdin, closed, stdio.stderr)
    with pytest.raises(LaunchError, match="stdout"):
        spawn(spec)


def test_pid_namespace_implies_mount() -> None:
    spec = ContainerSpec(("true",), {}, "/s", 0, 1, 2, namespaces=frozenset({"pid"}))
    assert spec.namespaces == {"pid", "mount"}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"argv": ()}, "argv"),
        ({"argv": ("",)}, "argv"),
        ({"argv": ("a\0b",)}, "argv"),
        ({"env": {"A=B": "x"}}, "environment"),
        ({"sandbox": "relative/dir"}, "sandbox"),
        ({"stdout": -1}, "stdout"),
        ({"uid": -5}, "uid"),
        ({"namespaces": frozenset({"user"})}, "unknown namespaces"),
        ({"hostname": "box"}, "uts"),
        ({"namespaces": frozenset({"uts"}), "hostname": "x" * 65}, "hostname"),
        ({"rootfs": "/img"}, "mount"),
        ({"volumes": (Bind("/data", "data"),)}, "mount"),
        ({"namespaces": frozenset({"mount"}), "volumes": (Bind("/data", "/abs"),)}, "rootfs"),
        ({"namespaces": frozenset({"mount"}), "volumes": (Bind("/data", "../up"),)}, "volume"),
        ({"namespaces": frozenset({"mount"}), "volumes": (Bind("rel", "data"),)}, "volume"),
        ({"cgroup_procs": ("cgroup.procs",)}, "cgroup_procs"),
    ],
)
def test_bad_spec_values_are_rejected(changes: dict[str, object], why: str) -> None:
    fields: dict[str, object] = {
        "argv": ("true",),
        "env": {},
        "sandbox": "/s",
        "stdin": 0,
        "stdout": 1,
        "stderr": 2,
    }
    fields.update(changes)
    with pytest.raises(LaunchError, match=why):
        ContainerSpec(**fields)  # type: ignore[arg-type]
