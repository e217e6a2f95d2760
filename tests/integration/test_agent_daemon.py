"""The real agent daemon (a subprocess) against a fake master written here.

The fake master is a ZmqServer speaking the master's side of the agent protocol by hand:
AGENT_REGISTERED, RUN_TASK, STATUS_UPDATE_ACK, KILL_TASK, PING. Tasks run through the real command
executor. Every process a test starts (agent, executors, tasks: their pids are in the work dir) is
killed in a finally block.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio
from agora.sdk.codec import decode, encode
from agora.sdk.ids import ExecutorID, TaskID
from agora.sdk.messages import (
    AgentReregistered,
    CommandInfo,
    ExecutorInfo,
    ExitedExecutor,
    KillTask,
    MasterInfo,
    Ping,
    Pong,
    Reason,
    RegisterAgent,
    RegisterExecutor,
    ReregisterAgent,
    RunTask,
    ShutdownAgent,
    ShutdownExecutor,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    UnregisterAgent,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import CurveServer, ZmqServer, generate_keypair
from support.agent_daemon_kit import (
    AGENT_ID,
    EPOCH,
    FID,
    FRAMEWORK,
    WAIT,
    FakeMaster,
    agent_process,
    alive,
    eventually,
    ours,
    pids_in,
    read_pid,
    run,
    scenario,
    wait_for_executor,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module", autouse=True)
def _command_executor() -> None:
    wait_for_executor()


# ---- tests -------------------------------------------------------------------------------------


def test_registers_with_detected_resources_and_runs_a_command(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            reg = await master.register()
            info = reg.agent_info
            assert info.hostname == "test-host"
            assert dict(info.attributes) == {"rack": "r1", "zone": "z"}
            assert info.resources.scalar("cpus") == os.cpu_count()
            assert info.resources.scalar("mem") > 0
            assert info.resources.scalar("disk") > 0
            assert info.resources.ranges("ports") == ((31000, 32000),)
            assert info.port == 0  # the executor socket's port: none, it is a Unix socket

            await master.send(Ping())
            await master.expect(Pong)

            await master.run_task("t1", "echo hi")
            running = await master.update("t1")
            assert running.state == TaskState.RUNNING
            assert running.agent_id == AGENT_ID
            # Not acknowledged: the same head comes again, and nothing after it meanwhile.
            again = await master.update("t1")
            assert again.uuid == running.uuid and again.state == TaskState.RUNNING
            await master.ack(running)
            finished = await master.update("t1", TaskState.FINISHED)
            assert finished.uuid != running.uuid
            await master.ack(finished)
            stdout = agent.task_sandbox("t1") / "stdout"
            await eventually(lambda: stdout.exists() and "hi" in stdout.read_text(), "stdout")
            assert (agent.sandbox() / "executor.pid").read_text().strip().isdigit()

    run(main())


def test_kill_task(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("t2", "echo $$ > task.pid; exec sleep 1000")
            pid = await read_pid(agent.task_sandbox("t2") / "task.pid")
            await master.send(KillTask(framework_id=FID, task_id=TaskID("t2")))
            killed = await master.update("t2", TaskState.KILLED)
            await master.ack(killed)
            await eventually(lambda: not alive(pid), "the killed task's process to end")

    run(main())


def test_executor_killed_fails_its_tasks_and_leaves_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("t3", "echo $$ > task.pid; exec sleep 1000")
            task_pid = await read_pid(agent.task_sandbox("t3") / "task.pid")
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            os.kill(executor_pid, signal.SIGKILL)
            failed = await master.update("t3", TaskState.FAILED)
            assert failed.reason == Reason.EXECUTOR_TERMINATED
            await master.ack(failed)
            exited = await master.expect(ExitedExecutor)
            assert exited.status == -signal.SIGKILL
            # The executor's orphaned task is adopted by the agent and killed.
            await eventually(lambda: not alive(task_pid), "the orphaned task to be killed")
            await eventually(lambda: not alive(executor_pid), "the executor to be reaped")
            # The agent still launches tasks (a fresh command executor).
            await master.run_task("t4", "true")
            await master.ack(await master.update("t4", TaskState.RUNNING))
            await master.ack(await master.update("t4", TaskState.FINISHED))

    run(main())


async def _garbage_to_executor_socket(endpoint: str) -> None:
    """Junk on the executor socket, then a stranger registering: it is told to shut down."""
    ctx = zmq.asyncio.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        await sock.send(b"\xc1 not msgpack")
        await sock.send_multipart([b"two", b"parts"])
        await sock.send(msgpack.packb(["RUN_TASK", 1, 0, {"bogus": 1}]))
        await sock.send(msgpack.packb(["NO_SUCH_MESSAGE", 1, 0, {}]))
        await sock.send(b"")
        # Same connection, so it arrives after the junk: an executor the agent never launched.
        nobody = RegisterExecutor(framework_id=FID, executor_id=ExecutorID("nobody"))
        await sock.send(encode(nobody))
        reply = await asyncio.wait_for(sock.recv(), WAIT)
        assert isinstance(decode(reply).message, ShutdownExecutor)
        sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)


async def _garbage_from_master(endpoint: str) -> None:
    """A raw ROUTER on the master's endpoint: answers the agent's re-registration with junk."""
    ctx = zmq.asyncio.Context()
    try:
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        deadline = time.monotonic() + WAIT
        while True:
            peer, frame = await asyncio.wait_for(sock.recv_multipart(), deadline - time.monotonic())
            if isinstance(decode(frame).message, ReregisterAgent | RegisterAgent):
                break
        stale = TaskInfo(
            task_id=TaskID("stale"),
            name="stale",
            agent_id=AGENT_ID,
            resources=Resources.parse("cpus:0.1"),
            command=CommandInfo(value="true"),
        )
        for junk in (
            b"\xc1 not msgpack",
            msgpack.packb(["PING", 1, EPOCH, {"connected": "yes"}]),
            msgpack.packb(["NO_SUCH_MESSAGE", 1, EPOCH, {}]),
            msgpack.packb([1, 2, 3]),
            # A deposed master (older epoch) must not launch anything.
            encode(RunTask(framework_info=FRAMEWORK, framework_id=FID, task=stale), epoch=1),
        ):
            await sock.send_multipart([peer, junk])
        await sock.send_multipart([peer, b"extra", b"parts"])
        # The agent still serves this link: it answers a valid PING, or retries registering.
        await sock.send_multipart([peer, encode(Ping(), epoch=EPOCH)])
        deadline = time.monotonic() + WAIT
        while True:
            _, frame = await asyncio.wait_for(sock.recv_multipart(), deadline - time.monotonic())
            if isinstance(decode(frame).message, Pong | ReregisterAgent | RegisterAgent):
                break
        sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)


def test_bad_frames_do_not_stop_the_agent(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.send(Ping())
            await master.expect(Pong)  # the registration has been taken in
            await _garbage_to_executor_socket(agent.executor_endpoint())

            # The master goes away; junk comes from its endpoint; then it is back.
            endpoint = master.endpoint
            master.close()
            await _garbage_from_master(endpoint)
            master2 = FakeMaster.bind(endpoint)
            try:
                rereg = await master2.expect(ReregisterAgent)
                assert rereg.agent_id == AGENT_ID
                info = MasterInfo(master_id="fake", address=endpoint, epoch=EPOCH)
                await master2.send(AgentReregistered(agent_id=AGENT_ID, master_info=info))
                await master2.run_task("t5", "echo alive")
                await master2.ack(await master2.update("t5", TaskState.RUNNING))
                await master2.ack(await master2.update("t5", TaskState.FINISHED))
                stale = [
                    m
                    for m in master2.seen
                    if isinstance(m, StatusUpdateMessage) and m.update.status.task_id == "stale"
                ]
                assert stale == []
                assert not (agent.work_dir / "frameworks" / FID / "executors" / "stale").exists()
                assert agent.proc.poll() is None
                assert "bad_frame_from_master" in agent.log()
                assert "bad_frame_from_executor" in agent.log()
            finally:
                master2.close()

    run(main())


def test_sigusr1_drains_everything_and_exits_0(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            for tid in ("s1", "s2"):
                await master.run_to_running(tid, "echo $$ > task.pid; exec sleep 1000")
            pids = [await read_pid(agent.task_sandbox(t) / "task.pid") for t in ("s1", "s2")]
            pids.append(await read_pid(agent.sandbox() / "executor.pid"))
            assert all(alive(p) for p in pids)
            agent.proc.send_signal(signal.SIGUSR1)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert agent.proc.returncode == 0
            survivors = [p for p in pids if alive(p)]
            assert survivors == []

            # What the executors' ends produced reached the master before the agent left, and
            # so did the farewell.
            def terminal(m: StatusUpdateMessage) -> bool:
                return m.update.status.state in (TaskState.KILLED, TaskState.FAILED)

            await master.expect(StatusUpdateMessage, terminal, timeout=5)
            bye = await master.expect(UnregisterAgent, timeout=5)
            assert bye.agent_id == AGENT_ID
            assert "agent_stopped" in agent.log()

    run(main())


def test_draining_with_a_stubborn_task_leaves_nothing(tmp_path: Path) -> None:
    """A task that ignores SIGTERM outlives the grace period: it is killed all the same."""

    async def main() -> None:
        async with scenario(tmp_path, "--executor-shutdown-grace-period", "0.5") as (m, agent):
            await m.register()
            await m.run_to_running("x1", "trap '' TERM; echo $$ > task.pid; sleep 1000 & wait")
            pid = await read_pid(agent.task_sandbox("x1") / "task.pid")
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            agent.proc.send_signal(signal.SIGUSR1)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert agent.proc.returncode == 0
            assert not alive(pid)
            assert not alive(executor_pid)
            assert not [p for p in pids_in(agent.work_dir) if ours(p)]

    run(main())


def _custom_task(task_id: str, executor_id: str, command: CommandInfo) -> RunTask:
    executor = ExecutorInfo(
        executor_id=ExecutorID(executor_id), framework_id=FID, command=command, name="custom"
    )
    task = TaskInfo(
        task_id=TaskID(task_id),
        name=task_id,
        agent_id=AGENT_ID,
        resources=Resources.parse("cpus:0.1"),
        executor=executor,
    )
    return RunTask(framework_info=FRAMEWORK, framework_id=FID, task=task)


def test_executor_that_cannot_start_fails_its_task(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            command = CommandInfo(argv=("/nonexistent/executor",), shell=False)
            await master.send(_custom_task("c1", "broken", command))
            failed = await master.update("c1", TaskState.FAILED)
            assert failed.reason == Reason.CONTAINER_LAUNCH_FAILED
            assert "/nonexistent/executor" in failed.message
            await master.ack(failed)
            await master.expect(ExitedExecutor, lambda m: m.executor_id == "broken")
            assert agent.proc.poll() is None

    run(main())


def test_draining_kills_an_executor_that_ignores_sigterm(tmp_path: Path) -> None:
    """A custom executor trapping SIGTERM is SIGKILLed after the grace period, and the process
    it started in a session of its own (re-parented to the agent) is killed too."""

    async def main() -> None:
        script = "trap '' TERM; setsid sleep 1000 & echo $! > task.pid; echo $$ > shell.pid; wait"
        grace = ("--executor-shutdown-grace-period", "0.5")
        async with scenario(tmp_path, *grace) as (master, agent):
            await master.register()
            await master.send(_custom_task("c2", "stubborn", CommandInfo(value=script)))
            sandbox = agent.sandbox("stubborn")
            child = await read_pid(sandbox / "task.pid")
            executor_pid = await read_pid(sandbox / "executor.pid")
            assert await read_pid(sandbox / "shell.pid") == executor_pid
            assert os.getsid(child) != os.getsid(executor_pid)
            agent.proc.send_signal(signal.SIGUSR1)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert agent.proc.returncode == 0
            assert not alive(executor_pid)
            assert not alive(child)
            log = agent.log()
            assert "executor_killed_after_grace" in log
            assert "orphans_killed" in log

    run(main())


def test_second_signal_while_draining_skips_the_grace_period(tmp_path: Path) -> None:
    async def main() -> None:
        script = "trap '' TERM; echo $$ > shell.pid; sleep 1000 & wait"
        grace = ("--executor-shutdown-grace-period", "60")
        async with scenario(tmp_path, *grace) as (master, agent):
            await master.register()
            await master.send(_custom_task("c3", "stubborn", CommandInfo(value=script)))
            executor_pid = await read_pid(agent.sandbox("stubborn") / "shell.pid")
            started = time.monotonic()
            agent.proc.send_signal(signal.SIGUSR1)
            await eventually(lambda: "executors_terminating" in agent.log(), "the first SIGUSR1")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert time.monotonic() - started < 30  # far from the 60 s grace period
            assert agent.proc.returncode == 0
            assert not alive(executor_pid)
            assert "agent_stop_hastened" in agent.log()

    run(main())


def test_shutdown_agent_from_the_master(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("d1", "echo $$ > task.pid; exec sleep 1000")
            task_pid = await read_pid(agent.task_sandbox("d1") / "task.pid")
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            await master.send(ShutdownAgent(message="decommissioned"))
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert agent.proc.returncode == 0
            assert not alive(task_pid) and not alive(executor_pid)
            assert "agent_terminated_by_master" in agent.log()

    run(main())


def test_curve_master_link(tmp_path: Path) -> None:
    """With CURVE keys the agent registers over an encrypted, authenticated link."""

    async def main() -> None:
        keys, authorized = tmp_path / "keys", tmp_path / "authorized"
        _, server_secret = generate_keypair(keys, "master")
        agent_public, agent_secret = generate_keypair(keys, "agent-1")
        authorized.mkdir()
        (authorized / "agent-1.key").write_bytes(agent_public.read_bytes())
        server = ZmqServer.bind("tcp://127.0.0.1:0", curve=CurveServer(server_secret, authorized))
        master = FakeMaster(server, server.endpoint)
        curve = (
            "--curve-secret-key",
            str(agent_secret),
            "--curve-server-key",
            str(keys / "master.key"),
        )
        try:
            with agent_process(tmp_path, master.endpoint, *curve) as agent:
                received = await asyncio.wait_for(server.recv(), WAIT)
                assert isinstance(received.message, RegisterAgent), agent.log()
                assert received.principal == "agent-1"
        finally:
            master.close()

    run(main())
