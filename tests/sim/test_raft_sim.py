"""Seeded simulations of 3 and 5 Raft cores under network faults and crashes
(tests/support/raft_sim.py checks safety after every event).

Replay one seed: ``AGORA_RAFT_SEED=17 .venv/bin/pytest tests/sim/test_raft_sim.py -k chaos``;
soak with more: ``AGORA_RAFT_SOAK=500 .venv/bin/pytest tests/sim/test_raft_sim.py -k chaos``.
"""

from __future__ import annotations

import os
import random
import statistics

import pytest
from agora.master.election.types import Role
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.raft_sim import Faults, RaftSim, SimViolation

_SEED = os.environ.get("AGORA_RAFT_SEED")
#: AGORA_RAFT_SOAK=N runs N seeds per group size instead of the CI's 20.
_COUNT = int(os.environ.get("AGORA_RAFT_SOAK", "20"))
CHAOS_SEEDS = [int(_SEED)] if _SEED else list(range(_COUNT))


def _commit_within(sim: RaftSim, data: bytes, timeout: float) -> bool:
    """Propose ``data`` to each new leader until some node applies it."""
    tried: set[tuple[str, int]] = set()

    def done() -> bool:
        name = sim.leader()
        raft = sim.members[name].raft if name else None
        if name and raft and (name, raft.term) not in tried:
            tried.add((name, raft.term))
            sim.propose(data)
        return any(d == data for _, d in sim.committed.values())

    return sim.run_until(done, timeout)


def _nemesis(sim: RaftSim, rng: random.Random, duration: float) -> None:
    """Random faults for ``duration`` seconds while a client proposes every 50 ms."""
    end = sim.now + duration
    counter = 0
    next_fault = sim.now
    while sim.now < end:
        if sim.now >= next_fault:
            next_fault = sim.now + rng.uniform(0.3, 3.0)
            names = list(sim.names)
            action = rng.choice(["isolate", "split", "one-way", "crash", "restart", "heal"])
            if action == "isolate":
                sim.isolate(rng.choice(names))
            elif action == "split":
                rng.shuffle(names)
                cut = rng.randint(1, len(names) - 1)
                sim.partition([names[:cut], names[cut:]])
            elif action == "one-way":
                a, b = rng.sample(names, 2)
                sim.cut_link(a, b)
            elif action == "crash":
                sim.crash(sim.leader() or rng.choice(names))
            elif action == "restart":
                for m in sim.members.values():
                    if m.raft is None:
                        sim.restart(m.name)
            else:
                sim.heal()
        counter += 1
        sim.propose(f"op-{counter}".encode())
        sim.run_for(0.05)


def _heal_and_check_liveness(sim: RaftSim) -> None:
    sim.heal()
    sim.faults.drop = min(sim.faults.drop, 0.01)
    for m in sim.members.values():
        if m.raft is None:
            sim.restart(m.name)
    start = sim.now
    assert sim.run_until(lambda: sim.leader() is not None, 10.0), "no leader after healing"
    assert _commit_within(sim, b"after-heal", 10.0 - (sim.now - start)), "nothing commits"
    sim.run_for(1.0)
    sim.check_log_matching()


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("seed", CHAOS_SEEDS)
def test_chaos_keeps_safety_and_recovers(n: int, seed: int) -> None:
    faults = Faults(latency_min=0.001, latency_max=0.03, drop=0.05, duplicate=0.05, hold=0.3)
    sim = RaftSim(n, seed, faults=faults, wire=seed % 3 == 0, compact_every=6)
    rng = random.Random(seed * 7919)
    try:
        _nemesis(sim, rng, 15.0)
        sim.check_log_matching()
        _heal_and_check_liveness(sim)
    except SimViolation as exc:
        raise AssertionError(f"seed {seed}, n={n}: {exc}") from exc
    if len(sim.committed) > 3 * 6:
        # Nodes compacted their logs as they applied (snapshots were taken, maybe shipped).
        assert any(m.snapshot is not None for m in sim.members.values())


def test_small_batches_and_lossy_links_still_converge() -> None:
    faults = Faults(latency_min=0.001, latency_max=0.05, drop=0.2, duplicate=0.2, hold=0.5)
    sim = RaftSim(5, 99, faults=faults, max_entries_per_append=3, max_bytes_per_append=16)
    _nemesis(sim, random.Random(5), 10.0)
    _heal_and_check_liveness(sim)
    leader = sim.leader()
    assert leader is not None
    raft = sim.members[leader].raft
    assert raft is not None
    # Every live node catches up with the leader's commit point.
    assert sim.run_until(
        lambda: all(
            m.raft is not None and m.raft.commit_index == raft.commit_index
            for m in sim.members.values()
        ),
        5.0,
    )


ops = st.lists(
    st.tuples(
        st.sampled_from(["isolate", "cut", "heal", "crash", "restart", "propose", "run"]),
        st.integers(0, 4),
        st.integers(0, 4),
        st.floats(0.01, 2.5),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=ops, n=st.sampled_from([3, 5]), seed=st.integers(0, 2**16))
def test_any_fault_schedule_is_safe_and_heals(
    schedule: list[tuple[str, int, int, float]], n: int, seed: int
) -> None:
    sim = RaftSim(n, seed, faults=Faults(drop=0.02, duplicate=0.05, hold=0.5), compact_every=5)
    names = sim.names
    for i, (op, a, b, seconds) in enumerate(schedule):
        x, y = names[a % n], names[b % n]
        if op == "isolate":
            sim.isolate(x)
        elif op == "cut" and x != y:
            sim.cut_link(x, y)
        elif op == "heal":
            sim.heal()
        elif op == "crash":
            sim.crash(x)
        elif op == "restart" and sim.members[x].raft is None:
            sim.restart(x)
        elif op == "propose":
            sim.propose(f"p{i}".encode())
        sim.run_for(seconds)
    _heal_and_check_liveness(sim)


def test_the_checker_catches_overlapping_leases() -> None:
    """A lease longer than the election timeout (a negative margin), held by a leader that does
    not step down when cut off, must be caught."""
    sim = RaftSim(3, 4, lease_margin=-1.5, check_quorum=False)
    assert sim.run_until(lambda: sim.leader() is not None, 5.0)
    leader = sim.leader()
    assert leader is not None
    sim.run_for(0.5)
    sim.isolate(leader)
    with pytest.raises(SimViolation, match="overlapping leases"):
        sim.run_for(5.0)


def _stable_leader(sim: RaftSim) -> str:
    assert sim.run_until(lambda: sim.leader() is not None, 10.0)
    sim.run_for(0.5)
    leader = sim.leader()
    assert leader is not None
    return leader


@pytest.mark.parametrize("seed", range(8))
def test_follower_that_cannot_hear_the_leader_does_not_depose_it(seed: int) -> None:
    """One-way cut leader -> x: y still hears the leader and refuses x's (pre-)votes."""
    sim = RaftSim(3, seed)
    leader = _stable_leader(sim)
    raft = sim.members[leader].raft
    assert raft is not None
    term = raft.term
    x = next(n for n in sim.names if n != leader)
    sim.cut_link(leader, x)
    sim.run_for(6.0)
    assert sim.leader() == leader and raft.term == term


@pytest.mark.parametrize("seed", range(8))
def test_restarted_voter_cannot_cut_a_lease_short(seed: int) -> None:
    """x is cut off from the leader and campaigns; y keeps restarting, forgetting when it last
    heard the leader. y must still not help x win while the old lease runs (the simulation
    checks leases after every event)."""
    sim = RaftSim(3, seed)
    leader = _stable_leader(sim)
    x, y = (n for n in sim.names if n != leader)
    sim.cut_link(leader, x)
    sim.cut_link(x, leader)
    end = sim.now + 4.0
    while sim.now < end:
        sim.crash(y)
        sim.restart(y)
        sim.run_for(0.06)


@pytest.mark.parametrize("seed", range(8))
def test_lease_alone_keeps_leaders_apart_without_check_quorum(seed: int) -> None:
    """An isolated leader that does not step down keeps its role, but its lease must end
    before any new leader's lease begins."""
    sim = RaftSim(5, seed, check_quorum=False)
    leader = _stable_leader(sim)
    sim.run_for(sim.rng.random() * 0.2)
    sim.isolate(leader)
    sim.run_for(5.0)
    old = sim.members[leader].raft
    # A newer leader exists, while the old one still thinks it leads.
    assert sim.leader() != leader
    assert old is not None and old.role is Role.LEADER


def _failover_time(seed: int) -> float:
    sim = RaftSim(3, seed, election_timeout=1.0, heartbeat_interval=0.1)
    assert sim.run_until(lambda: sim.leader() is not None, 10.0)
    sim.run_for(0.3 + sim.rng.random() * 0.2)
    old = sim.leader()
    assert old is not None
    old_raft = sim.members[old].raft
    assert old_raft is not None
    old_term = old_raft.term
    sim.crash(old)
    killed = sim.now

    def new_leader() -> bool:
        name = sim.leader()
        raft = sim.members[name].raft if name else None
        return raft is not None and raft.role is Role.LEADER and raft.term > old_term

    assert sim.run_until(new_leader, 10.0), f"seed {seed}: no new leader"
    return sim.now - killed


def test_failover_time_after_leader_crash() -> None:
    times = sorted(_failover_time(seed) for seed in range(200))
    p50 = statistics.median(times)
    p99 = times[int(len(times) * 0.99) - 1]
    print(
        f"failover over 200 seeds: min {times[0]:.3f} p50 {p50:.3f} p99 {p99:.3f} "
        f"max {times[-1]:.3f} s"
    )
    assert p50 < 2.0
    assert times[-1] < 4.0
