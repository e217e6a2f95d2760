"""Agent restarts against a fake master: SIGTERM leaves the executors running, a restarted agent
adopts them, re-registers with the same id and its tasks, and loses no status update;
``--recover=cleanup`` kills them instead; a changed boot id means a new agent."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from agora.agent.server.journal import Journal
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    AgentReregistered,
    KillTask,
    MasterInfo,
    Reason,
    ReregisterAgent,
    TaskState,
    UnregisterAgent,
)
from support.agent_daemon_kit import (
    AGENT_ID,
    EPOCH,
    FID,
    FakeMaster,
    agent_process,
    alive,
    eventually,
    read_pid,
    run,
    scenario,
)

pytestmark = pytest.mark.timeout(90)


async def _reregistered(master: FakeMaster) -> ReregisterAgent:
    rereg = await master.expect(ReregisterAgent)
    info = MasterInfo(master_id="fake", address=master.endpoint, epoch=EPOCH)
    await master.send(AgentReregistered(agent_id=rereg.agent_id, master_info=info))
    return rereg


def test_sigterm_leaves_tasks_running_and_a_restarted_agent_adopts_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("r1", "echo $$ > task.pid; exec sleep 1000")
            task_pid = await read_pid(agent.task_sandbox("r1") / "task.pid")
            executor_pid = await read_pid(agent.sandbox() / "executor.pid")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            assert agent.proc.returncode == 0
            assert alive(task_pid) and alive(executor_pid)
            assert not [m for m in master.backlog if isinstance(m, UnregisterAgent)]

            with agent_process(tmp_path, master.endpoint) as again:
                rereg = await _reregistered(master)
                assert rereg.agent_id == AGENT_ID
                assert [(t.task.task_id, t.state) for t in rereg.tasks] == [
                    ("r1", TaskState.RUNNING)
                ]
                await eventually(lambda: "agent_recovered" in again.log(), "recovery")
                # The executor re-attached: a kill reaches the task through it.
                await master.send(KillTask(framework_id=FID, task_id=TaskID("r1")))
                killed = await master.update("r1", TaskState.KILLED)
                await master.ack(killed)
                await eventually(lambda: not alive(task_pid), "the task to end")
                assert alive(executor_pid), "the same executor process ran the kill"

    run(main())


def test_an_update_sent_while_the_agent_was_down_is_delivered_after_restart(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            script = "echo $$ > task.pid; until [ -e go ]; do sleep 0.05; done; exit 7"
            await master.run_to_running("r2", script)
            task_pid = await read_pid(agent.task_sandbox("r2") / "task.pid")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            # The task ends while no agent runs: its executor holds the update.
            (agent.task_sandbox("r2") / "go").touch()
            await eventually(lambda: not alive(task_pid), "the task to end")
            with agent_process(tmp_path, master.endpoint) as again:
                await _reregistered(master)
                failed = await master.update("r2", TaskState.FAILED)
                assert failed.exit_code == 7
                await master.ack(failed)
                assert again.proc.poll() is None

    run(main())


def test_recover_cleanup_kills_what_was_running(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await master.run_to_running("c1", "echo $$ > task.pid; exec sleep 1000")
            task_pid = await read_pid(agent.task_sandbox("c1") / "task.pid")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            with agent_process(tmp_path, master.endpoint, "--recover", "cleanup"):
                rereg = await _reregistered(master)
                assert rereg.agent_id == AGENT_ID
                failed = await master.update("c1", TaskState.FAILED)
                assert failed.reason is Reason.AGENT_RESTARTED
                assert "cleanup" in failed.message
                await eventually(lambda: not alive(task_pid), "the task to be killed")

    run(main())


def test_a_new_boot_id_starts_a_new_agent(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            # As if the host had rebooted since: the checkpoint's boot id is not this boot's.
            journal = Journal(str(agent.work_dir / "meta" / "journal"))
            records = journal.load()
            assert ("agent", "id") in records
            journal.put("shell", "boot_id", b"another-boot")
            journal.commit()
            journal.close()
            with agent_process(tmp_path, master.endpoint) as again:
                await master.register()  # REGISTER_AGENT, not a re-registration
                await eventually(
                    lambda: "host_rebooted_checkpoint_discarded" in again.log(), "the discard"
                )
                assert not [m for m in master.backlog if isinstance(m, ReregisterAgent)]

    run(main())
