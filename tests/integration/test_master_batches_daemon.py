"""A real master daemon, raw clients: updates and acknowledgements travel in batches between
peers that announced "batches", and one at a time to peers that did not (older drivers and
agents keep working)."""

from __future__ import annotations

import uuid
from pathlib import Path

from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    Acknowledgements,
    AgentRegistered,
    Filters,
    Launch,
    Message,
    Offers,
    RunTask,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdates,
    Subscribed,
    TaskState,
    TaskStatus,
    Update,
)
from agora.sdk.messages.batching import BATCHES, unbatch
from agora.sdk.transport import ZmqClient
from msgspec.structs import replace
from support.master_kit import task_info
from support.master_process import master_process
from test_master_daemon import expect, register_agent, run, subscribe

TASKS = ("t1", "t2", "t3")


async def _parts(client: ZmqClient, kind: type[Message], count: int) -> tuple[list[Message], int]:
    """``count`` messages of ``kind``, taken out of whatever batches carried them, and how many
    messages that took."""
    parts: list[Message] = []
    frames = 0
    while len(parts) < count:
        received = await expect(client, Message)
        got = unbatch(received)
        if all(isinstance(p, kind) for p in got):
            parts.extend(got)
            frames += 1
    return parts, frames


async def _launch_three(
    agent: ZmqClient, framework: ZmqClient, batches: bool
) -> tuple[FrameworkID, AgentID]:
    features = (BATCHES,) if batches else ()
    await agent.send(replace(register_agent(), features=features))
    registered = await expect(agent, AgentRegistered)
    assert BATCHES in registered.master_info.features  # this master reads batches
    await framework.send(replace(subscribe(), features=features))
    subscribed = await expect(framework, Subscribed)
    offers = await expect(framework, Offers)
    fid, aid = subscribed.framework_id, registered.agent_id
    infos = tuple(task_info(t, "cpus:1;mem:64", aid) for t in TASKS)
    await framework.send(
        Accept(
            framework_id=fid,
            offer_ids=(offers.offers[0].offer_id,),
            operations=(Launch(task_infos=infos),),
            filters=Filters(refuse_seconds=60),
        )
    )
    runs, _ = await _parts(agent, RunTask, len(TASKS))
    assert sorted(r.task.task_id for r in runs) == sorted(TASKS)  # type: ignore[attr-defined]
    return fid, aid


def _running(fid: FrameworkID, aid: AgentID) -> StatusUpdates:
    return StatusUpdates(
        updates=tuple(
            StatusUpdate(
                framework_id=fid,
                status=TaskStatus(
                    task_id=TaskID(t),
                    state=TaskState.RUNNING,
                    source=StatusSource.EXECUTOR,
                    agent_id=aid,
                    uuid=uuid.UUID(int=n).bytes,
                ),
            )
            for n, t in enumerate(TASKS, start=1)
        )
    )


def test_peers_that_read_batches_get_updates_and_acks_batched(tmp_path: Path) -> None:
    with master_process(tmp_path, "--allocation-interval", "0.05") as master:

        async def scenario() -> None:
            agent = ZmqClient.connect(master.endpoint)
            framework = ZmqClient.connect(master.endpoint)
            try:
                fid, aid = await _launch_three(agent, framework, batches=True)
                await agent.send(_running(fid, aid))
                updates, frames = await _parts(framework, Update, len(TASKS))
                assert [u.status.task_id for u in updates] == list(TASKS)  # type: ignore[attr-defined]
                assert frames < len(TASKS), "one burst's updates reach the framework batched"
                acks = tuple(
                    Acknowledge(
                        framework_id=fid,
                        agent_id=aid,
                        task_id=u.status.task_id,  # type: ignore[attr-defined]
                        uuid=u.status.uuid,  # type: ignore[attr-defined]
                    )
                    for u in updates
                )
                await framework.send(Acknowledgements(acks=acks))
                acked, frames = await _parts(agent, StatusUpdateAck, len(TASKS))
                assert [a.task_id for a in acked] == list(TASKS)  # type: ignore[attr-defined]
                assert frames < len(TASKS), "the agent's acknowledgements come batched"
            finally:
                agent.close()
                framework.close()

        run(scenario())


def test_peers_that_did_not_announce_batches_get_one_message_each(tmp_path: Path) -> None:
    """An older framework and agent (no features): the master still reads a newer agent's batch,
    but sends the framework one UPDATE per task and the agent one ack per update."""
    with master_process(tmp_path, "--allocation-interval", "0.05") as master:

        async def scenario() -> None:
            agent = ZmqClient.connect(master.endpoint)
            framework = ZmqClient.connect(master.endpoint)
            try:
                fid, aid = await _launch_three(agent, framework, batches=False)
                await agent.send(_running(fid, aid))
                updates, frames = await _parts(framework, Update, len(TASKS))
                assert frames == len(TASKS)
                assert all(type(u) is Update for u in updates)
                for u in updates:
                    status = u.status  # type: ignore[attr-defined]
                    await framework.send(
                        Acknowledge(
                            framework_id=fid, agent_id=aid, task_id=status.task_id, uuid=status.uuid
                        )
                    )
                acked, frames = await _parts(agent, StatusUpdateAck, len(TASKS))
                assert frames == len(TASKS)
                assert [a.task_id for a in acked] == list(TASKS)  # type: ignore[attr-defined]
            finally:
                agent.close()
                framework.close()

        run(scenario())
