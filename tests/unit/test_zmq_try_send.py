"""ZmqClient.try_send: a send that never waits, for senders that retry on their own (Raft)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Error
from agora.sdk.transport import TransportClosed, ZmqClient, ZmqServer

T = TypeVar("T")
LOOPBACK = "tcp://127.0.0.1:0"


def run(coro: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_try_send_delivers_with_the_epoch() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        try:
            assert client.try_send(Error(message="hello"), epoch=7)
            got = await asyncio.wait_for(server.recv(), 5)
            assert got.message == Error(message="hello") and got.epoch == 7
        finally:
            client.close()
            server.close()

    run(main())


def test_try_send_drops_at_the_high_water_mark_instead_of_waiting() -> None:
    async def main() -> None:
        first = ZmqServer.bind(LOOPBACK)
        endpoint = first.endpoint
        first.close()  # nobody listens: messages queue in the client
        client = ZmqClient.connect(endpoint, hwm=4)
        server = None
        try:
            started = time.monotonic()
            results = [client.try_send(Error(message=str(i))) for i in range(50)]
            assert time.monotonic() - started < 1.0
            assert results[0] and not results[-1]
            accepted = results.count(True)
            assert results == [True] * accepted + [False] * (50 - accepted)
            server = ZmqServer.bind(endpoint)  # the queued ones still arrive, in order
            texts = []
            while len(texts) < accepted:
                got = server.recv_nowait() or await asyncio.wait_for(server.recv(), 5)
                assert isinstance(got.message, Error)
                texts.append(got.message.message)
            assert texts == [str(i) for i in range(accepted)]
        finally:
            client.close()
            if server is not None:
                server.close()

    run(main())


def test_try_send_rejects_bad_messages_and_closed_links() -> None:
    async def main() -> None:
        server = ZmqServer.bind(LOOPBACK)
        client = ZmqClient.connect(server.endpoint)
        try:
            with pytest.raises(ProtocolError):
                client.try_send(Error(message=123))  # type: ignore[arg-type]
        finally:
            client.close()
            server.close()
        with pytest.raises(TransportClosed):
            client.try_send(Error(message="late"))

    run(main())
