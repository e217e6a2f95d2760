"""Maintenance on a real cluster (master and agent processes on 127.0.0.1, an SDK framework):
a window scheduled on the agent reaches the framework as an inverse offer, which it accepts and
the master records; a drain with a deadline kills what still runs there (KILLED, reason
AGENT_DRAINING); the empty draining agent is DRAINED; reactivating it clears all of that."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agora.sdk import BlockingSchedulerDriver, FrameworkInfo, TaskSpec, TaskState
from agora.sdk.ids import AgentID
from agora.sdk.messages import (
    AgentSummary,
    InverseOffer,
    OperatorDone,
    Reason,
    ScheduleMaintenance,
    StateReply,
)
from agora.sdk.operator import OperatorClient
from support.cluster import LocalCluster
from support.polling import wait_for
from support.recorder import Recorder


@dataclass
class Vacating(Recorder):
    """Runs its tasks, and accepts every inverse offer it gets."""

    inverse: list[InverseOffer] = field(default_factory=list)

    def inverse_offers(self, driver: Any, inverse_offers: list[InverseOffer]) -> None:
        with self.lock:
            self.inverse.extend(inverse_offers)
        driver.accept_inverse_offers(inverse_offers)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", agents=1) as c:
        yield c


def _operator(cluster: LocalCluster, message: Any, **kw: Any) -> OperatorDone:
    client = OperatorClient(cluster.endpoint, curve=cluster.client_curve)
    if kw:
        return asyncio.run(client.drain_agent(message, **kw))
    return asyncio.run(client.call(message, 10.0))


def _agent(state: StateReply, agent_id: AgentID) -> AgentSummary:
    return next(a for a in state.agents if a.agent_id == agent_id)


def test_inverse_offer_accepted_then_drain_with_deadline_then_drained(
    cluster: LocalCluster,
) -> None:
    rec = Vacating(todo=[TaskSpec("sleeper", "sleep 120", "cpus:0.1;mem:16")])
    framework = FrameworkInfo(name="maint", failover_timeout=60.0)
    driver = BlockingSchedulerDriver(rec, framework, cluster.endpoint)
    driver.start(timeout=20)
    try:
        running = rec.wait_state("sleeper", TaskState.RUNNING, timeout=30)
        agent_id = running.agent_id
        assert agent_id is not None

        start = time.time() + 600
        window = ScheduleMaintenance(agent_ids=(agent_id,), start=start, duration=3600)
        assert "scheduled" in _operator(cluster, window).message
        wait_for(lambda: rec.inverse, 20, "an inverse offer at the framework")
        [io] = rec.inverse
        assert (io.agent_id, io.hostname, io.start, io.duration) == (
            agent_id,
            "agent-0",
            start,
            3600,
        )

        def answered() -> str | None:
            state = cluster.state()
            answers = [a.answer for w in state.maintenance for a in w.answers]
            return answers[0] if answers == ["ACCEPTED"] else None

        wait_for(answered, 20, "the master to record the accept")
        [summary] = cluster.state().maintenance
        assert summary.status == "SCHEDULED" and summary.agent_ids == (agent_id,)

        deadline = time.time() + 2.0
        _operator(cluster, agent_id, deadline=deadline)
        agent = _agent(cluster.state(), agent_id)
        assert agent.draining and agent.drain_deadline == deadline and not agent.drained
        killed = rec.wait_state("sleeper", TaskState.KILLED, timeout=30)
        assert killed.reason is Reason.AGENT_DRAINING, killed
        assert time.time() >= deadline
        wait_for(lambda: _agent(cluster.state(), agent_id).drained, 30, "the agent DRAINED")

        client = OperatorClient(cluster.endpoint, curve=cluster.client_curve)
        asyncio.run(client.reactivate_agent(agent_id))
        agent = _agent(cluster.state(), agent_id)
        assert not agent.draining and not agent.drained and agent.drain_deadline is None
    finally:
        driver.stop()
        driver.join(timeout=20)
