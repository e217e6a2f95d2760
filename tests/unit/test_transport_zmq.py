"""agora.sdk.transport over ZeroMQ: typed round trips on tcp loopback, bad frames, link state.

Run as a script (``python tests/unit/test_transport_zmq.py``) to print the sequential round-trip
latency and the pipelined DEALER -> ROUTER -> DEALER echo rate of 20k messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import zmq
import zmq.asyncio
from agora.sdk.codec import MAX_FRAME_BYTES
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID
from agora.sdk.messages import Error, FrameworkMessage, Heartbeat, Ping, Pong
from agora.sdk.transport import (
    Client,
    Received,
    Server,
    TransportClosed,
    ZmqClient,
    ZmqServer,
)
from agora.sdk.transport.zmq_server import ZMQ_MAX_MSG_SIZE

T = TypeVar("T")
LOOPBACK = "tcp://127.0.0.1:0"


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.005)


async def within(awaitable: Awaitable[T], timeout: float = 5.0) -> T:
    return await asyncio.wait_for(awaitable, timeout)


def message() -> FrameworkMessage:
    return FrameworkMessage(agent_id=AgentID("a-1"), executor_id=ExecutorID("e"), data=b"\0\xff")


def test_round_trip_of_typed_messages_over_tcp_with_an_ephemeral_port() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        try:
            assert isinstance(server, Server) and isinstance(client, Client)
            assert server.endpoint.startswith("tcp://127.0.0.1:")
            assert not server.endpoint.endswith(":0")
            await client.send(message(), epoch=7)
            got = await within(server.recv())
            assert got.message == message() and got.epoch == 7 and got.error is None
            assert got.principal is None and len(got.peer) == 10
            int(got.peer, 16)
            assert await server.send(got.peer, Ping(connected=False), epoch=3)
            back = await within(client.recv())
            assert back == Received("", Ping(connected=False), 3, None)
            await until(lambda: client.connected)
        finally:
            client.close()
            server.close()

    run(main())


def test_recv_nowait_drains_a_burst_and_returns_none_when_empty() -> None:
    async def main() -> None:
        context = zmq.asyncio.Context()
        server = ZmqServer.bind(LOOPBACK, context=context)
        client = ZmqClient.connect(server.endpoint, context=context)
        try:
            assert server.recv_nowait() is None and client.recv_nowait() is None
            for i in range(200):
                await client.send(Error(message=str(i)))
            got: list[str] = []
            while len(got) < 200:
                received = server.recv_nowait() or await within(server.recv())
                assert isinstance(received.message, Error)
                got.append(received.message.message)
            assert got == [str(i) for i in range(200)]
            assert server.recv_nowait() is None
        finally:
            client.close()
            server.close()
            context.term()

    run(main())


def test_malformed_frames_are_reported_and_the_server_keeps_serving() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        context = zmq.asyncio.Context()
        raw = context.socket(zmq.DEALER)
        raw.linger = 0
        client = ZmqClient.connect(server.endpoint)
        try:
            raw.connect(server.endpoint)
            await raw.send(b"\xc1garbage")
            bad = await within(server.recv())
            assert bad.message is None and bad.epoch == 0
            assert isinstance(bad.error, ProtocolError)
            assert "msgpack" in str(bad.error)

            await raw.send_multipart([b"one", b"two"])
            bad = await within(server.recv())
            assert bad.message is None and "got 2 frames" in str(bad.error)

            await raw.send(b"\0" * (MAX_FRAME_BYTES + 1))
            bad = await within(server.recv())
            assert bad.message is None and bad.error is not None
            assert str(MAX_FRAME_BYTES) in str(bad.error) or "large" in str(bad.error)
            # The server still answers the peer that sent garbage, and serves others.
            assert await server.send(bad.peer, Error(message="bad frame"))
            reply = await within(raw.recv())
            assert reply

            await client.send(Heartbeat())
            good = await within(server.recv())
            assert good.message == Heartbeat() and good.error is None
        finally:
            client.close()
            raw.close(linger=0)
            context.term()
            server.close()

    run(main())


def test_a_frame_beyond_the_zmq_cap_is_cut_off_by_libzmq() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        context = zmq.asyncio.Context()
        raw = context.socket(zmq.DEALER)
        raw.linger = 0
        client = ZmqClient.connect(server.endpoint)
        try:
            raw.connect(server.endpoint)
            await raw.send(b"\0" * (ZMQ_MAX_MSG_SIZE + 1))
            await client.send(Pong())
            got = await within(server.recv())
            assert got.message == Pong()
            assert server.recv_nowait() is None
        finally:
            client.close()
            raw.close(linger=0)
            context.term()
            server.close()

    run(main())


def test_client_reports_a_bad_frame_from_the_server() -> None:
    async def main() -> None:
        context = zmq.asyncio.Context()
        raw = context.socket(zmq.ROUTER)
        raw.linger = 0
        port = raw.bind_to_random_port("tcp://127.0.0.1")
        client = ZmqClient.connect(f"tcp://127.0.0.1:{port}")
        try:
            await client.send(Heartbeat())
            routing_id, _ = await within(raw.recv_multipart())
            await raw.send_multipart([routing_id, b"\x93\x01\x02\x03"])
            bad = await within(client.recv())
            assert bad.peer == "" and bad.message is None and bad.error is not None
            await raw.send_multipart([routing_id, b"a", b"b"])
            bad = await within(client.recv())
            assert "got 2 frames" in str(bad.error)
        finally:
            client.close()
            raw.close(linger=0)
            context.term()

    run(main())


def test_send_to_an_unknown_or_gone_peer_returns_false() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        try:
            assert await server.send("00deadbeef", Pong()) is False
            assert await server.send("not hex", Pong()) is False
            await client.send(Heartbeat())
            peer = (await within(server.recv())).peer
            assert await server.send(peer, Pong())
            client.close()
            deadline = time.monotonic() + 5
            while await server.send(peer, Pong()):
                assert time.monotonic() < deadline, "peer still routable after close"
                await asyncio.sleep(0.005)
        finally:
            client.close()
            server.close()

    run(main())


def test_server_send_to_a_backlogged_peer_returns_false_instead_of_blocking() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK, hwm=4)
        client = ZmqClient.connect(server.endpoint, hwm=4)
        big = Error(message="x" * 60_000)
        try:
            await client.send(Heartbeat())
            peer = (await within(server.recv())).peer
            sent = 0
            while await server.send(peer, big):  # the client does not read
                sent += 1
                assert sent < 5_000, "never reached the high-water mark"
            deadline = time.monotonic() + 10
            while not await server.send(peer, Pong()):  # reading frees room again
                assert time.monotonic() < deadline
                if client.recv_nowait() is None:
                    await asyncio.sleep(0.001)
        finally:
            client.close()
            server.close()

    run(main())


def test_client_send_waits_at_the_high_water_mark_then_resumes() -> None:
    async def main() -> None:
        first = ZmqServer.bind(LOOPBACK)
        endpoint = first.endpoint
        first.close()
        client = ZmqClient.connect(endpoint, hwm=5)
        server = None
        try:
            count = 0
            while True:  # queue while nobody listens, until a send has to wait
                pending = asyncio.create_task(client.send(Error(message=str(count))))
                for _ in range(20):
                    await asyncio.sleep(0)
                count += 1
                if not pending.done():
                    break
                await pending
                assert count < 100, "sends never blocked"
            server = ZmqServer.bind(endpoint)
            await within(pending)
            texts = []
            while len(texts) < count:
                got = server.recv_nowait() or await within(server.recv())
                assert isinstance(got.message, Error)
                texts.append(got.message.message)
            assert texts == [str(i) for i in range(count)]
        finally:
            client.close()
            if server is not None:
                server.close()

    run(main())


def test_invalid_message_raises_protocol_error_at_send() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        try:
            with pytest.raises(ProtocolError):
                await client.send(Error(message=123))
            with pytest.raises(ProtocolError):
                await server.send("00deadbeef", Error(message=123))
            with pytest.raises(ProtocolError):
                await client.send(Pong(), epoch=-1)
        finally:
            client.close()
            server.close()

    run(main())


def test_connection_callbacks_fire_when_the_server_appears_and_closes() -> None:
    async def main() -> None:
        first = ZmqServer.bind(LOOPBACK)
        endpoint = first.endpoint
        first.close()
        events: list[str] = []
        client = ZmqClient.connect(
            endpoint,
            on_connected=lambda: events.append("up"),
            on_disconnected=lambda: events.append("down"),
        )
        server = None
        try:
            await client.send(Heartbeat())  # queued while no server is there
            assert not client.connected and events == []
            server = ZmqServer.bind(endpoint)
            await until(lambda: events == ["up"])
            assert client.connected
            got = await within(server.recv())
            assert got.message == Heartbeat()
            server.close()
            await until(lambda: events == ["up", "down"])
            assert not client.connected
            server = ZmqServer.bind(endpoint)
            await until(lambda: events == ["up", "down", "up"])
        finally:
            client.close()
            if server is not None:
                server.close()

    run(main())


def test_a_failing_callback_is_logged_not_fatal() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)

        def boom() -> None:
            raise RuntimeError("callback bug")

        client = ZmqClient.connect(server.endpoint, on_connected=boom)
        try:
            await until(lambda: client.connected)
            await client.send(Heartbeat())
            assert (await within(server.recv())).message == Heartbeat()
        finally:
            client.close()
            server.close()

    run(main())


def test_close_wakes_pending_recv_with_transport_closed() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        server_wait = asyncio.create_task(server.recv())
        client_wait = asyncio.create_task(client.recv())
        await asyncio.sleep(0)  # let both block
        server.close()
        client.close()
        with pytest.raises(TransportClosed):
            await within(server_wait)
        with pytest.raises(TransportClosed):
            await within(client_wait)
        for transport in (server, client):
            with pytest.raises(TransportClosed):
                transport.recv_nowait()
        with pytest.raises(TransportClosed):
            await client.send(Pong())
        with pytest.raises(TransportClosed):
            await server.send("00deadbeef", Pong())
        server.close()  # idempotent
        client.close()

    run(main())


def test_cancelling_a_recv_is_a_plain_cancellation() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        try:
            waiting = asyncio.create_task(server.recv())
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert not server.closed
        finally:
            server.close()

    run(main())


def test_bind_and_connect_reject_a_non_asyncio_context() -> None:
    async def main() -> None:
        sync_context = zmq.Context()
        try:
            with pytest.raises(TypeError):
                ZmqServer.bind(LOOPBACK, context=sync_context)
            with pytest.raises(TypeError):
                ZmqClient.connect("tcp://127.0.0.1:1", context=sync_context)
        finally:
            sync_context.term()

    run(main())


def test_bind_failure_leaves_nothing_open() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        try:
            with pytest.raises(zmq.ZMQError):
                ZmqServer.bind(server.endpoint)
        finally:
            server.close()

    run(main())


def test_plain_server_works_without_a_loop_at_bind_time() -> None:
    server = ZmqServer.bind(LOOPBACK)
    try:

        async def main() -> None:
            client = ZmqClient.connect(server.endpoint)
            try:
                await client.send(Heartbeat())
                assert (await within(server.recv())).message == Heartbeat()
            finally:
                client.close()

        run(main())
    finally:
        server.close()


async def _bench(n: int = 20_000) -> dict[str, float]:
    server = ZmqServer.bind(LOOPBACK)
    client = ZmqClient.connect(server.endpoint)
    try:
        rounds = min(n, 2_000)
        start = time.perf_counter()
        for _ in range(rounds):
            await client.send(Heartbeat())
            got = await server.recv()
            await server.send(got.peer, Pong())
            await client.recv()
        rtt = (time.perf_counter() - start) / rounds

        async def echo() -> None:
            done = 0
            while done < n:
                batch = [await server.recv()]
                while (more := server.recv_nowait()) is not None:
                    batch.append(more)
                for item in batch:
                    await server.send(item.peer, Pong())
                done += len(batch)

        async def sink() -> None:
            got = 0
            while got < n:
                await client.recv()
                got += 1
                while client.recv_nowait() is not None:
                    got += 1

        start = time.perf_counter()
        tasks = [asyncio.create_task(echo()), asyncio.create_task(sink())]
        for _ in range(n):
            await client.send(Heartbeat())
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
        return {"round_trip_us": rtt * 1e6, "echo_msgs_per_s": n / elapsed}
    finally:
        client.close()
        server.close()


def test_bench_smoke() -> None:
    figures = run(_bench(500))
    assert figures["echo_msgs_per_s"] > 0


if __name__ == "__main__":
    import json

    print(json.dumps(run(_bench(), timeout=120)))
