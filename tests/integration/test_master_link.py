"""MasterLink against fake masters on tcp loopback: who it follows, what it delivers and drops.

Each fake master is a real ``ZmqServer`` plus a task that records every frame and answers
DETECT_LEADER with whatever the test currently sets (or stays silent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import zmq
import zmq.asyncio
from agora.sdk.ids import AgentID, ExecutorID
from agora.sdk.messages import DetectLeader, FrameworkMessage, LeaderInfo, Message
from agora.sdk.transport import Client, MasterLink, TransportClosed, ZmqServer
from agora.sdk.transport.master_link import MAX_MASTERS

T = TypeVar("T")
LOOPBACK = "tcp://127.0.0.1:0"
SLOW = 30.0  # a probe/search interval no test waits for: only event-driven probes happen


def run(coro: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], object], timeout: float = 5.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def tagged(tag: str) -> FrameworkMessage:
    return FrameworkMessage(agent_id=AgentID("a-1"), executor_id=ExecutorID("e"), data=tag.encode())


def tag_of(message: Message | None) -> str:
    assert isinstance(message, FrameworkMessage)
    return message.data.decode()


class FakeMaster:
    """A bound ROUTER that records what arrives and answers DETECT_LEADER with ``answer()``."""

    def __init__(self, endpoint: str = LOOPBACK) -> None:
        self.server = ZmqServer.bind(endpoint)
        self.endpoint = self.server.endpoint
        self.answer: Callable[[], LeaderInfo | None] = lambda: None
        self.received: list[Message] = []
        self.peers: list[str] = []
        self.answered: list[LeaderInfo] = []
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def info(self, leader: str | None, epoch: int, masters: tuple[str, ...] = ()) -> LeaderInfo:
        return LeaderInfo(responder=self.endpoint, leader=leader, epoch=epoch, masters=masters)

    def leads(self, epoch: int) -> None:
        self.answer = lambda: self.info(self.endpoint, epoch)

    def follows(self, leader: str | None, epoch: int) -> None:
        self.answer = lambda: self.info(leader, epoch)

    def probes(self) -> int:
        return sum(isinstance(m, DetectLeader) for m in self.received)

    def others(self) -> list[Message]:
        return [m for m in self.received if not isinstance(m, DetectLeader)]

    async def _serve(self) -> None:
        while True:
            try:
                got = await self.server.recv()
            except TransportClosed:
                return
            assert got.message is not None
            self.received.append(got.message)
            if got.peer not in self.peers:
                self.peers.append(got.peer)
            if isinstance(got.message, DetectLeader) and (reply := self.answer()) is not None:
                self.answered.append(reply)
                await self.server.send(got.peer, reply, epoch=reply.epoch)

    async def push(self, message: Message, epoch: int) -> None:
        for peer in self.peers:
            assert await self.server.send(peer, message, epoch=epoch)

    def close(self) -> None:
        self._task.cancel()
        self.server.close()


class Events:
    def __init__(self, *, down_raises: bool = False) -> None:
        self.log: list[str] = []
        self.down_raises = down_raises

    def up(self) -> None:
        self.log.append("up")

    def down(self) -> None:
        self.log.append("down")
        if self.down_raises:
            raise RuntimeError("callbacks that raise are logged, never propagate")


async def leading_link(
    leader: FakeMaster, *others: FakeMaster, epoch: int, events: Events
) -> MasterLink:
    """A link over ``leader`` and ``others`` that has confirmed ``leader`` at ``epoch``."""
    leader.leads(epoch)
    for other in others:
        other.follows(leader.endpoint, epoch)
    link = MasterLink.connect(
        [leader.endpoint, *(o.endpoint for o in others)],
        on_connected=events.up,
        on_disconnected=events.down,
        probe_interval=SLOW,
        search_interval=0.05,
    )
    assert await link.wait_leader(5.0) == leader.endpoint
    await until(lambda: all(o.peers for o in others), what="every master probed")
    return link


def test_single_endpoint_is_assumed_leader_and_never_probed() -> None:
    async def main() -> None:
        master = FakeMaster()  # never answers DETECT_LEADER, like today's single master
        events = Events()
        link = MasterLink.connect(
            [master.endpoint.removeprefix("tcp://")],
            on_connected=events.up,
            on_disconnected=events.down,
            search_interval=0.01,
        )
        try:
            assert isinstance(link, Client)
            assert not link.connected and link.leader is None
            assert link.endpoint == master.endpoint
            assert await link.wait_leader(5.0) == master.endpoint
            assert link.connected and link.epoch == 0 and events.log == ["up"]
            await link.send(tagged("hello"), epoch=0)
            await until(lambda: master.others(), what="the frame at the master")
            await master.push(tagged("back"), epoch=0)
            got = await asyncio.wait_for(link.recv(), 5.0)
            assert tag_of(got.message) == "back" and got.epoch == 0
            assert master.probes() == 0
        finally:
            link.close()
            master.close()

    run(main())


def test_the_claiming_master_is_chosen_and_a_standby_hint_is_followed_at_once() -> None:
    async def main() -> None:
        a, b, c = FakeMaster(), FakeMaster(), FakeMaster()
        b.follows(None, 2)  # an election is under way as far as b and c know
        c.follows(None, 2)
        link = MasterLink.connect(
            [a.endpoint, b.endpoint, c.endpoint, a.endpoint], search_interval=SLOW
        )
        try:
            assert link.masters == (a.endpoint, b.endpoint, c.endpoint)
            await until(lambda: a.probes() and b.answered and c.answered, what="probes on connect")
            assert not link.connected and link.leader is None
            b.leads(3)
            # Standby a names b: with the search interval far off, only the hint can make the
            # link ask b again.
            await a.push(a.info(b.endpoint, 3, (a.endpoint, b.endpoint, c.endpoint)), epoch=3)
            assert await link.wait_leader(5.0) == b.endpoint
            assert link.leader == link.endpoint == b.endpoint and link.epoch == 3
            assert b.probes() == 2
            await link.send(tagged("to-leader"))
            await until(lambda: b.others(), what="the frame at the leader")
            assert a.others() == [] and c.others() == []
        finally:
            link.close()
            for m in (a, b, c):
                m.close()

    run(main())


def test_a_pushed_higher_epoch_switches_and_the_old_leader_is_no_longer_heard() -> None:
    async def main() -> None:
        a, b = FakeMaster(), FakeMaster()
        events = Events(down_raises=True)
        link = await leading_link(a, b, epoch=2, events=events)
        try:
            # Frames the leader sent that nobody has read yet are dropped at the switch too.
            probes = a.probes()
            await a.push(tagged("unread"), epoch=2)
            await a.push(tagged("unread-newer"), epoch=3)  # higher epoch from the leader: probe
            await until(lambda: a.probes() > probes, what="a's frames queued in the link")
            a.follows(b.endpoint, 3)  # what each master answers from now on
            b.leads(3)
            await b.push(b.info(b.endpoint, 3), epoch=3)
            await until(lambda: link.leader == b.endpoint, what="the switch to b")
            assert events.log == ["up", "down", "up"] and link.epoch == 3 and link.connected
            probes = a.probes()
            await a.push(tagged("stale"), epoch=2)
            await a.push(tagged("higher-but-not-leader"), epoch=9)  # only a hint: probe a
            await until(lambda: a.probes() > probes, what="a probed after its frames")
            await b.push(tagged("fresh"), epoch=3)
            got = await asyncio.wait_for(link.recv(), 5.0)
            assert tag_of(got.message) == "fresh" and got.epoch == 3
            assert link.recv_nowait() is None and link.leader == b.endpoint
        finally:
            link.close()
            a.close()
            b.close()

    run(main())


def test_a_claim_at_a_lower_or_equal_epoch_never_switches() -> None:
    async def main() -> None:
        a, b = FakeMaster(), FakeMaster()
        events = Events()
        link = await leading_link(a, b, epoch=5, events=events)
        try:
            await b.push(b.info(b.endpoint, 4), epoch=4)
            await b.push(b.info(b.endpoint, 5), epoch=5)
            probes = b.probes()
            await b.push(tagged("sync"), epoch=6)  # a higher epoch from a non-leader: probe b
            await until(lambda: b.probes() > probes, what="the pushes processed")
            assert link.leader == a.endpoint and link.epoch == 5 and events.log == ["up"]
            assert link.recv_nowait() is None
        finally:
            link.close()
            a.close()
            b.close()

    run(main())


def test_leader_stepping_down_disconnects_and_sends_are_dropped_until_it_confirms() -> None:
    async def main() -> None:
        a, b = FakeMaster(), FakeMaster()
        events = Events()
        link = await leading_link(a, b, epoch=2, events=events)
        try:
            a.follows(None, 2)
            b.follows(None, 2)
            await a.push(a.info(None, 2), epoch=2)
            await until(lambda: not link.connected, what="the link to drop its leader")
            assert link.leader is None and events.log == ["up", "down"]
            assert link.endpoint == a.endpoint  # the first endpoint while none is known
            await link.send(tagged("dropped"))
            with pytest.raises(TimeoutError):
                await link.wait_leader(0.05)
            a.leads(2)  # re-elected at the same epoch: the searching link re-confirms it
            assert await link.wait_leader(5.0) == a.endpoint
            assert events.log == ["up", "down", "up"]
            await link.send(tagged("kept"))
            await until(lambda: a.others(), what="the frame at a")
            assert [tag_of(m) for m in a.others()] == ["kept"]
        finally:
            link.close()
            a.close()
            b.close()

    run(main())


@pytest.mark.parametrize("several", [False, True], ids=["single", "several"])
def test_leader_socket_loss_disconnects_until_the_master_is_back(several: bool) -> None:
    async def main() -> None:
        a, b = FakeMaster(), FakeMaster()
        events = Events()
        if several:
            link = await leading_link(a, b, epoch=2, events=events)
        else:
            link = MasterLink.connect(
                [a.endpoint], on_connected=events.up, on_disconnected=events.down
            )
            await link.wait_leader(5.0)
        try:
            endpoint = a.endpoint
            a.close()  # the leader's process goes away
            await until(lambda: not link.connected, what="the link to notice")
            assert link.leader is None and events.log == ["up", "down"]
            a = FakeMaster(endpoint)  # back on the same address
            if several:
                a.leads(2)  # re-confirms at the epoch the link follows
            assert await link.wait_leader(5.0) == endpoint
            assert events.log == ["up", "down", "up"]
            await link.send(tagged("again"))
            await until(lambda: a.others(), what="the frame at the restarted master")
        finally:
            link.close()
            a.close()
            b.close()

    run(main())


def test_masters_named_in_leader_get_a_socket_and_are_followed() -> None:
    async def main() -> None:
        a, b, c = FakeMaster(), FakeMaster(), FakeMaster()
        events = Events()
        link = MasterLink.connect([a.endpoint], on_connected=events.up, on_disconnected=events.down)
        try:
            await link.wait_leader(5.0)  # the single given master is assumed to lead
            await link.send(tagged("register"))
            await until(lambda: a.peers, what="a knowing the link")
            b.leads(4)
            group = (a.endpoint, b.endpoint.removeprefix("tcp://"), c.endpoint)
            await a.push(a.info(b.endpoint, 4, group), epoch=4)
            await until(lambda: link.leader == b.endpoint, what="the switch to b")
            assert set(link.masters) == {a.endpoint, b.endpoint, c.endpoint}
            assert link.epoch == 4 and events.log == ["up", "down", "up"]
            await until(lambda: c.probes(), what="c probed on its new socket")
        finally:
            link.close()
            for m in (a, b, c):
                m.close()

    run(main())


def test_a_master_named_by_another_spelling_gets_no_second_socket_and_the_total_is_capped() -> None:
    async def main() -> None:
        a = FakeMaster()
        port = a.endpoint.rsplit(":", 1)[1]
        link = MasterLink.connect([f"localhost:{port}"])
        try:
            await link.wait_leader(5.0)
            await link.send(tagged("register"))
            await until(lambda: a.peers, what="a knowing the link")
            # a calls itself by its address, and names more masters than any group has.
            closed = [f"tcp://127.0.0.1:{n}" for n in range(1, 21)]
            await a.push(a.info(a.endpoint, 1, (a.endpoint, *closed[:10])), epoch=1)
            await a.push(a.info(a.endpoint, 2, (a.endpoint, *closed[10:])), epoch=2)
            await until(lambda: link.epoch == 2, what="both LEADER frames processed")
            assert link.masters[0] == f"tcp://localhost:{port}"
            assert a.endpoint not in link.masters
            assert len(link.masters) == MAX_MASTERS
            assert link.leader == f"tcp://localhost:{port}"
        finally:
            link.close()
            a.close()

    run(main())


def test_close_leaves_no_task_and_no_socket() -> None:
    async def main() -> None:
        a, b = FakeMaster(), FakeMaster()
        context = zmq.asyncio.Context()
        before = asyncio.all_tasks()
        link = MasterLink.connect([a.endpoint, b.endpoint], context=context)
        try:
            a.leads(1)
            await link.wait_leader(5.0)
            reader = asyncio.create_task(link.recv())
            await asyncio.sleep(0)
            link.close()
            with pytest.raises(TransportClosed):
                await asyncio.wait_for(reader, 5.0)
            with pytest.raises(TransportClosed):
                await link.recv()
            with pytest.raises(TransportClosed):
                await link.send(tagged("late"))
            try:
                await until(lambda: asyncio.all_tasks() <= before, what="tasks to end")
            except AssertionError:
                raise AssertionError(str(asyncio.all_tasks() - before)) from None
            # term() returns only once every socket of the context is closed.
            await asyncio.wait_for(asyncio.to_thread(context.term), 5.0)
        finally:
            link.close()
            if not context.closed:
                context.destroy(linger=0)
            a.close()
            b.close()

    run(main())


def test_a_master_back_after_a_long_outage_is_reached_within_about_a_second() -> None:
    # ZeroMQ doubles its reconnect wait while a master is down (0.1, 0.2, ... s). After 3.5 s
    # down, its default 5 s cap would next try at about 6.3 s, 2.8 s after the master's return;
    # the link caps the wait at RECONNECT_MAX (1 s) so clients hear a restarted group promptly.
    async def main() -> None:
        a = FakeMaster()
        link = MasterLink.connect([a.endpoint], probe_interval=SLOW)
        try:
            endpoint = a.endpoint
            assert await link.wait_leader(5.0) == endpoint
            a.close()
            await until(lambda: not link.connected, what="the link to notice")
            await asyncio.sleep(3.5)  # the outage itself: the thing under test is its length
            a = FakeMaster(endpoint)
            back = time.monotonic()
            assert await link.wait_leader(5.0) == endpoint
            assert time.monotonic() - back < 2.0
        finally:
            link.close()
            a.close()

    run(main())
