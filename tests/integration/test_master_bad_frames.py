"""A flood of bad frames on a real master: all counted (per peer too), few logged, still serving."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import zmq
import zmq.asyncio
from agora.sdk.codec import decode, encode
from agora.sdk.messages import Error, ErrorCode, FrameworkInfo, Subscribe, Subscribed
from prometheus_client.parser import text_string_to_metric_families
from support.master_process import MasterProcess, master_process
from support.polling import wait_for

DEADLINE = 10.0
FLOOD = 500
ROUTING_ID = b"flooder"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _flood(endpoint: str) -> None:
    """Send FLOOD garbage frames from one peer, take every ERROR, then SUBSCRIBE."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, ROUTING_ID)
    sock.connect(endpoint)
    try:
        for _ in range(FLOOD):
            await sock.send(b"\xc1garbage")
        async with asyncio.timeout(DEADLINE):
            for _ in range(FLOOD):
                reply = decode(await sock.recv()).message
                assert isinstance(reply, Error) and reply.code is ErrorCode.BAD_REQUEST
            await sock.send(encode(Subscribe(framework_info=FrameworkInfo(name="fw"))))
            while not isinstance(decode(await sock.recv()).message, Subscribed):
                pass
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)


async def _metrics(master: MasterProcess) -> str:
    name = master.endpoint_file.name + ".http"
    url = master.endpoint_file.with_name(name).read_text().strip()
    async with (
        aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=DEADLINE)) as http,
        http.get("/metrics") as resp,
    ):
        assert resp.status == 200
        return await resp.text()


def test_a_flood_of_bad_frames_is_counted_per_peer_and_logged_a_few_times(tmp_path: Path) -> None:
    with master_process(tmp_path, "--http-port", "0") as master:
        asyncio.run(asyncio.wait_for(_flood(master.endpoint), 30))
        assert master.proc.poll() is None

        def summarised() -> list[dict[str, Any]] | None:
            events = master.log_events()
            summaries = [e for e in events if e["event"] == "bad_frames_suppressed"]
            warned = [e for e in events if e["event"] == "bad_frame"]
            if sum(s["count"] for s in summaries) + len(warned) < FLOOD:
                return None
            return events

        events = wait_for(summarised, DEADLINE, "the suppressed bad frames summarised")
        warned = [e for e in events if e["event"] == "bad_frame"]
        summaries = [e for e in events if e["event"] == "bad_frames_suppressed"]
        # A burst of 3, then 3 a second: the flood takes well under a few seconds.
        assert 3 <= len(warned) <= 12, len(warned)
        assert len(summaries) <= 5
        assert sum(s["count"] for s in summaries) + len(warned) == FLOOD
        assert summaries[0]["peers"] == 1
        assert list(summaries[0]["top"]) == [ROUTING_ID.hex()]

        samples = _samples(asyncio.run(_metrics(master)))
        assert samples[("agora_master_bad_frames_received_total", ())] == FLOOD
        by_peer = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "agora_master_bad_frames_by_peer"
        }
        assert by_peer == {(("peer", ROUTING_ID.hex()),): FLOOD}
