"""The real agent daemon and batches: to a master that reads them it resends its unacknowledged
updates as one STATUS_UPDATES, and it takes a STATUS_UPDATE_ACKS apart into the acks it carries."""

from __future__ import annotations

from pathlib import Path

from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    MasterInfo,
    Message,
    Ping,
    RegisterAgent,
    ReregisterAgent,
    StatusUpdateAck,
    StatusUpdateAcks,
    StatusUpdateMessage,
    StatusUpdates,
    TaskState,
    TaskStatus,
)
from agora.sdk.messages.batching import BATCHES, unbatch
from support.agent_daemon_kit import AGENT_ID, EPOCH, FID, FakeMaster, run, scenario

TASKS = ("t1", "t2", "t3")
INFO_FEATURES = (BATCHES,)


async def _running(master: FakeMaster) -> dict[str, TaskStatus]:
    """The first RUNNING update of every task, whether it came alone or in a batch."""
    seen: dict[str, TaskStatus] = {}
    while len(seen) < len(TASKS):
        for part in unbatch(await master.expect(Message)):
            if not isinstance(part, StatusUpdateMessage):
                continue
            status = part.update.status
            if status.state is TaskState.RUNNING:
                seen.setdefault(status.task_id, status)
    return seen


async def _reregister(master: FakeMaster) -> ReregisterAgent:
    await master.send(Ping(connected=False))  # "I do not know you": the agent registers again
    rereg = await master.expect(ReregisterAgent)
    info = MasterInfo(
        master_id="fake", address=master.endpoint, epoch=EPOCH, features=INFO_FEATURES
    )
    await master.send(AgentReregistered(agent_id=AGENT_ID, master_info=info))
    return rereg


def test_unacknowledged_updates_are_resent_batched_and_a_batch_of_acks_is_applied(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, _agent):
            reg = await master.expect(RegisterAgent)
            assert BATCHES in reg.features
            info = MasterInfo(
                master_id="fake", address=master.endpoint, epoch=EPOCH, features=INFO_FEATURES
            )
            await master.send(AgentRegistered(agent_id=AGENT_ID, master_info=info))
            for task_id in TASKS:
                await master.run_task(task_id, "sleep 60")
            running = await _running(master)  # none acknowledged

            rereg = await _reregister(master)
            assert BATCHES in rereg.features
            assert {t.task.task_id: t.status_uuid for t in rereg.tasks} == {
                t: s.uuid for t, s in running.items()
            }
            # Re-registered, the agent resends the three heads at once: one message.
            resent = await master.expect(StatusUpdates)
            assert sorted(u.status.uuid for u in resent.updates) == sorted(
                s.uuid for s in running.values()
            )

            acks = tuple(
                StatusUpdateAck(framework_id=FID, task_id=s.task_id, uuid=s.uuid, agent_id=AGENT_ID)
                for s in running.values()
                if s.uuid is not None
            )
            await master.send(StatusUpdateAcks(acks=acks))
            # Every stream's head was acknowledged: the next re-registration reports none.
            rereg = await _reregister(master)
            assert {t.task.task_id: t.status_uuid for t in rereg.tasks} == dict.fromkeys(TASKS)

    run(main())
