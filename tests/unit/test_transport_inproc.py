"""agora.sdk.transport.inproc: the in-process hub encodes and decodes like the real thing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID
from agora.sdk.messages import Error, FrameworkMessage, Heartbeat, Ping, Pong
from agora.sdk.transport import Client, InprocHub, Received, Server, TransportClosed

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0)


def message() -> FrameworkMessage:
    return FrameworkMessage(agent_id=AgentID("a-1"), executor_id=ExecutorID("e"), data=b"\0\xff")


def test_round_trip_encodes_and_decodes() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("master")
        client = hub.client("master", principal="ops")
        assert isinstance(server, Server) and isinstance(client, Client)
        assert server.endpoint == "inproc-hub://master" == client.endpoint
        sent = message()
        await client.send(sent, epoch=2)
        got = await server.recv()
        assert got.message == sent and got.message is not sent  # a decoded copy
        assert got.epoch == 2 and got.principal == "ops" and got.peer == client.peer
        assert await server.send(got.peer, Ping(), epoch=5)
        assert await client.recv() == Received("", Ping(), 5, None)
        assert server.recv_nowait() is None and client.recv_nowait() is None
        client.close()
        server.close()

    run(main())


def test_an_invalid_message_raises_protocol_error_at_send() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("m")
        client = hub.client("m")
        with pytest.raises(ProtocolError):
            await client.send(Error(message=123))
        with pytest.raises(ProtocolError):
            await server.send(client.peer or "", Error(message=123))
        assert server.recv_nowait() is None

    run(main())


def test_raw_bad_frames_arrive_as_errors() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("m")
        client = hub.client("m")
        client.send_raw(b"\xc1")
        bad = await server.recv()
        assert bad.message is None and isinstance(bad.error, ProtocolError) and bad.epoch == 0
        assert server.send_raw(bad.peer, b"junk")
        bad = await client.recv()
        assert bad.message is None and bad.error is not None

    run(main())


def test_recv_waits_for_a_later_send_and_bursts_drain_in_order() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("m")
        client = hub.client("m")
        waiting = asyncio.create_task(server.recv())
        await asyncio.sleep(0)
        assert not waiting.done()
        for i in range(50):
            await client.send(Error(message=str(i)))
        first = await waiting
        rest = []
        while (item := server.recv_nowait()) is not None:
            rest.append(item)
        texts = [r.message.message for r in [first, *rest] if isinstance(r.message, Error)]
        assert texts == [str(i) for i in range(50)]

    run(main())


def test_unknown_peer_and_disconnect_reconnect() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("m")
        events: list[str] = []
        client = hub.client(
            "m",
            on_connected=lambda: events.append("up"),
            on_disconnected=lambda: events.append("down"),
        )
        await until(lambda: events == ["up"])
        assert await server.send("00deadbeef", Pong()) is False
        old_peer = client.peer
        assert old_peer is not None and server.peers == {old_peer}
        hub.disconnect(client)
        await until(lambda: events == ["up", "down"])
        assert not client.connected and server.peers == frozenset()
        assert await server.send(old_peer, Pong()) is False
        await client.send(Heartbeat())  # queued while the link is down
        assert server.recv_nowait() is None
        hub.reconnect(client)
        await until(lambda: events == ["up", "down", "up"])
        got = await server.recv()
        assert got.message == Heartbeat() and got.peer == client.peer != old_peer

    run(main())


def test_server_appears_later_closes_and_comes_back() -> None:
    async def main() -> None:
        hub = InprocHub()
        events: list[str] = []
        client = hub.client(
            "m",
            on_connected=lambda: events.append("up"),
            on_disconnected=lambda: events.append("down"),
        )
        await client.send(Heartbeat())
        assert not client.connected
        server = hub.server("m")
        with pytest.raises(ValueError):
            hub.server("m")
        await until(lambda: events == ["up"])
        assert (await server.recv()).message == Heartbeat()
        waiting = asyncio.create_task(server.recv())
        await asyncio.sleep(0)
        server.close()
        with pytest.raises(TransportClosed):
            await waiting
        await until(lambda: events == ["up", "down"])
        again = hub.server("m")
        await until(lambda: events == ["up", "down", "up"])
        await client.send(Pong())
        assert (await again.recv()).message == Pong()
        client.close()
        assert again.peers == frozenset()
        with pytest.raises(TransportClosed):
            await client.send(Pong())
        with pytest.raises(TransportClosed):
            client.recv_nowait()
        with pytest.raises(TransportClosed):
            server.recv_nowait()
        with pytest.raises(TransportClosed):
            await server.send("00", Pong())

    run(main())


def test_callbacks_without_a_running_loop_run_right_away() -> None:
    hub = InprocHub()
    events: list[str] = []
    hub.server("m")
    client = hub.client("m", on_connected=lambda: events.append("up"))
    assert events == ["up"] and client.connected
