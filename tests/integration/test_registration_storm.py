"""A registration storm against a group of three masters: thousands of agents and hundreds of
schedulers arrive at once, then, after a leader kill, all come back to the new leader at once.
The leader must absorb both without losing its lead (its election heartbeats and votes are not
starved by the client traffic) and without a single step-down anywhere in the group."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.master_http_group import http_group
from support.polling import wait_for
from support.zmtp_sim import SimPeers

AGENTS = 3000
FRAMEWORKS = 300
TASKS_PER_AGENT = 3
T = 1.0  # the default election timeout: what a production group runs with
STORM_DEADLINE = 120.0


def step_downs(tmp: Path) -> list[dict[str, object]]:
    """Every time a master of the group lost the lead it held (from their histories)."""
    path = tmp / "history.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("kind") == "stepped_down"]


def wait_until(predicate: object, what: str, sim: SimPeers) -> None:
    deadline = time.monotonic() + STORM_DEADLINE
    while not predicate():  # type: ignore[operator]
        if sim.error is not None:
            raise AssertionError(f"simulated peers failed: {sim.error!r}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} not done in {STORM_DEADLINE}s: registered {sim.registered}, "
                f"subscribed {sim.subscribed}, re-registered {sim.reregistered}, "
                f"told to retry later {sim.put_off}"
            )
        time.sleep(0.05)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("relay_links", [0, 30], ids=["direct", "relayed"])
def test_a_registration_storm_and_a_failover_storm_cause_no_step_down(
    tmp_path: Path, relay_links: int
) -> None:
    """``relayed``: the agents come over 30 connections as agora-relay carries them, and each is
    still an agent of its own at the leader."""
    with http_group(tmp_path, election_timeout=T) as group:
        leader, epoch = wait_for(group.leader, 30, "a leader")
        sim = SimPeers(
            AGENTS,
            FRAMEWORKS,
            leader,
            tasks_per_agent=TASKS_PER_AGENT,
            relay_links=relay_links,
        )
        sim.start()
        try:
            wait_until(
                lambda: sim.registered == AGENTS and sim.subscribed == FRAMEWORKS,
                "the registration storm",
                sim,
            )
            sim.reregister()  # every agent again, now reporting its tasks
            wait_until(lambda: sim.reregistered == AGENTS, "re-registration with tasks", sim)
            assert group.leader() == (leader, epoch), "the leader changed under the storm"
            assert step_downs(tmp_path) == []

            group.kill(leader)
            survivors = [e for e in group.endpoints if e != leader]
            new_leader, new_epoch = wait_for(lambda: group.leader(survivors), 30, "a new leader")
            assert new_epoch > epoch
            sim.follow(new_leader)  # all of them at once, with their tasks
            wait_until(
                lambda: sim.following == new_leader and sim.reregistered == AGENTS,
                "re-registration at the new leader",
                sim,
            )
            state = group.state(new_leader)
            assert len(state["agents"]) == AGENTS
            assert len(state["tasks"]) == AGENTS * TASKS_PER_AGENT
            assert group.leader(survivors) == (new_leader, new_epoch)
            assert step_downs(tmp_path) == [], "a leader lost its lead under the failover storm"
        finally:
            sim.stop()
            sim.join(30)
