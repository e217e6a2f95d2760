"""An HTTP scheduler acknowledges each update with a call of its own (the Mesos scheduler API):
the daemon holds the acknowledgements those calls make for a moment, and they reach the agent
merged, soon, and only once."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from agora.master.core import Master, MasterConfig
from agora.master.server.daemon import STREAM_HOLD_SECONDS
from agora.sdk.ids import AgentID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    AgentInfo,
    AgentRegistered,
    Filters,
    FrameworkInfo,
    Heartbeat,
    Launch,
    Message,
    Offers,
    Ping,
    RegisterAgent,
    RunTask,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateAcks,
    StatusUpdateMessage,
    Subscribe,
    Subscribed,
    TaskState,
    TaskStatus,
    Update,
)
from agora.sdk.messages.batching import BATCHES
from agora.sdk.resources import Resources
from agora.sdk.transport import InprocClient
from support.master_kit import task_info
from unit.test_master_daemon_loop import DEADLINE, rig, run

M = TypeVar("M", bound=Message)


async def _to_agent(agent: InprocClient, kind: type[M]) -> M:
    """The next message to the agent but the master's pings (which come when they are due)."""
    async with asyncio.timeout(DEADLINE):
        while True:
            message = (await agent.recv()).message
            if isinstance(message, Ping | Heartbeat):
                continue
            assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
            return message


async def _event(queue: asyncio.Queue[Message], kind: type[Message]) -> Message:
    async with asyncio.timeout(DEADLINE):
        while True:
            message = await queue.get()
            if isinstance(message, kind):
                return message


def test_acknowledgement_calls_reach_the_agent_merged_within_the_hold() -> None:
    async def scenario() -> None:
        async with rig(core=Master(MasterConfig(allocation_interval=0.01))) as r:
            agent = r.client()
            info = AgentInfo(hostname="h", resources=Resources.parse("cpus:4;mem:1024"))
            await agent.send(RegisterAgent(agent_info=info, features=(BATCHES,)))
            agent_id = AgentID((await _to_agent(agent, AgentRegistered)).agent_id)

            stream = r.daemon.streams.open(None)
            subscribe = Subscribe(framework_info=FrameworkInfo(name="http-fw"))
            await r.daemon.submit(stream.peer, subscribe, None, DEADLINE)
            subscribed = await _event(stream.queue, Subscribed)
            assert isinstance(subscribed, Subscribed)
            fid = subscribed.framework_id
            offers = await _event(stream.queue, Offers)
            assert isinstance(offers, Offers)
            tasks = tuple(task_info(f"t{i}", "cpus:1;mem:64", agent_id) for i in range(3))
            accept = Accept(
                framework_id=fid,
                offer_ids=(offers.offers[0].offer_id,),
                operations=(Launch(task_infos=tasks),),
                filters=Filters(refuse_seconds=0),
            )
            await r.daemon.submit(stream.peer, accept, None, DEADLINE)
            for _ in tasks:
                await _to_agent(agent, RunTask)

            uuids = {f"t{i}": bytes([i + 1]) * 16 for i in range(3)}
            for task_id, uuid in uuids.items():
                status = TaskStatus(
                    task_id=TaskID(task_id),
                    state=TaskState.RUNNING,
                    source=StatusSource.EXECUTOR,
                    uuid=uuid,
                )
                await agent.send(
                    StatusUpdateMessage(update=StatusUpdate(framework_id=fid, status=status))
                )
            for _ in uuids:
                await _event(stream.queue, Update)

            started = asyncio.get_running_loop().time()
            for task_id, uuid in uuids.items():  # one call per update, as Mesos frameworks do
                ack = Acknowledge(
                    framework_id=fid, agent_id=agent_id, task_id=TaskID(task_id), uuid=uuid
                )
                await r.daemon.submit(stream.peer, ack, None, DEADLINE)
            merged = await _to_agent(agent, StatusUpdateAcks)
            waited = asyncio.get_running_loop().time() - started
            assert [(a.task_id, a.uuid) for a in merged.acks] == list(uuids.items())
            assert waited < STREAM_HOLD_SECONDS + 1.0
            await asyncio.sleep(2 * STREAM_HOLD_SECONDS)
            later = []
            while (received := agent.recv_nowait()) is not None:
                later.append(received.message)
            assert not [m for m in later if isinstance(m, StatusUpdateAck | StatusUpdateAcks)]

    run(scenario)
