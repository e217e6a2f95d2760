"""A stranger on the executor socket of a real agent daemon cannot take over a running executor.

The stranger knows the ids (anyone can read them from the agent's /state) but not the secret the
agent gave the executor: its REREGISTER_EXECUTOR and its forged FINISHED are refused and logged,
and the real command executor keeps its task, which then finishes normally.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from agora.sdk.codec import encode
from agora.sdk.ids import ExecutorID, TaskID
from agora.sdk.messages import (
    Ping,
    Pong,
    RegisterExecutor,
    ReregisterExecutor,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from support.agent_daemon_kit import (
    FID,
    AgentProcess,
    eventually,
    run,
    scenario,
    wait_for_executor,
)

pytestmark = pytest.mark.timeout(90)

CMD = ExecutorID("agora-command")


@pytest.fixture(scope="module", autouse=True)
def _command_executor() -> None:
    wait_for_executor()


def _refusals(agent: AgentProcess) -> list[dict[str, object]]:
    out = []
    for line in agent.log().splitlines():
        if '"executor_auth_refused"' in line:
            out.append(json.loads(line))
    return out


def _forged_finished() -> StatusUpdate:
    status = TaskStatus(
        task_id=TaskID("t1"),
        state=TaskState.FINISHED,
        source=StatusSource.EXECUTOR,
        uuid=b"\x66" * 16,
        exit_code=0,
    )
    return StatusUpdate(framework_id=FID, status=status)


def test_a_stranger_cannot_take_over_a_running_executor(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("t1", "while [ ! -e go ]; do sleep 0.05; done")
            ctx = zmq.asyncio.Context()
            try:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                # The agent's own Unix socket: a root agent that switches users lets any local
                # user connect (0666), so only the secret keeps a stranger out.
                sock.connect(agent.executor_endpoint())
                forged = _forged_finished()
                takeover = ReregisterExecutor(
                    framework_id=FID, executor_id=CMD, updates=(forged,), secret="guessed"
                )
                await sock.send(encode(takeover))
                await sock.send(encode(StatusUpdateMessage(update=forged)))
                # Same connection, so taken in after the forged update: a second refusal.
                await sock.send(encode(RegisterExecutor(framework_id=FID, executor_id=CMD)))
                await eventually(lambda: len(_refusals(agent)) == 2, "both refusals logged")
                first, second = _refusals(agent)
                assert first["framework_id"] == FID and first["executor_id"] == CMD
                assert first["reason"] == "wrong secret" and second["reason"] == "missing secret"
                assert first["peer"] and first["peer"] == second["peer"]
                # Whatever the forgeries caused on the master link would come before this Pong.
                await master.send(Ping())
                await master.expect(Pong)
                finished = [
                    m
                    for m in master.seen + master.backlog
                    if isinstance(m, StatusUpdateMessage)
                    and m.update.status.state == TaskState.FINISHED
                ]
                assert finished == []
                assert await sock.poll(timeout=0) == 0  # the stranger heard nothing
                sock.close(linger=0)
            finally:
                ctx.destroy(linger=0)
            # The real executor still runs its task, which now ends on its own.
            (agent.task_sandbox("t1") / "go").touch()
            done = await master.update("t1", TaskState.FINISHED)
            assert done.uuid != b"\x66" * 16 and done.exit_code == 0
            await master.ack(done)
            assert agent.proc.poll() is None

    run(main())


def test_the_command_executor_registers_with_its_secret(tmp_path: Path) -> None:
    # The SDK driver reads AGORA_EXECUTOR_SECRET and sends it: no refusal, the task runs.
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("t2", "true")
            await master.ack(await master.update("t2", TaskState.FINISHED))
            assert _refusals(agent) == []

    run(main())


def test_a_strangers_flood_is_logged_a_few_lines_a_second_and_counted(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("t3", "while [ ! -e go ]; do sleep 0.05; done")
            ctx = zmq.asyncio.Context()
            try:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(agent.executor_endpoint())
                for _ in range(300):
                    await sock.send(
                        encode(RegisterExecutor(framework_id=FID, executor_id=CMD, secret="x"))
                    )
                await eventually(
                    lambda: '"executor_auth_refusals_suppressed"' in agent.log(),
                    "the summary of what was kept quiet",
                )
                sock.close(linger=0)
            finally:
                ctx.destroy(linger=0)
            summaries = [
                json.loads(line)
                for line in agent.log().splitlines()
                if '"executor_auth_refusals_suppressed"' in line
            ]
            # A burst of 3, then 3 a second: the flood took well under a second or two.
            assert 3 <= len(_refusals(agent)) <= 12
            assert sum(int(s["count"]) for s in summaries) + len(_refusals(agent)) <= 300
            assert summaries[0]["count"] > 0 and summaries[0]["peers"] == 1
            # The real executor is unaffected: its task ends on its own.
            (agent.task_sandbox("t3") / "go").touch()
            await master.ack(await master.update("t3", TaskState.FINISHED))
            assert agent.proc.poll() is None

    run(main())
