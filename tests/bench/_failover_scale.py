"""Mode 2 of the failover bench: N simulated agents in one thread against 3 master processes.

Each simulated agent (:class:`_zmtp_sim.SimPeers`) is one TCP connection to the current leader.
It answers the master minimally: REGISTER_AGENT once (all of them at once: a registration
storm), PONG to every PING and, when told of a new leader, reconnects there and sends
REREGISTER_AGENT with its agent id and no tasks. The bench reads the counters it publishes.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

from _failover_procs import Group, Probe, percentiles
from support.zmtp_sim import SimPeers

_REGISTER_TIMEOUT = 600.0
_ROUND_TIMEOUT = 300.0
#: One per simulated agent here, and one at the leader (its TCP connection; no ZeroMQ socket).
_FDS_PER_AGENT = 1
_FDS_RESERVED = 600  # the bench's own: probes, asyncio, the ZeroMQ contexts' threads, logs


def raise_fd_limit(agents: int) -> int:
    """Raise RLIMIT_NOFILE (inherited by the masters started after) for ``agents``; the limit.

    Raising the hard limit needs CAP_SYS_RESOURCE; without it the soft limit goes up to the hard.
    """
    want = agents * _FDS_PER_AGENT + _FDS_RESERVED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, hard), max(want, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def most_agents(fd_limit: int) -> int:
    """How many simulated agents one process holds under ``fd_limit`` open files."""
    return max(0, (fd_limit - _FDS_RESERVED) // _FDS_PER_AGENT)


@dataclass
class Leader:
    endpoint: str
    epoch: int
    changes: int = 0  # leader changes the bench did not cause


async def _wait(
    predicate: Any, deadline: float, what: str, sim: SimPeers, probe: Probe, leader: Leader
) -> None:
    """Until ``predicate()``; meanwhile moves the agents to any newer leader (every 0.2 s)."""
    next_look = 0.0
    next_report = time.perf_counter() + 10.0
    while not predicate():
        if sim.error is not None:
            raise RuntimeError(f"simulated agents failed: {sim.error!r}")
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(what)
        if now >= next_report:
            next_report = now + 10.0
            print(
                f"waiting for {what}: registered {sim.registered}, re-registered "
                f"{sim.reregistered}, other {sim.other}",
                file=sys.stderr,
                flush=True,
            )
        if now >= next_look:
            next_look = now + 0.2
            newer = probe.active_leader(probe.endpoints, leader.epoch)
            if newer is not None:
                leader.endpoint, leader.epoch = newer.responder, newer.epoch
                leader.changes += 1
                print(f"leader moved on its own to {newer.responder}", file=sys.stderr)
                sim.follow(newer.responder)
            probe.ask_leader(probe.endpoints)
        await asyncio.sleep(0.01)


def step_downs(group: Group) -> int:
    """Leaders of ``group`` that lost the lead without being killed (from the masters' logs)."""
    return sum(
        log.read_text(errors="replace").count("leadership_lost")
        for log in (group.work_dir / "logs").glob("master-*.log")
    )


@dataclass(frozen=True)
class KillRound:
    """Seconds from a leader's SIGKILL until each step of the way back."""

    elected: float  # a survivor is the active leader at a higher epoch
    reregistered: float  # the last simulated agent was answered AGENT_REREGISTERED
    all_active: float  # the new leader counts every agent ACTIVE

    def __str__(self) -> str:
        return (
            f"elected {self.elected:.3f}s, re-registered {self.reregistered:.3f}s, "
            f"all ACTIVE {self.all_active:.3f}s"
        )


async def kill_round(
    group: Group, probe: Probe, sim: SimPeers, leader: Leader, agents: int
) -> KillRound:
    """SIGKILL the leader, move ``sim`` to the one elected next, wait for all ``agents`` back,
    then restart the killed master and wait until it follows; ``leader`` is updated."""
    old = leader.endpoint
    victim = group.master_at(old)
    survivors = [e for e in group.endpoints if e != old]
    killed_at = time.perf_counter()
    victim.kill()
    deadline = killed_at + _ROUND_TIMEOUT
    info = await probe.wait_leader(survivors, leader.epoch, deadline)
    elected = time.perf_counter() - killed_at
    assert info.leader is not None
    leader.endpoint, leader.epoch = info.leader, info.epoch
    sim.follow(leader.endpoint)
    await _wait(
        lambda: sim.following == leader.endpoint and sim.reregistered == agents,
        deadline,
        "re-registration",
        sim,
        probe,
        leader,
    )
    at = await probe.wait_active_agents(leader.endpoint, agents, deadline, killed_at, every=0.25)
    victim.start()
    await probe.wait_follower(
        old, leader.endpoint, leader.epoch, time.perf_counter() + _ROUND_TIMEOUT
    )
    group.check_alive()
    return KillRound(elected, sim.last_reregistered_at - killed_at, at - killed_at)


async def run_scale(group: Group, count: int, kills: int) -> dict[str, Any]:
    requested = count
    fd_limit = raise_fd_limit(count)
    limited_by = None
    if count > most_agents(fd_limit):
        count = most_agents(fd_limit)
        limited_by = (
            f"RLIMIT_NOFILE: hard limit {fd_limit} (raising it needs CAP_SYS_RESOURCE), "
            f"{_FDS_PER_AGENT} fd per simulated agent (its TCP connection) here and at the leader"
        )
        print(f"only {count} simulated agents fit: {limited_by}", file=sys.stderr)
    group.start_masters(("--agent-reregister-timeout", "600"))
    elected: list[float] = []
    reregistered: list[float] = []
    in_state: list[float] = []
    async with Probe(group.endpoints) as probe:
        info = await probe.wait_leader(group.endpoints, -1, time.perf_counter() + 60, every=0.05)
        assert info.leader is not None
        leader = Leader(info.leader, info.epoch)
        sim = SimPeers(count, 0, leader.endpoint)
        sim.start()
        started = time.perf_counter()
        try:
            await _wait(
                lambda: sim.registered == count,
                started + _REGISTER_TIMEOUT,
                "registration",
                sim,
                probe,
                leader,
            )
            register_s = time.perf_counter() - started
            await probe.wait_active_agents(
                leader.endpoint, count, time.perf_counter() + 120, every=0.5
            )
            print(f"{count} agents registered in {register_s:.1f}s", file=sys.stderr)
            for n in range(kills):
                round_ = await kill_round(group, probe, sim, leader, count)
                elected.append(round_.elected)
                reregistered.append(round_.reregistered)
                in_state.append(round_.all_active)
                print(f"kill {n + 1}/{kills}: {round_}", file=sys.stderr, flush=True)
        finally:
            sim.stop()
            sim.join(30)
    return {
        "mode": "scale",
        "agents": count,
        "requested_agents": requested,
        "limited_by": limited_by,
        "kills": kills,
        "elected_s": percentiles(elected),
        "reregistered_s": percentiles(reregistered),
        "all_active_in_state_s": percentiles(in_state),
        "register_all_s": round(register_s, 3),
        "step_downs": step_downs(group),
        "unforced_leader_changes": leader.changes,
        "registrations_put_off": sim.put_off,
        "election_timeout": group.election_timeout,
        "rlimit_nofile": fd_limit,
        "pings_answered": sim.pings,
        "other_messages": sim.other,
    }
