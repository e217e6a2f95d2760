"""The master daemon's inbox, alone: batches taken apart as queued, holding bounded."""

from __future__ import annotations

from agora.master.server.inbox import MAX_HELD, Inbox
from agora.master.server.stats import DaemonStats
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import Acknowledge, Acknowledgements, Heartbeat
from agora.sdk.transport import Received


def _ack(i: int) -> Acknowledge:
    return Acknowledge(
        framework_id=FrameworkID("fw"),
        agent_id=AgentID("a"),
        task_id=TaskID(f"t{i}"),
        uuid=b"u" * 16,
    )


def test_a_batch_is_queued_as_the_messages_it_carries() -> None:
    inbox = Inbox(DaemonStats())
    acks = tuple(_ack(i) for i in range(3))
    inbox.queue(Received("p", Acknowledgements(acks=acks), 7, None, "fw"))
    inbox.queue(Received("q", None, 0, None, None))  # a bad frame: kept for its answer
    assert [(r.peer, r.message, r.epoch, r.principal) for r in inbox.backlog] == [
        *(("p", ack, 7, "fw") for ack in acks),
        ("q", None, 0, None),
    ]
    assert len(inbox) == 4 and not inbox.full()


def test_holding_past_the_bound_drops_the_oldest_and_counts_it() -> None:
    stats = DaemonStats()
    inbox = Inbox(stats)
    for i in range(MAX_HELD + 2):
        inbox.hold(Received(f"p{i}", Heartbeat(), 0, None, None))
    assert stats.messages_dropped == 2
    assert len(inbox.held) == MAX_HELD
    assert inbox.held[0].peer == "p2"
