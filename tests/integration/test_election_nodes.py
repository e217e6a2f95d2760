"""Three ElectionNodes in one process over real ZeroMQ on 127.0.0.1: election, replication,
failover, restart from disk, catch-up by snapshot, and what a proposal does without a leader."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agora.master.election.node import ElectionNode, NotLeader
from agora.master.election.storage import RaftStorage
from agora.master.election.types import HardState, RaftConfig, Ready, Role, Snapshot
from agora.sdk.messages import (
    AppendEntries,
    AppendReply,
    LogEntry,
    Message,
    SnapshotReply,
    VoteReply,
    VoteRequest,
)
from agora.sdk.transport import ZmqServer
from support.election_kit import forward

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 19.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout} s")
        await asyncio.sleep(0.01)


@dataclass
class Member:
    """One master: its ROUTER, its ElectionNode and a list-of-bytes state machine."""

    endpoint: str
    data_dir: Path
    server: ZmqServer | None = None
    node: ElectionNode | None = None
    forwarder: asyncio.Task[None] | None = None
    state: list[bytes] = field(default_factory=list)
    applied: list[LogEntry] = field(default_factory=list)
    restores: int = 0
    terms: list[int] = field(default_factory=list)
    #: The names of the messages its ROUTER received.
    seen: list[str] = field(default_factory=list)

    def apply(self, entry: LogEntry) -> None:
        self.applied.append(entry)
        if entry.data:
            self.state.append(entry.data)

    def restore(self, data: bytes) -> None:
        self.state = [bytes.fromhex(item) for item in json.loads(data)]
        self.restores += 1

    def take_snapshot(self) -> bytes:
        return json.dumps([item.hex() for item in self.state]).encode()

    def on_role(self, role: Role, term: int, leader: str | None) -> None:
        self.terms.append(term)

    @property
    def running(self) -> ElectionNode:
        assert self.node is not None, f"{self.endpoint} is stopped"
        return self.node


class Cluster:
    def __init__(
        self,
        tmp_path: Path,
        storage: type[RaftStorage] = RaftStorage,
        *,
        answer_back: bool = True,
        **node_options: Any,
    ) -> None:
        self.tmp_path = tmp_path
        self.answer_back = answer_back
        self.storage = storage
        self.node_options = node_options
        self.members: list[Member] = []
        self.config_options: dict[str, Any] = {}

    async def start(self, size: int = 3, **config_options: Any) -> None:
        self.config_options = config_options
        for i in range(size):  # bind first: the configs need the real endpoints
            server = ZmqServer.bind("tcp://127.0.0.1:0")
            member = Member(server.endpoint, self.tmp_path / f"master-{i}", server=server)
            self.members.append(member)
        for member in self.members:
            await self.start_node(member)

    async def start_node(self, member: Member) -> None:
        if member.server is None:  # restart: bind the same endpoint again
            member.server = ZmqServer.bind(member.endpoint)
        config = RaftConfig(
            node_id=member.endpoint,
            members=tuple(m.endpoint for m in self.members),
            **self.config_options,
        )
        node = ElectionNode(
            config,
            self.storage(member.data_dir),
            apply=member.apply,
            restore=member.restore,
            take_snapshot=member.take_snapshot,
            on_role=member.on_role,
            **self.node_options,
        )
        await node.start()
        member.node = node
        member.forwarder = asyncio.create_task(
            forward(member.server, node, answer_back=self.answer_back, seen=member.seen)
        )

    async def stop_node(self, member: Member) -> None:
        if member.forwarder is not None:
            member.forwarder.cancel()
            await asyncio.gather(member.forwarder, return_exceptions=True)
            member.forwarder = None
        if member.server is not None:
            member.server.close()
            member.server = None
        if member.node is not None:
            await member.node.stop()
            member.node = None

    async def close(self) -> None:
        for member in self.members:
            await self.stop_node(member)

    def up(self) -> list[Member]:
        return [m for m in self.members if m.node is not None]

    def leader(self) -> Member | None:
        leaders = [m for m in self.up() if m.running.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    async def await_leader(self, timeout: float = 5.0, above_term: int = 0) -> Member:
        def settled() -> bool:
            leader = self.leader()
            return (
                leader is not None
                and leader.running.term > above_term
                and all(m.running.leader_id == leader.endpoint for m in self.up())
            )

        await until(settled, timeout, "one leader that every running member follows")
        leader = self.leader()
        assert leader is not None
        return leader


FAST = {"election_timeout": 0.5, "heartbeat_interval": 0.05}


def test_replication_failover_and_restart_with_catch_up_by_snapshot(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, snapshot_every=20)
        try:
            await cluster.start(**FAST)
            leader = await cluster.await_leader()
            first_term = leader.running.term

            proposals = [f"p{i}".encode() for i in range(100)]
            indices = await asyncio.gather(
                *(leader.running.propose(data, timeout=10.0) for data in proposals)
            )
            assert indices == sorted(indices) and len(set(indices)) == 100
            last = indices[-1]
            await until(
                lambda: all(m.running.last_applied >= last for m in cluster.members),
                5.0,
                "every member applies all 100 entries",
            )
            for member in cluster.members:
                assert member.state == proposals  # same entries, same order, each once
                applied = [e.index for e in member.applied]
                assert applied == sorted(set(applied))
            status = leader.running.status()
            assert status.role is Role.LEADER and all(m.reachable for m in status.members)
            assert leader.running.lease_valid()

            # the leader dies; the other two elect a new one in a higher term
            old_term = leader.running.term
            killed = time.monotonic()
            await cluster.stop_node(leader)
            successor = await cluster.await_leader(timeout=5.0, above_term=old_term)
            failover = time.monotonic() - killed
            assert successor is not leader and successor.running.term > first_term
            more = [f"q{i}".encode() for i in range(60)]  # enough to compact past the old log
            for data in more:
                await successor.running.propose(data, timeout=5.0)

            # the old leader comes back on its data dir: its term never goes back, and it
            # catches up through the successor's snapshot (its log was compacted past it)
            seen_terms = len(leader.terms)
            await cluster.start_node(leader)
            restores_at_start = leader.restores  # start() restored its own last snapshot
            assert restores_at_start >= 1
            assert leader.running.term >= old_term
            target = successor.running.last_applied
            await until(
                lambda: leader.running.last_applied >= target,
                5.0,
                "the restarted member catches up",
            )
            assert leader.state == proposals + more
            assert leader.restores > restores_at_start  # the successor's snapshot, from afar
            assert all(t >= old_term for t in leader.terms[seen_terms:])
            assert leader.terms == sorted(leader.terms)  # across both lives
            assert leader.running.leader_id == successor.endpoint
            print(f"failover_seconds={failover:.3f}")
        finally:
            await cluster.close()

    run(main())


@pytest.mark.parametrize("answer_back", [True, False], ids=["answers-back", "own-links"])
def test_answers_come_back_over_the_connection_their_request_came_in_on(
    tmp_path: Path, answer_back: bool
) -> None:
    """A leader's ROUTER also serves every agent and framework: the acknowledgements that keep
    its lease must not queue behind them there. Followers answer over the connection a request
    came in on (the leader's own DEALER); without that way back, over their own links."""

    async def main() -> None:
        cluster = Cluster(tmp_path, answer_back=answer_back)
        try:
            await cluster.start(**FAST)
            leader = await cluster.await_leader()
            indices = await asyncio.gather(
                *(leader.running.propose(f"e{i}".encode(), timeout=5.0) for i in range(30))
            )
            await until(
                lambda: all(m.running.last_applied >= max(indices) for m in cluster.members),
                5.0,
                "every member applies the entries",
            )
            await asyncio.sleep(0.3)  # several heartbeat rounds, each answered
            assert leader.running.lease_valid()
            followers = [m for m in cluster.members if m is not leader]
            assert all(AppendEntries.NAME in m.seen for m in followers)
            answers_at_leader = leader.seen.count(AppendReply.NAME)
            if answer_back:
                assert answers_at_leader == 0, leader.seen[-10:]
            else:
                assert answers_at_leader >= 10
        finally:
            await cluster.close()

    run(main())


def test_follower_refuses_and_a_minority_leader_times_out(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, source_host="127.0.0.1")
        try:
            await cluster.start(election_timeout=1.0, heartbeat_interval=0.05)
            leader = await cluster.await_leader()
            await leader.running.propose(b"before", timeout=5.0)
            follower = next(m for m in cluster.members if m is not leader)
            with pytest.raises(NotLeader) as refused:
                await follower.running.propose(b"to a follower", timeout=5.0)
            assert refused.value.leader == leader.endpoint
            assert b"to a follower" not in leader.state

            for member in cluster.members:
                if member is not leader:
                    await cluster.stop_node(member)
            with pytest.raises(TimeoutError):
                await leader.running.propose(b"no majority", timeout=0.3)
            # without a majority the leader gives up its lead (CheckQuorum); nothing was applied
            await until(
                lambda: leader.running.role is not Role.LEADER, 5.0, "the cut-off leader steps down"
            )
            assert not leader.running.lease_valid()
            assert b"no majority" not in leader.state
            assert leader.state == [b"before"]
            with pytest.raises(NotLeader):
                await leader.running.propose(b"after", timeout=1.0)
            others = [m for m in leader.running.status().members if m.member != leader.endpoint]
            assert len(others) == 2 and not any(m.reachable for m in others)
        finally:
            await cluster.close()

    run(main())


class RecordingStorage(RaftStorage):
    """Remembers what was durable (fsynced) at each moment, to hold sent messages against."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.durable_hard = HardState()
        self.durable_snapshot = 0
        self.durable_last = 0
        self._snapshot_written = 0

    def load(self) -> tuple[HardState, Snapshot | None, list[LogEntry]]:
        hard, snapshot, entries = super().load()
        self.durable_hard = hard
        self.durable_snapshot = self._snapshot_written = snapshot.index if snapshot else 0
        self.durable_last = entries[-1].index if entries else self.durable_snapshot
        return hard, snapshot, entries

    def persist(self, ready: Ready, *, sync: bool = True) -> None:
        if ready.snapshot is not None:
            self._snapshot_written = max(self._snapshot_written, ready.snapshot.index)
        super().persist(ready, sync=sync)

    def sync(self) -> None:
        super().sync()
        self.durable_hard = self.hard_state
        self.durable_snapshot = self._snapshot_written
        self.durable_last = self.last_index or self.durable_snapshot


def not_yet_durable(me: str, to: str, message: Message, disk: RecordingStorage) -> str | None:
    """What ``message`` from ``me`` to ``to`` depends on that ``disk`` has not made durable."""
    hard = disk.durable_hard
    if isinstance(message, VoteRequest) and not message.pre_vote:
        if (hard.term, hard.voted_for) != (message.term, me):
            return f"vote request for term {message.term} with {hard} on disk"
    elif isinstance(message, VoteReply) and message.granted and not message.pre_vote:
        if (hard.term, hard.voted_for) != (message.term, to):
            return f"vote for {to} in term {message.term} with {hard} on disk"
    elif isinstance(message, AppendEntries) and message.entries:
        if disk.durable_last < message.entries[-1].index or hard.term < message.term:
            return f"entries up to {message.entries[-1].index}, {disk.durable_last} on disk"
    elif isinstance(message, AppendReply | SnapshotReply) and getattr(message, "success", True):
        durable = max(disk.durable_last, disk.durable_snapshot)
        if durable < message.match_index or hard.term < message.term:
            return f"ack of {message.match_index} in term {message.term}, {durable} on disk"
    return None


def test_no_message_leaves_before_what_it_depends_on_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    violations: list[str] = []
    checked: dict[str, int] = {}

    def watch(member: Member) -> None:
        node = member.running
        disk = node._storage
        assert isinstance(disk, RecordingStorage)
        send = node._send  # where every message leaves, over either way to its member

        def checked_send(to: str, message: Message) -> None:
            checked[message.NAME] = checked.get(message.NAME, 0) + 1
            problem = not_yet_durable(member.endpoint, to, message, disk)
            if problem is not None:
                violations.append(f"{member.endpoint} -> {to}: {problem}")
            send(to, message)

        monkeypatch.setattr(node, "_send", checked_send)

    async def main() -> None:
        cluster = Cluster(tmp_path, storage=RecordingStorage, snapshot_every=15)
        try:
            await cluster.start(**FAST)
            for member in cluster.members:
                watch(member)
            leader = await cluster.await_leader()
            await asyncio.gather(
                *(leader.running.propose(b"x%d" % i, timeout=10) for i in range(40))
            )
            term = leader.running.term
            await cluster.stop_node(leader)  # a new election, with votes that must be durable
            successor = await cluster.await_leader(above_term=term)
            for i in range(20):
                await successor.running.propose(b"y%d" % i, timeout=5)
            await cluster.start_node(leader)
            watch(leader)
            target = successor.running.last_applied
            await until(lambda: leader.running.last_applied >= target, 5.0, "catch-up")
        finally:
            await cluster.close()

    run(main())
    assert violations == []
    assert checked.get("RAFT_VOTE", 0) >= 2 and checked.get("RAFT_VOTE_REPLY", 0) >= 1
    assert checked.get("RAFT_APPEND", 0) > 10 and checked.get("RAFT_APPEND_REPLY", 0) > 10
