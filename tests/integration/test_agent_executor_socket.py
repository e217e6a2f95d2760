"""The real agent daemon serves its executors on a Unix socket in its work dir by default: the
socket has the intended modes, a task runs through it, the agent listens on no TCP port, and an
agent restarted after a SIGKILL (its socket file left behind) binds the same path again and
re-adopts the running executor."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest
from agora.sdk.ids import TaskID
from agora.sdk.messages import AgentReregistered, KillTask, MasterInfo, ReregisterAgent, TaskState
from support.agent_daemon_kit import (
    EPOCH,
    FID,
    agent_process,
    alive,
    eventually,
    read_pid,
    run,
    scenario,
)

pytestmark = pytest.mark.timeout(90)

NO_HTTP = ("--http-port", "none")  # the HTTP API is TCP by nature: off, to see the rest


def _listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (from its fds and /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode().partition("=") for item in f.read().split(b"\0") if item]
    return {key: value for key, _, value in pairs}


def test_executors_connect_through_a_unix_socket_and_nothing_listens_on_tcp(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with scenario(tmp_path, *NO_HTTP) as (master, agent):
            await master.register()
            await master.run_to_running("s1", "echo $$ > task.pid; exec sleep 1000")
            path = agent.work_dir / "run" / "executors.sock"
            assert stat.S_ISSOCK(os.lstat(path).st_mode)
            # A root agent that switches users may have executors of any user: 0711 and 0666,
            # the executor secret being what tells executors apart.
            expected = (0o711, 0o666) if os.geteuid() == 0 else (0o700, 0o600)
            modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (path.parent, path)]
            assert tuple(modes) == expected
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            assert _environ(executor_pid)["AGORA_AGENT_ENDPOINT"] == f"ipc://{path}"
            assert '"transport": "ipc"' in agent.log() and '"why": "default"' in agent.log()
            # The check sees listeners: the fake master's in this very process.
            assert _listening_tcp_ports(os.getpid()), "the TCP listener check finds nothing"
            assert _listening_tcp_ports(agent.proc.pid) == set()

            # Killed hard, the agent leaves its socket file; the next one replaces it.
            task_pid = await read_pid(agent.task_sandbox("s1") / "task.pid")
            agent.proc.send_signal(signal.SIGKILL)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to die")
            assert stat.S_ISSOCK(os.lstat(path).st_mode)
            assert alive(executor_pid) and alive(task_pid)
            with agent_process(tmp_path, master.endpoint, *NO_HTTP) as again:
                rereg = await master.expect(ReregisterAgent)
                info = MasterInfo(master_id="fake", address=master.endpoint, epoch=EPOCH)
                await master.send(AgentReregistered(agent_id=rereg.agent_id, master_info=info))
                await eventually(lambda: "agent_recovered" in again.log(), "recovery")
                assert "executor_socket_stale_removed" in again.log()
                assert '"why": "recovered"' in again.log()
                assert _listening_tcp_ports(again.proc.pid) == set()
                # The same executor re-attached through the new socket: it runs the kill.
                await master.send(KillTask(framework_id=FID, task_id=TaskID("s1")))
                killed = await master.update("s1", TaskState.KILLED)
                await master.ack(killed)
                await eventually(lambda: not alive(task_pid), "the task to end")
                assert alive(executor_pid)

    run(main())


def test_an_agent_without_executors_to_adopt_chooses_its_socket_afresh(tmp_path: Path) -> None:
    """A checkpointed TCP endpoint (an agent run with --executor-bind tcp://…, or from before
    Unix sockets) binds again only while executors may still connect to it."""

    async def main() -> None:
        tcp = ("--executor-bind", "tcp://127.0.0.1:0")
        async with scenario(tmp_path, *NO_HTTP, *tcp) as (master, agent):
            await master.register()
            assert agent.executor_endpoint().startswith("tcp://")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to stop")
            with agent_process(tmp_path, master.endpoint, *NO_HTTP) as again:
                await master.expect(ReregisterAgent)
                path = again.work_dir / "run" / "executors.sock"
                assert again.executor_endpoint() == f"ipc://{path}"
                assert '"why": "default"' in again.log()

    run(main())


def test_executor_bind_still_chooses_tcp(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path, *NO_HTTP, "--executor-bind", "tcp://127.0.0.1:0") as (
            master,
            agent,
        ):
            await master.register()
            await master.run_to_running("t1", "true; exec sleep 1000")
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            endpoint = _environ(executor_pid)["AGORA_AGENT_ENDPOINT"]
            assert endpoint.startswith("tcp://127.0.0.1:")
            assert _listening_tcp_ports(agent.proc.pid) == {int(endpoint.rpartition(":")[2])}
            assert not (agent.work_dir / "run").exists()

    run(main())
