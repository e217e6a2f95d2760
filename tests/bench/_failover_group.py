"""Mode 3 of the failover bench: SIGKILL the whole master group, keep it down, start it again.

3 masters and ``--agents`` agents as processes and one framework in this process keeping a few
``sleep 3600`` tasks. Each of ``--restarts`` rounds SIGKILLs every master, keeps the group down
for ``--down`` seconds (long enough for every client's retry backoff to grow), restarts every
master on its work dir and measures, from the moment a master says it is the active leader
(``active``; DETECT_LEADER every 10 ms through fresh sockets):

- ``active_s``: from the restart to an active leader;
- ``resubscribed_s``: from ``active`` to the framework's driver SUBSCRIBED again (``reregistered``);
- ``agents_back_s``: from ``active`` to the leader's state showing every agent ACTIVE.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from _failover_framework import (
    FailoverFramework,
    start_failover_framework,
    wait_for_framework,
)
from _failover_procs import Group, Probe, percentiles

_START_TIMEOUT = 60.0
_ROUND_TIMEOUT = 60.0


async def _restart_round(
    group: Group, framework: FailoverFramework, runner: asyncio.Task[None], epoch: int, down: float
) -> tuple[dict[str, float], int]:
    for daemon in group.masters:
        daemon.kill()
    await asyncio.sleep(down)  # the outage itself: nothing to wait for
    restarted_at = time.perf_counter()
    for daemon in group.masters:
        daemon.start()
    deadline = restarted_at + _ROUND_TIMEOUT
    # Fresh sockets: the probe's own reconnect backoff must not delay what it measures.
    async with Probe(group.endpoints) as probe:
        info = await probe.wait_leader(group.endpoints, epoch, deadline)
        active_at = time.perf_counter()
        assert info.leader is not None
        back_at = await probe.wait_active_agents(
            info.leader, group.agents, deadline, after=active_at
        )
    resubscribed_at = await wait_for_framework(
        lambda: framework.resubscribed_after(restarted_at),
        runner,
        deadline,
        "the framework did not re-subscribe",
    )
    timings = {
        "active_s": active_at - restarted_at,
        "resubscribed_s": resubscribed_at - active_at,
        "agents_back_s": back_at - active_at,
    }
    return timings, info.epoch


async def run_group_restarts(group: Group, restarts: int, down: float, say: Any) -> dict[str, Any]:
    group.start_masters()
    group.start_agents()
    results: dict[str, list[float]] = {"active_s": [], "resubscribed_s": [], "agents_back_s": []}
    async with Probe(group.endpoints) as probe:
        info = await probe.wait_leader(group.endpoints, -1, time.perf_counter() + _START_TIMEOUT)
        assert info.leader is not None
        epoch = info.epoch
        await probe.wait_active_agents(
            info.leader, group.agents, time.perf_counter() + _START_TIMEOUT, every=0.2
        )
    say(f"{group.agents} agents ACTIVE under {info.leader} at epoch {epoch}")
    framework, driver, runner = await start_failover_framework(
        group.group, group.agents, group.check_alive, _START_TIMEOUT
    )
    try:
        for n in range(restarts):
            timings, epoch = await _restart_round(group, framework, runner, epoch, down)
            for key, value in timings.items():
                results[key].append(value)
            say(f"restart {n + 1}/{restarts}: " + str({k: round(v, 3) for k, v in timings.items()}))
            group.check_alive()
    finally:
        driver.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner, 10)
    return {
        "mode": "group-restart",
        "agents": group.agents,
        "restarts": restarts,
        "down_s": down,
        **{key: percentiles(values) for key, values in results.items()},
        "election_timeout": group.election_timeout,
        "tasks_lost": len(framework.ended),
    }
