"""A flood of bad frames on a real agent's executor socket: a few warnings, the rest summarised."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from agora.sdk.messages import Ping, Pong
from support.agent_daemon_kit import WAIT, AgentProcess, scenario
from support.polling import wait_for

FLOOD = 500
ROUTING_ID = b"flooder"


def _events(agent: AgentProcess) -> list[dict[str, Any]]:
    events = []
    for line in agent.log().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


async def _flood(endpoint: str) -> None:
    ctx = zmq.asyncio.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, ROUTING_ID)
        sock.connect(endpoint)
        for _ in range(FLOOD):
            await sock.send(b"\xc1 not msgpack")
        sock.close(linger=2000)  # the frames go out before the socket goes
    finally:
        ctx.term()


def test_a_flood_of_bad_frames_is_logged_a_few_times_and_summarised(tmp_path: Path) -> None:
    async def main() -> None:
        async with scenario(tmp_path) as (master, agent):
            await master.register()
            await _flood(agent.executor_endpoint())

            def accounted() -> list[dict[str, Any]] | None:
                events = _events(agent)
                warned = sum(e["event"] == "bad_frame_from_executor" for e in events)
                quiet = sum(e["count"] for e in events if e["event"] == "bad_frames_suppressed")
                return events if warned + quiet >= FLOOD else None

            events = await asyncio.to_thread(wait_for, accounted, WAIT, "the flood accounted")
            warned = [e for e in events if e["event"] == "bad_frame_from_executor"]
            summaries = [e for e in events if e["event"] == "bad_frames_suppressed"]
            assert 3 <= len(warned) <= 12, len(warned)
            assert {e["peer"] for e in warned} == {ROUTING_ID.hex()}
            assert sum(s["count"] for s in summaries) + len(warned) == FLOOD
            assert all(list(s["top"]) == [ROUTING_ID.hex()] for s in summaries)
            # Still serving its master.
            await master.send(Ping())
            await master.expect(Pong)
            assert agent.proc.poll() is None

    asyncio.run(asyncio.wait_for(main(), 60))
