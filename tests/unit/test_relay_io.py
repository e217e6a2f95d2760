"""``agora-relay``'s I/O in one process: a bare ROUTER plays the master, raw DEALERs the agents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import zmq
import zmq.asyncio
from agora.master.relay.relay import Relay
from agora.sdk.codec import decode, encode
from agora.sdk.messages import DetectLeader, LeaderInfo, Message, Ping, Pong
from agora.sdk.transport import Received, ZmqServer
from agora.sdk.transport.base import RELAY_SEP

T = TypeVar("T")
WAIT = 5.0


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], object], what: str) -> None:
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.01)


@asynccontextmanager
async def rig(max_agents: int = 10) -> AsyncIterator[tuple[ZmqServer, Relay]]:
    master = ZmqServer.bind("tcp://127.0.0.1:0")
    relay = await Relay.start("tcp://127.0.0.1:0", [master.endpoint], max_agents=max_agents)
    serving = asyncio.create_task(relay.serve())
    try:
        await until(lambda: relay.leading == master.endpoint, "the relay follows the master")
        yield master, relay
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        relay.close()
        master.close()


class Agent:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    async def send(self, message: Message) -> None:
        await self.sock.send(encode(message))

    async def recv(self) -> Message:
        frame = await asyncio.wait_for(self.sock.recv(), WAIT)
        return decode(frame).message

    async def nothing(self, seconds: float = 0.3) -> bool:
        return await self.sock.poll(int(seconds * 1000)) == 0

    def close(self) -> None:
        self.sock.close(linger=0)


async def from_relay(master: ZmqServer) -> Received:
    return await asyncio.wait_for(master.recv(), WAIT)


def test_frames_are_carried_both_ways_and_each_agent_is_a_peer_of_its_own() -> None:
    async def scenario() -> None:
        async with rig() as (master, relay):
            one, two = Agent(relay.endpoint), Agent(relay.endpoint)
            try:
                await one.send(Pong())
                told = await one.recv()  # a new agent first hears who leads: the relay itself
                assert isinstance(told, LeaderInfo)
                assert told.leader == told.responder == relay.name
                assert told.masters == (relay.name,)
                got = await from_relay(master)
                assert isinstance(got.message, Pong) and got.relay == ""
                await two.send(Pong())
                await two.recv()
                other = await from_relay(master)
                assert RELAY_SEP in got.peer and RELAY_SEP in other.peer
                assert got.peer != other.peer
                assert got.peer.partition(RELAY_SEP)[0] == other.peer.partition(RELAY_SEP)[0]

                assert master.try_send(other.peer, Ping(), epoch=7)
                assert isinstance(await two.recv(), Ping)
                assert await one.nothing()
                assert (relay.stats.to_masters, relay.stats.to_agents) == (2, 1)
                # A lone master is never asked who leads: the relay speaks of the epoch it saw.
                await two.send(DetectLeader())
                answer = await two.recv()
                assert isinstance(answer, LeaderInfo) and answer.epoch == 7
            finally:
                one.close()
                two.close()

    run(scenario())


def test_the_relay_answers_for_the_leader_and_keeps_masters_leader_frames_from_agents() -> None:
    async def scenario() -> None:
        async with rig() as (master, relay):
            agent = Agent(relay.endpoint)
            try:
                for _ in range(2):  # the first also tells a new agent: one answer each
                    await agent.send(DetectLeader())
                    answer = await agent.recv()
                    assert isinstance(answer, LeaderInfo) and answer.leader == relay.name
                assert await agent.nothing()
                assert master.recv_nowait() is None  # answered by the relay, not carried
                await agent.send(Pong())
                peer = (await from_relay(master)).peer
                naming = LeaderInfo(responder=master.endpoint, leader=master.endpoint)
                assert master.try_send(peer, naming)
                assert await agent.nothing(), "a master's LEADER would name the masters"
            finally:
                agent.close()

    run(scenario())


def test_agents_beyond_the_bound_are_refused() -> None:
    async def scenario() -> None:
        async with rig(max_agents=1) as (master, relay):
            first, second = Agent(relay.endpoint), Agent(relay.endpoint)
            try:
                await first.send(Pong())
                await from_relay(master)
                await second.send(Pong())
                await until(lambda: relay.stats.refused == 1, "the second agent refused")
                assert master.recv_nowait() is None and await second.nothing()
            finally:
                first.close()
                second.close()

    run(scenario())


def test_without_a_leader_agents_are_told_and_their_frames_dropped() -> None:
    async def scenario() -> None:
        async with rig() as (master, relay):
            agent = Agent(relay.endpoint)
            try:
                await agent.send(Pong())
                await agent.recv()
                await from_relay(master)
                master.close()  # the only master goes away
                told = await agent.recv()
                assert isinstance(told, LeaderInfo) and told.leader is None
                await agent.send(Pong())
                await until(lambda: relay.stats.dropped_no_leader == 1, "the frame dropped")
            finally:
                agent.close()

    run(scenario())
