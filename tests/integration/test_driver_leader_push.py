"""A scheduler driver whose SUBSCRIBE backoff has grown subscribes at once when a leader pushes.

Two election-speaking masters on tcp loopback (a ``ZmqServer`` each, answering DETECT_LEADER and
SUBSCRIBE minimally) stand in for a master group coming back from a whole-group restart: first no
master leads, so the driver's attempt goes nowhere and it settles into its long backoff; then a
standby names a leader (a hint: nothing may be sent on its word); then the leader itself pushes
LEADER with its epoch, and SUBSCRIBE must reach it well inside the backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from agora.sdk import FrameworkInfo, Scheduler, SchedulerDriver
from agora.sdk.ids import FrameworkID
from agora.sdk.messages import (
    DetectLeader,
    LeaderInfo,
    MasterInfo,
    Message,
    Subscribe,
    Subscribed,
)
from agora.sdk.transport import TransportClosed, ZmqServer
from support.polling import until

T = TypeVar("T")
#: floor = cap: after its first attempt the driver waits exactly this long before the next.
BACKOFF = 8.0
FRAMEWORK = FrameworkID("fw-push")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class ElectedMaster:
    """A master of a group, as far as a driver can tell: it answers DETECT_LEADER with who leads
    (``leader``, ``epoch``), answers SUBSCRIBE with SUBSCRIBED while it leads, records the rest."""

    def __init__(self) -> None:
        self.server = ZmqServer.bind("tcp://127.0.0.1:0")
        self.endpoint = self.server.endpoint
        self.leader: str | None = None
        self.epoch = 3
        self.peers: list[str] = []
        self.received: list[tuple[float, Message]] = []
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def info(self) -> LeaderInfo:
        return LeaderInfo(responder=self.endpoint, leader=self.leader, epoch=self.epoch)

    def subscribes(self) -> list[float]:
        return [at for at, m in self.received if isinstance(m, Subscribe)]

    def probes(self) -> int:
        return sum(isinstance(m, DetectLeader) for _, m in self.received)

    async def push(self, info: LeaderInfo) -> None:
        for peer in self.peers:
            assert await self.server.send(peer, info, epoch=info.epoch)

    async def _serve(self) -> None:
        while True:
            try:
                got = await self.server.recv()
            except TransportClosed:
                return
            message = got.message
            assert message is not None
            self.received.append((time.monotonic(), message))
            if got.peer not in self.peers:
                self.peers.append(got.peer)
            if isinstance(message, DetectLeader):
                await self.server.send(got.peer, self.info(), epoch=self.epoch)
            elif isinstance(message, Subscribe) and self.leader == self.endpoint:
                master = MasterInfo(master_id="m", address=self.endpoint, epoch=self.epoch)
                reply = Subscribed(
                    framework_id=FRAMEWORK, heartbeat_interval_seconds=60.0, master_info=master
                )
                await self.server.send(got.peer, reply, epoch=self.epoch)

    def close(self) -> None:
        self._task.cancel()
        self.server.close()


def test_a_leader_push_ends_a_grown_subscribe_backoff_and_a_standby_hint_does_not() -> None:
    async def main() -> None:
        a, b = ElectedMaster(), ElectedMaster()
        framework = FrameworkInfo(name="push", framework_id=FRAMEWORK, failover_timeout=60.0)
        driver = SchedulerDriver(
            Scheduler(),
            framework,
            f"{a.endpoint},{b.endpoint}",
            subscribe_backoff=(BACKOFF, BACKOFF),
        )
        starting = asyncio.create_task(driver.start())
        try:
            # No master leads: the first attempt has nowhere to go; the next is BACKOFF away.
            await until(lambda: a.probes() >= 2 and b.probes() >= 2, what="probes of both")
            first_attempt_by = time.monotonic()

            # A standby names A at a higher epoch. That is a hint: A is asked and says it does
            # not lead (yet), so nothing is subscribed anywhere.
            b.leader, b.epoch = a.endpoint, 4
            asked = a.probes()
            await b.push(b.info())
            await until(lambda: a.probes() > asked, what="the link to ask A itself")
            await until(lambda: b.probes() >= 4, what="a later search round")
            assert a.subscribes() == [] and b.subscribes() == []

            # A activates and pushes its leadership: SUBSCRIBE follows at once.
            a.leader, a.epoch = a.endpoint, 4
            pushed = time.monotonic()
            await a.push(a.info())
            await asyncio.wait_for(starting, timeout=BACKOFF / 2)
            sent_after = a.subscribes()[0] - pushed
            assert sent_after < 1.0, f"SUBSCRIBE {sent_after:.2f} s after the push"
            assert a.subscribes()[0] < first_attempt_by + BACKOFF / 2
            assert driver.subscribed and b.subscribes() == []
        finally:
            driver.stop(failover=True)
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(driver.join(), 5.0)
            a.close()
            b.close()

    run(main())
