"""The Mesos scheduler API's HTTP layer over a real master core (calls handed to it in-process,
as the daemon does), its streams, and a standby's answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agora.master.server.http import Operator, make_app
from agora.master.server.http_access import OPEN
from agora.master.server.metrics import DaemonStats
from agora.master.server.streams import MAX_QUEUED, STREAM_PEER, Streams
from agora.sdk.mesos.scheduler_api import MAX_CALL_BYTES
from agora.sdk.messages import Heartbeat, Message
from aiohttp import StreamReader
from aiohttp.test_utils import TestClient, TestServer
from support.master_kit import Harness

INFO = {"user": "u", "name": "mesos-fw"}


async def _never(message: Message, principal: str | None, timeout: float) -> Message:
    raise AssertionError("no operator call expected")


def _app(h: Harness | None, streams: Streams, where: dict[str, Any] | None = None) -> Any:
    async def submit(peer: str, message: Message, principal: str | None, timeout: float) -> None:
        assert h is not None
        for send in h.handle(peer, message):
            if send.to.startswith(STREAM_PEER):
                streams.deliver(send.to, send.message)

    operator = Operator(_never, submit=submit, streams=streams)
    return make_app(
        lambda: h.master if h is not None else None,
        DaemonStats(),
        lambda: where or {},
        operator=operator,
        access=OPEN,
        redirect=True,
    )


async def _event(content: StreamReader) -> dict[str, Any]:
    """The next event that is not a HEARTBEAT."""
    while True:
        size = int(await content.readline())
        event = dict(json.loads(await content.readexactly(size)))
        if event["type"] != "HEARTBEAT":
            return event


def test_subscribe_streams_events_and_calls_are_taken_with_the_stream_id() -> None:
    h = Harness()
    h.register_agent("a1", "cpus:2;mem:1024")
    streams = Streams()

    async def run() -> None:
        async with TestClient(TestServer(_app(h, streams))) as client:
            call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": INFO}}
            resp = await client.post("/api/v1/scheduler", json=call)
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
            stream_id = resp.headers["Mesos-Stream-Id"]
            subscribed = (await _event(resp.content))["subscribed"]
            fid = subscribed["framework_id"]
            assert subscribed["master_info"]["version"] == "1.11.0"
            stream = streams.get(stream_id)
            assert stream is not None and stream.framework_id == fid["value"]

            for send in h.tick(1.0):  # an allocation: the offer goes down the stream
                streams.deliver(send.to, send.message)
            offers = (await _event(resp.content))["offers"]["offers"]
            assert offers[0]["framework_id"] == fid and offers[0]["hostname"]

            decline = {
                "type": "DECLINE",
                "framework_id": fid,
                "decline": {"offer_ids": [offers[0]["id"]]},
            }
            headers = {"Mesos-Stream-Id": stream_id}
            answer = await client.post("/api/v1/scheduler", json=decline, headers=headers)
            assert answer.status == 202
            assert h.master.state.offers == {}, "the decline reached the core"
            again = await client.post("/api/v1/scheduler", json=call, headers=headers)
            assert again.status == 400  # a SUBSCRIBE must not carry a stream id
            assert "should not include" in await again.text()

            streams.end_all("lost the lead")
            assert await resp.content.read() == b"", "the stream ends with the term"
            assert streams.take_ended() == [STREAM_PEER + stream_id]

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_standby_redirects_schedulers_to_the_leader() -> None:
    where = {"leader_http": "http://10.0.0.7:5050"}

    async def run() -> None:
        call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": INFO}}
        async with TestClient(TestServer(_app(None, Streams(), where))) as client:
            resp = await client.post("/api/v1/scheduler", json=call, allow_redirects=False)
            assert resp.status == 307
            assert resp.headers["Location"] == "http://10.0.0.7:5050/api/v1/scheduler"
        async with TestClient(TestServer(_app(None, Streams()))) as client:
            resp = await client.post("/api/v1/scheduler", json=call, allow_redirects=False)
            assert resp.status == 503  # no leader known: pymesos retries

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_scheduler_that_does_not_read_is_cut_off_not_buffered_forever() -> None:
    async def run() -> None:
        streams = Streams()
        stream = streams.open("alice")
        for _ in range(MAX_QUEUED):
            assert streams.deliver(stream.peer, Heartbeat())
        assert not streams.deliver(stream.peer, Heartbeat())
        assert streams.get(stream.stream_id) is None and stream.ended is not None
        assert streams.take_ended() == [stream.peer]
        assert streams.take_ended() == []
        assert not streams.deliver(stream.peer, Heartbeat()), "nothing goes to an ended stream"

    asyncio.run(run())


def test_large_calls_are_read_whole_and_oversized_ones_refused() -> None:
    h = Harness()
    streams = Streams()

    async def run() -> None:
        async with TestClient(TestServer(_app(h, streams))) as client:
            call = {"type": "SUBSCRIBE", "subscribe": {"framework_info": INFO}}
            # Far larger than one read of the socket: an ACCEPT launching a thousand tasks is.
            padded = (json.dumps(call) + " " * 600_000).encode()
            headers = {"Content-Type": "application/json"}
            resp = await client.post("/api/v1/scheduler", data=padded, headers=headers)
            assert resp.status == 200
            resp.close()
            huge = (json.dumps(call) + " " * (MAX_CALL_BYTES + 1)).encode()
            resp = await client.post("/api/v1/scheduler", data=huge, headers=headers)
            assert resp.status == 413

    asyncio.run(asyncio.wait_for(run(), 20))
