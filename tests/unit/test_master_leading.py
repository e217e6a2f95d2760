"""Whether a master leads is one predicate, ``Leadership.leading()``: its term is active, it is
still the Raft leader, not halted, and its lease holds. Every report reads it: ``/health``,
``/state``, ``/metrics``, LEADER_INFO answers and the member list.

Driven with a fake monotonic clock and hand-fed peer replies, so the lease runs out exactly when
the test says, as it does for a leader stopped (SIGSTOP) past its lease: the leader still believes
it leads (no peer told it otherwise), yet it must not say so.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from agora.master.core import MasterConfig
from agora.master.election.raft import RaftNode
from agora.master.election.types import HardState, RaftConfig, Role
from agora.master.server.daemon import MasterDaemon
from agora.master.server.http import make_app
from agora.master.server.http_access import OPEN
from agora.master.server.leadership import Leadership
from agora.sdk.daemon.history import History
from agora.sdk.messages import AppendReply, VoteReply
from agora.sdk.transport import InprocHub
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from support.polling import until

A, B, C = (f"tcp://127.0.0.1:{port}" for port in (47101, 47102, 47103))
T = 1.0
#: How long a lease lasts after the round it starts from (T less drift and margin).
LEASE = T * (1 - 0.05) - 0.05


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _reports(client: TestClient[Any, Any]) -> dict[str, Any]:
    """What the operator API says: /health, agora_master_elected and /state's status."""
    health = await (await client.get("/health")).json()
    metrics = await (await client.get("/metrics")).text()
    elected = next(
        f.samples[0].value
        for f in text_string_to_metric_families(metrics)
        if f.name == "agora_master_elected"
    )
    state = await client.get("/state")
    body = await state.json()
    return {
        "leading": health["leading"],
        "leader": health["leader"],
        "elected": elected,
        "state": (state.status, body["master"]["elected"] if state.status == 200 else None),
    }


def test_a_leader_whose_lease_ran_out_reports_that_it_does_not_lead(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = FakeClock(100.0)
        daemon = MasterDaemon(None, InprocHub().server(A), tick_interval=0.01, peer_timeout=60.0)
        leadership = Leadership(
            MasterConfig(master_id=A, address=A),
            RaftConfig(node_id=A, members=(A, B, C), heartbeat_interval=0.1, election_timeout=T),
            tmp_path,
            on_change=daemon.leadership_changed,
            history=History(None, A),
            clock=clock,
        )
        daemon.attach(leadership)
        node = leadership.node
        await leadership.start()
        served = asyncio.create_task(daemon.run())
        app = make_app(
            lambda: daemon.core,
            daemon.stats,
            daemon.leader_json,
            members=daemon.members,
            access=OPEN,
        )
        try:
            async with TestClient(TestServer(app)) as client:
                # A wins an election with B's votes (its peer links lead nowhere: B and C are
                # played by the test).
                clock.now = 100.0 + 2 * T
                await until(lambda: node.role is Role.PRE_CANDIDATE, what="a pre-vote")
                leadership.receive(
                    VoteReply(sender=B, term=node.term + 1, granted=True, pre_vote=True)
                )
                await until(lambda: node.role is Role.CANDIDATE, what="a campaign")
                leadership.receive(VoteReply(sender=B, term=node.term, granted=True))
                await until(lambda: node.role is Role.LEADER, what="the lead")
                won = clock.now

                # Won, but no majority has acknowledged a round yet: no lease, not active.
                assert not leadership.leading()
                assert leadership.leader_info().leader is None and daemon.core is None
                assert await _reports(client) == {
                    "leading": False,
                    "leader": None,
                    "elected": 0,
                    "state": (503, None),
                }

                # B acknowledges the first round (the no-op): active and leasing at once.
                leadership.receive(
                    AppendReply(sender=B, term=node.term, success=True, match_index=1, seq=1)
                )
                await until(leadership.leading, what="leading")
                assert leadership.leader_info().leader == A
                assert await _reports(client) == {
                    "leading": True,
                    "leader": A,
                    "elected": 1,
                    "state": (200, True),
                }
                assert [m.role for m in daemon.members()] == ["leader", "standby", "standby"]

                # Time passes with no answer from B or C (A was stopped, or cut off): the lease
                # ends before CheckQuorum would step A down. A still thinks itself the leader of
                # its term, with its core; it must not say it leads.
                clock.now = won + LEASE + 0.01
                assert clock.now < won + T
                assert node.role is Role.LEADER and leadership.core is not None
                assert not leadership.leading()
                assert leadership.leader_info().leader is None and daemon.core is None
                assert all(m.role == "standby" for m in daemon.members())
                assert await _reports(client) == {
                    "leading": False,
                    "leader": None,
                    "elected": 0,
                    "state": (503, None),
                }
                assert node.role is Role.LEADER  # (still: nothing above stepped it down)
        finally:
            daemon.stop()
            await served
            await leadership.stop()
        assert not leadership.leading()  # a stopped node never leads

    asyncio.run(scenario())


def test_the_round_that_commits_a_new_leaders_noop_also_starts_its_lease() -> None:
    """A term becomes active when its no-op is applied; the acknowledgements that commit it
    renew the lease in the same step, so a new leader reports leading as soon as it is active."""
    config = RaftConfig(node_id="a", members=("a", "b", "c"), election_timeout=T)
    n = RaftNode(
        config,
        hard_state=HardState(term=0, voted_for=None),
        snapshot=None,
        entries=[],
        now=0.0,
        rng=random.Random(1),
    )
    n.tick(2.0)
    n.step(VoteReply(sender="b", term=n.term + 1, granted=True, pre_vote=True), 2.0)
    n.step(VoteReply(sender="b", term=n.term, granted=True), 2.0)
    assert n.role is Role.LEADER and not n.lease_valid(2.0)
    ready = n.step(AppendReply(sender="b", term=n.term, success=True, match_index=1, seq=1), 2.05)
    assert [e.data for e in ready.committed] == [b""]
    assert n.lease_valid(2.05) and n.lease_until() == pytest.approx(2.0 + LEASE)
