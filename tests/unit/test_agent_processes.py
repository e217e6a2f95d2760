"""Executor process supervision (agora.agent.server.processes), in this process, no subreaper."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import sys
from pathlib import Path

import pytest
from agora.agent.server.processes import ExecutorProcesses, LaunchError, executor_environment
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import CommandInfo, ExecutorInfo

FID = FrameworkID("f")


async def _run_one(
    tmp_path: Path, argv: list[str], *, kill: bool | None = None
) -> tuple[int, Path, int]:
    """Launch ``argv``; optionally signal it; return (exit status, sandbox, pid)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[tuple[FrameworkID, ExecutorID, int]] = loop.create_future()

    def on_exit(fid: FrameworkID, eid: ExecutorID, status: int) -> None:
        exited.set_result((fid, eid, status))

    procs = ExecutorProcesses(loop, str(tmp_path), on_exit, subreaper=False)
    sandbox = tmp_path / "frameworks" / FID / "executors" / "e"
    proc = procs.launch(FID, ExecutorID("e"), argv, str(sandbox), {"PATH": os.environ["PATH"]})
    assert len(procs) == 1 and procs.get(FID, ExecutorID("e")) is proc
    if kill is not None:
        assert procs.signal(FID, ExecutorID("e"), kill)
    try:
        fid, eid, status = await asyncio.wait_for(exited, 10)
    finally:
        procs.close()
    assert (fid, eid) == (FID, "e")
    assert len(procs) == 0 and procs.get(FID, ExecutorID("e")) is None
    assert not procs.signal(FID, ExecutorID("e"), True)  # gone: nothing to signal
    return status, sandbox, proc.pid


def test_exit_status_output_files_and_pid_file(tmp_path: Path) -> None:
    argv = ["/bin/sh", "-c", "echo out; echo err >&2; pwd > where; exit 3"]
    status, sandbox, pid = asyncio.run(_run_one(tmp_path, argv))
    assert status == 3
    assert (sandbox / "executor.stdout").read_text() == "out\n"
    assert (sandbox / "executor.stderr").read_text() == "err\n"
    assert (sandbox / "where").read_text().strip() == str(sandbox)
    assert (sandbox / "executor.pid").read_text().strip() == str(pid)


@pytest.mark.parametrize(("kill", "status"), [(False, -signal.SIGTERM), (True, -signal.SIGKILL)])
def test_signals_reach_the_process_group(tmp_path: Path, kill: bool, status: int) -> None:
    got, _, _ = asyncio.run(_run_one(tmp_path, ["/bin/sh", "-c", "sleep 30"], kill=kill))
    # sh may exec sleep or wait for it; either way the group got the signal
    assert got in (status, 128 - status)


def test_own_session(tmp_path: Path) -> None:
    check = "import os, sys; sys.exit(0 if os.getsid(0) == os.getpid() else 1)"
    argv = [sys.executable, "-c", check]
    status, _, _ = asyncio.run(_run_one(tmp_path, argv))
    assert status == 0


def test_spawn_failure_is_a_launch_error(tmp_path: Path) -> None:
    async def main() -> None:
        procs = ExecutorProcesses(
            asyncio.get_running_loop(), str(tmp_path), lambda *_: None, subreaper=False
        )
        with pytest.raises(LaunchError, match="nonexistent"):
            procs.launch(FID, ExecutorID("e"), ["/nonexistent"], str(tmp_path / "s"), {})
        with pytest.raises(LaunchError, match="unknown user"):
            procs.launch(FID, ExecutorID("e"), ["true"], str(tmp_path / "s"), {}, "no-such-user")
        assert len(procs) == 0

    asyncio.run(main())


def test_environment_layers() -> None:
    info = ExecutorInfo(
        executor_id=ExecutorID("e"),
        framework_id=FID,
        command=CommandInfo(value="x", environment={"A": "info", "B": "info"}),
    )
    env = executor_environment(
        {"HOME": "/h", "AGORA_MASTER": "tcp://m:1", "A": "base"},
        drop=frozenset({"AGORA_MASTER"}),
        info=info,
        given={"B": "core", "AGORA_EXECUTOR_ID": "e"},
        required={"AGORA_SANDBOX": "/s"},
    )
    assert env == {
        "HOME": "/h",
        "A": "info",
        "B": "core",
        "AGORA_EXECUTOR_ID": "e",
        "AGORA_SANDBOX": "/s",
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_runs_as_the_given_user_when_root(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    tmp_path.chmod(0o755)

    async def main() -> tuple[int, Path]:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int] = loop.create_future()
        procs = ExecutorProcesses(
            loop, str(tmp_path), lambda _f, _e, s: exited.set_result(s), subreaper=False
        )
        sandbox = tmp_path / "s"
        procs.launch(
            FID, ExecutorID("e"), ["/bin/sh", "-c", "id -u > uid"], str(sandbox), {}, "nobody"
        )
        try:
            return await asyncio.wait_for(exited, 10), sandbox
        finally:
            procs.close()

    status, sandbox = asyncio.run(main())
    assert status == 0
    assert (sandbox / "uid").read_text().strip() == str(nobody.pw_uid)
    assert sandbox.stat().st_uid == nobody.pw_uid


@pytest.mark.parametrize("switch_user", [False, True])
def test_own_user_or_no_switching_runs_as_the_agent(tmp_path: Path, switch_user: bool) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    user = "nobody" if not switch_user else me

    async def main() -> int:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int] = loop.create_future()
        procs = ExecutorProcesses(
            loop,
            str(tmp_path),
            lambda _f, _e, s: exited.set_result(s),
            switch_user=switch_user,
            subreaper=False,
        )
        argv = ["/bin/sh", "-c", "id -u > uid"]
        procs.launch(FID, ExecutorID("e"), argv, str(tmp_path / "s"), {}, user)
        try:
            return await asyncio.wait_for(exited, 10)
        finally:
            procs.close()

    assert asyncio.run(main()) == 0
    assert (tmp_path / "s" / "uid").read_text().strip() == str(os.geteuid())
