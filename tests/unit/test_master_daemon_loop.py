"""MasterDaemon's loop in-process, over an InprocHub: ACL checks, ticks, robustness, stopping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Action
from agora.master.server import MasterDaemon
from agora.master.server.admission import RegistrationGate
from agora.sdk.codec import encode
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    Decline,
    Error,
    ErrorCode,
    FrameworkInfo,
    Heartbeat,
    Message,
    Offers,
    RegisterAgent,
    RetryRegistration,
    Subscribe,
    Subscribed,
)
from agora.sdk.messages.batching import FEATURES
from agora.sdk.messages.operator import GetState, OperatorKill, StateReply
from agora.sdk.resources import Resources
from agora.sdk.transport import Acl, InprocClient, InprocHub, InprocServer

M = TypeVar("M", bound=Message)
DEADLINE = 5.0


@dataclass
class Rig:
    hub: InprocHub
    server: InprocServer
    daemon: MasterDaemon
    core: Master

    def client(self, principal: str | None = None) -> InprocClient:
        return self.hub.client("master", principal=principal)


@asynccontextmanager
async def rig(
    *,
    core: Master | None = None,
    acl: Acl | None = None,
    authenticated: bool = False,
    tick_interval: float = 0.01,
    registrations: RegistrationGate | None = None,
) -> AsyncIterator[Rig]:
    hub = InprocHub()
    server = hub.server("master")
    master = core or Master(MasterConfig(allocation_interval=0.01))
    daemon = MasterDaemon(
        master,
        server,
        tick_interval=tick_interval,
        peer_timeout=60.0,
        acl=acl,
        authenticated=authenticated,
        debug=True,
        registrations=registrations,
    )
    running = asyncio.create_task(daemon.run())
    try:
        yield Rig(hub, server, daemon, master)
    finally:
        daemon.stop()
        assert await asyncio.wait_for(running, DEADLINE) == 0
        server.close()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 20.0))


async def expect(client: InprocClient, kind: type[M]) -> M:
    async with asyncio.timeout(DEADLINE):
        while True:
            message = (await client.recv()).message
            if isinstance(message, Heartbeat) and kind is not Heartbeat:
                continue
            assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
            return message


async def forbidden(client: InprocClient) -> str:
    error = await expect(client, Error)
    assert error.code is ErrorCode.FORBIDDEN, error
    return str(error.message)


def register(hostname: str = "h") -> RegisterAgent:
    info = AgentInfo(hostname=hostname, resources=Resources.parse("cpus:1;mem:128"))
    return RegisterAgent(agent_info=info, features=FEATURES)


def subscribe(*roles: str, principal: str | None = None) -> Subscribe:
    info = FrameworkInfo(name="fw", roles=roles or ("*",), principal=principal)
    return Subscribe(framework_info=info)


def test_authenticated_principals_and_the_acl() -> None:
    acl = Acl.from_dict(
        {"agents": ["agent"], "operators": ["ops"], "roles": {"fw": ["batch"], "*": []}}
    )

    async def scenario() -> None:
        async with rig(acl=acl, authenticated=True) as r:
            anonymous, agent, fw, ops = (
                r.client(),
                r.client("agent"),
                r.client("fw"),
                r.client("ops"),
            )
            await anonymous.send(GetState())
            assert "unauthenticated" in await forbidden(anonymous)
            await fw.send(register())
            assert "register agents" in await forbidden(fw)
            await agent.send(register())
            await expect(agent, AgentRegistered)
            await ops.send(subscribe("batch"))  # '*' default: no roles at all
            assert "'batch'" in await forbidden(ops)
            await fw.send(subscribe("batch", principal="someone-else"))
            assert "principal" in await forbidden(fw)
            await fw.send(subscribe("batch"))
            subscribed = await expect(fw, Subscribed)
            fw_state = r.core.state.frameworks[subscribed.framework_id]
            assert fw_state.info.principal == "fw"  # filled from the connection
            await expect(fw, Offers)  # offered at subscription, in the same burst
            await fw.send(OperatorKill(task_id=TaskID("t")))
            assert "operator" in await forbidden(fw)
            await ops.send(OperatorKill(task_id=TaskID("t")))
            assert (await expect(ops, Error)).code is ErrorCode.UNKNOWN_TASK
            await fw.send(GetState())  # open to every admitted principal
            await expect(fw, StateReply)

    run(scenario)


def test_an_acl_without_curve_sees_anonymous_clients() -> None:
    acl = Acl.from_dict({"operators": [], "roles": {"*": ["web"]}})

    async def scenario() -> None:
        async with rig(acl=acl) as r:
            client = r.client()
            await client.send(OperatorKill(task_id=TaskID("t")))
            await forbidden(client)
            await client.send(subscribe("batch"))
            await forbidden(client)
            await client.send(subscribe("web"))
            subscribed = await expect(client, Subscribed)
            assert r.core.state.frameworks[subscribed.framework_id].info.principal is None
            await client.send(register())  # a missing "agents" means any
            await expect(client, AgentRegistered)

    run(scenario)


class _FaultyMaster(Master):
    """A core with a bug: DECLINE blows up."""

    def handle(self, sender: str, message: Message, now: float) -> list[Action]:
        if isinstance(message, Decline):
            raise RuntimeError("bug")
        actions: list[Action] = super().handle(sender, message, now)
        return actions


def test_a_failing_core_call_answers_internal_and_serving_goes_on() -> None:
    async def scenario() -> None:
        async with rig(core=_FaultyMaster(MasterConfig())) as r:
            client = r.client()
            await client.send(Decline(framework_id=FrameworkID("F-1"), offer_ids=()))
            error = await expect(client, Error)
            assert error.code is ErrorCode.INTERNAL
            await client.send(subscribe())
            await expect(client, Subscribed)

    run(scenario)


def test_ticks_drive_the_core_timers() -> None:
    async def scenario() -> None:
        core = Master(MasterConfig(heartbeat_interval=0.02))
        async with rig(core=core) as r:
            client = r.client()
            await client.send(subscribe())
            await expect(client, Subscribed)
            for _ in range(3):  # only the ticker sends HEARTBEATs
                await expect(client, Heartbeat)

    run(scenario)


def test_run_reports_a_dead_receive_loop() -> None:
    async def scenario() -> None:
        hub = InprocHub()
        server = hub.server("master")
        daemon = MasterDaemon(Master(), server, tick_interval=0.01, peer_timeout=60.0)
        running = asyncio.create_task(daemon.run())
        await asyncio.sleep(0)
        server.close()  # recv raises TransportClosed
        assert await asyncio.wait_for(running, DEADLINE) == 1

    run(scenario)


def test_a_registration_storm_is_put_off_beyond_the_bound_and_copies_are_dropped() -> None:
    """2,500 agents register at once (against bounds scaled down to suit): what the master
    cannot answer promptly is told to come back later (RETRY_REGISTRATION), a re-sent copy of a
    waiting registration is dropped, and every agent that comes back when told is registered,
    once."""
    agents = 2_500

    async def scenario() -> None:
        # the default bound, scaled down: 1,000 wait
        async with rig(registrations=RegistrationGate(max_queued=1_000, rate=1_000.0)) as r:
            clients = [r.client() for _ in range(agents)]
            for i, client in enumerate(clients):  # all on the socket before the loop runs
                client.send_raw(encode(register(f"h{i}")))
                if i == 0:
                    client.send_raw(encode(register("h0")))  # its backoff re-sent it
            put_off: list[int] = []
            for i, client in enumerate(clients):
                answer = await expect(client, AgentRegistered | RetryRegistration)
                if isinstance(answer, RetryRegistration):
                    assert answer.retry_after >= 0.5  # half of the 1,000 waiting, at 1,000 a second
                    put_off.append(i)
            stats = r.daemon.stats
            assert put_off and stats.registrations_put_off == len(put_off)
            assert stats.registrations_coalesced == 1
            for i in put_off:  # they come back (here at once, not after their delay)
                await clients[i].send(register(f"h{i}"))
                await expect(clients[i], AgentRegistered | RetryRegistration)
            assert len(r.core.state.agents) == agents
            while (later := clients[0].recv_nowait()) is not None:  # one answer for two copies
                assert not isinstance(later.message, AgentRegistered | RetryRegistration)

    run(scenario)
