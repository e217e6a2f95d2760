"""Master failover: SIGKILL the leader of a 3-master group again and again, time the way back.

Mode 1 (default, ``"mode": "processes"``): 3 masters and ``--agents`` agents as processes (posix
isolation) and one framework in this process that keeps a few ``sleep 3600`` tasks. Each of
``--kills`` rounds SIGKILLs the leader and measures, from the kill:

- ``elected_s``: a survivor says it is the active leader at a higher epoch (DETECT_LEADER to the
  survivors every 10 ms);
- ``agents_back_s``: the new leader's state shows every agent ACTIVE (GET_STATE every 50 ms);
- ``first_offer_s``: the framework gets its first offer of the new epoch;

then restarts the killed master on its work dir and waits until it follows the new leader.

Mode 2 (``--scale N``, ``"mode": "scale"``): 3 masters as processes and N simulated agents in a
thread of this process, one DEALER each (see ``_failover_scale``); measures ``elected_s`` and
``reregistered_s`` (the N-th AGENT_REREGISTERED reply after the kill). N is cut to what
RLIMIT_NOFILE allows (2 fds per simulated agent; the JSON names the limit in ``limited_by``).
``--seed`` seeds the random pause (0-0.5 s) before each kill of mode 1.

Mode 3 (``--group-restarts N``, ``"mode": "group-restart"``): SIGKILL all 3 masters, keep them
down ``--down`` seconds, start them again, N times; measures from the new leader's activation the
time to the framework re-subscribed and to every agent back (see ``_failover_group``).

Prints one JSON object. Work dirs go on /dev/shm when it exists.

    python tests/bench/failover.py --agents 20 --kills 20
    python tests/bench/failover.py --scale 10000 --kills 3
    python tests/bench/failover.py --agents 5 --group-restarts 5 --down 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/bench for the _failover_* helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.*

from _failover_framework import (
    FailoverFramework,
    start_failover_framework,
    wait_for_framework,
)
from _failover_procs import Group, Probe, percentiles
from agora.sdk.logs import configure_logging

_START_TIMEOUT = 60.0
_ROUND_TIMEOUT = 60.0
_T0 = time.perf_counter()


def _say(what: str) -> None:
    """Progress on stderr (stdout carries only the JSON)."""
    print(f"[{time.perf_counter() - _T0:7.2f}s] {what}", file=sys.stderr, flush=True)


async def _elect_first(probe: Probe, group: Group) -> tuple[str, int]:
    deadline = time.perf_counter() + _START_TIMEOUT
    info = await probe.wait_leader(group.endpoints, -1, deadline, every=0.05)
    assert info.leader is not None
    return info.leader, info.epoch


async def _kill_round(
    group: Group,
    probe: Probe,
    framework: FailoverFramework,
    runner: asyncio.Task[None],
    leader: str,
    epoch: int,
    rejoin: bool,
) -> tuple[dict[str, float], str, int]:
    """Kill ``leader``; the round's timings, the new leader and its epoch. With ``rejoin``,
    restart the killed master and wait until it follows the new leader."""
    survivors = [e for e in group.endpoints if e != leader]
    victim = group.master_at(leader)
    killed_at = time.perf_counter()
    victim.kill()
    deadline = killed_at + _ROUND_TIMEOUT
    info = await probe.wait_leader(survivors, epoch, deadline)
    elected_at = time.perf_counter()
    assert info.leader is not None
    new_leader, new_epoch = info.leader, info.epoch
    back_at = await probe.wait_active_agents(new_leader, group.agents, deadline, after=killed_at)
    offer_at = await wait_for_framework(
        lambda: framework.first_offer_after(killed_at, new_epoch),
        runner,
        deadline,
        "no offer from the new leader",
    )
    timings = {
        "elected_s": elected_at - killed_at,
        "agents_back_s": back_at - killed_at,
        "first_offer_s": offer_at - killed_at,
    }
    if rejoin:
        victim.start()
        deadline = time.perf_counter() + _ROUND_TIMEOUT
        await probe.wait_follower(leader, new_leader, new_epoch, deadline)
    return timings, new_leader, new_epoch


async def run_processes(group: Group, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    group.start_masters()
    results: dict[str, list[float]] = {"elected_s": [], "agents_back_s": [], "first_offer_s": []}
    group.start_agents()  # they find the leader themselves
    async with Probe(group.endpoints) as probe:
        leader, epoch = await _elect_first(probe, group)
        _say(f"{leader} leads at epoch {epoch}")
        await probe.wait_active_agents(
            leader, group.agents, time.perf_counter() + _START_TIMEOUT, every=0.2
        )
        _say(f"{group.agents} agents ACTIVE")
        framework, driver, runner = await start_failover_framework(
            group.group, group.agents, group.check_alive, _START_TIMEOUT
        )
        try:
            _say(f"{framework.wanted} tasks RUNNING")
            for n in range(kills):
                await asyncio.sleep(rng.uniform(0.0, 0.5))  # kill at a random heartbeat phase
                timings, leader, epoch = await _kill_round(
                    group, probe, framework, runner, leader, epoch, rejoin=n + 1 < kills
                )
                for key, value in timings.items():
                    results[key].append(value)
                _say(f"kill {n + 1}/{kills}: " + json.dumps(_rounded(timings)))
                group.check_alive()
        finally:
            driver.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner, 10)
    return {
        "mode": "processes",
        "agents": group.agents,
        "kills": kills,
        **{key: percentiles(values) for key, values in results.items()},
        "election_timeout": group.election_timeout,
        "tasks_lost": len(framework.ended),
    }


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 3) for key, value in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--kills", type=int, default=None, help="default: 20, or 3 with --scale")
    parser.add_argument("--election-timeout", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, default=0, help="simulated agents (mode 2)")
    parser.add_argument(
        "--group-restarts", type=int, default=0, help="whole-group restarts (mode 3)"
    )
    parser.add_argument(
        "--down", type=float, default=8.0, help="mode 3: seconds the whole group stays down"
    )
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    kills = args.kills if args.kills is not None else (3 if args.scale else 20)
    # SIGTERM ends the run like Ctrl-C does: through the finally blocks that stop every process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agora-failover-", dir=base) as tmp:
        group = Group(Path(tmp), agents=args.agents, election_timeout=args.election_timeout)
        try:
            if args.group_restarts:
                from _failover_group import run_group_restarts

                result = asyncio.run(
                    run_group_restarts(group, args.group_restarts, args.down, _say)
                )
            elif args.scale:
                from _failover_scale import run_scale

                result = asyncio.run(run_scale(group, args.scale, kills))
            else:
                result = asyncio.run(run_processes(group, kills, args.seed))
        finally:
            _say("stopping every process")
            group.close()
            _say("stopped")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
