"""The master's outbox: what happens to an answer that cannot be sent as is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Send
from agora.master.core.operator import snapshot
from agora.master.server.outbox import Outbox
from agora.master.server.stats import DaemonStats
from agora.master.server.streams import Streams
from agora.sdk import codec
from agora.sdk.daemon.history import History
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    Error,
    ErrorCode,
    Heartbeat,
    Message,
    RegisterAgent,
    StateReply,
    StatusUpdateAck,
    StatusUpdateAcks,
)
from agora.sdk.messages.batching import BATCHES
from agora.sdk.resources import Resources


class EncodingServer:
    """Encodes every message as the ZeroMQ server does (so the frame limit applies)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    async def send(self, peer: str, message: Message, epoch: int = 0) -> bool:
        codec.encode(message, epoch=epoch)
        self.sent.append((peer, message))
        return True


def _outbox(
    server: EncodingServer,
    stats: DaemonStats,
    deliver_stream: Callable[[str, Message], bool] = lambda _peer, _message: False,
) -> Outbox:
    """An outbox sending to ``server``, with no core, leadership or in-process callers."""
    return Outbox(
        server,  # type: ignore[arg-type]
        core=lambda: None,
        leadership=lambda: None,
        propose=lambda _action: None,
        answer_local=lambda _peer, _message: None,
        deliver_stream=deliver_stream,
        stats=stats,
        history=History(None, "master"),
        debug=False,
    )


def test_a_state_too_big_for_one_frame_is_answered_with_an_error_saying_what_to_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = EncodingServer()
    stats = DaemonStats()
    outbox = _outbox(server, stats)
    state = snapshot(Master(MasterConfig(master_id="m", address="tcp://127.0.0.1:1")).state)
    assert isinstance(state, StateReply)
    monkeypatch.setattr(codec, "MAX_FRAME_BYTES", len(codec.encode(state)) - 1)
    huge = state  # one byte over the (lowered) limit: as 100,000 tasks are over the real one
    asyncio.run(outbox.send("operator-1", huge, 3))
    [(peer, answer)] = server.sent
    assert peer == "operator-1"
    assert isinstance(answer, Error) and answer.code is ErrorCode.BAD_REQUEST
    assert "agents_limit" in answer.message and "/state" in answer.message
    assert stats.messages_dropped == 1


def test_what_goes_to_an_http_scheduler_goes_down_its_stream_not_the_socket() -> None:
    async def run() -> None:
        server = EncodingServer()
        stats = DaemonStats()
        streams = Streams()
        stream = streams.open("alice")
        outbox = _outbox(server, stats, deliver_stream=streams.deliver)
        await outbox.perform([Send(to=stream.peer, message=Heartbeat(), epoch=1)])
        assert server.sent == [] and stream.queue.get_nowait() == Heartbeat()
        streams.end(stream)
        await outbox.perform([Send(to=stream.peer, message=Heartbeat(), epoch=1)])
        assert server.sent == [] and stats.messages_dropped == 1  # its stream is gone

    asyncio.run(run())


def test_acknowledgements_held_by_calls_that_do_not_release_leave_merged_at_the_release() -> None:
    async def run() -> None:
        server = EncodingServer()
        outbox = _outbox(server, DaemonStats())
        outbox.batcher.heard("agent-1", _batch_reading_agent())
        acks = [
            StatusUpdateAck(framework_id=FrameworkID("f"), task_id=TaskID(f"t{i}"), uuid=bytes(16))
            for i in range(3)
        ]
        for ack in acks:  # three acknowledgement calls from an HTTP scheduler, one by one
            await outbox.perform([Send(to="agent-1", message=ack, epoch=1)], release=False)
        assert server.sent == []
        await outbox.release_batches()
        assert server.sent == [("agent-1", StatusUpdateAcks(acks=tuple(acks)))]
        # Released by default (as a socket call outside a burst is): the ack leaves at once.
        await outbox.perform([Send(to="agent-1", message=acks[0], epoch=1)])
        assert server.sent[-1] == ("agent-1", acks[0])

    asyncio.run(run())


def _batch_reading_agent() -> RegisterAgent:
    info = AgentInfo(hostname="h", resources=Resources.parse("cpus:1;mem:64"))
    return RegisterAgent(agent_info=info, features=(BATCHES,))
