"""``agora local`` keeps its daemons running: a daemon that dies is started again.

A master, an agent or the batch service that dies is started again on the same work dir and
ports, after a delay that backs off (:mod:`agora.sdk.cli.restarts`); its peers and the address
files stay valid. An agent or the batch service that exits with status 0 on its own stood down (an
operator marked the agent gone: the master told it to stop) and is not started again; masters
always are. :func:`supervise` runs until a daemon crashes too often, and returns that one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agora.sdk.cli.cluster import BATCH, Child, LocalCluster
from agora.sdk.cli.restarts import GiveUp, Restart

__all__ = ["Crashed", "GaveUp", "Restarted", "StoodDown", "SupervisionEvent", "supervise"]


@dataclass(frozen=True, slots=True)
class Crashed:
    """``child`` died (``status``: how) and starts again in ``delay`` seconds."""

    child: Child
    status: str
    attempt: int
    delay: float


@dataclass(frozen=True, slots=True)
class Restarted:
    """``child`` runs again, as ``pid``."""

    child: Child
    pid: int


@dataclass(frozen=True, slots=True)
class StoodDown:
    """``child`` exited with status 0 on its own and is not started again."""

    child: Child


@dataclass(frozen=True, slots=True)
class GaveUp:
    """``child`` crashed ``crashes`` times within ``window`` seconds (the last: ``status``)."""

    child: Child
    status: str
    crashes: int
    window: float


SupervisionEvent = Crashed | Restarted | StoodDown | GaveUp


async def supervise(cluster: LocalCluster, report: Callable[[SupervisionEvent], None]) -> GaveUp:
    """Start again each child of ``cluster`` that dies, telling ``report`` of each exit and
    restart, until one crashes too often: that one's :class:`GaveUp` (also reported).

    Runs until then or until cancelled; on cancellation, waits still pending are cancelled (a
    start already under way is left to :meth:`LocalCluster.stop`, which waits for it).
    """
    loop = asyncio.get_running_loop()
    watched: dict[asyncio.Future[Any], Child] = {
        c.waiter: c for c in cluster.children if c.waiter is not None
    }
    try:
        while True:
            if not watched:  # every daemon stood down: nothing left to do but be stopped
                await asyncio.Event().wait()
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                child = watched.pop(fut)
                if fut is not child.waiter:  # a delayed restart: it started, or could not
                    if (error := fut.exception()) is None:
                        assert child.proc is not None and child.waiter is not None
                        child.restarts += 1
                        report(Restarted(child, child.proc.pid))
                        watched[child.waiter] = child  # (already done: seen next round)
                        continue
                    status = f"could not be started again ({error})"
                elif _stood_down(cluster, child):
                    report(StoodDown(child))
                    continue
                else:
                    status = child.exit_status()
                decision = child.policy.crashed(loop.time())
                if isinstance(decision, GiveUp):
                    gave_up = GaveUp(child, status, decision.crashes, decision.window)
                    report(gave_up)
                    return gave_up
                report(Crashed(child, status, decision.attempt, decision.delay))
                watched[asyncio.ensure_future(_restart(cluster, child, decision))] = child
    finally:
        pending = [f for f, c in watched.items() if f is not c.waiter]
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _restart(cluster: LocalCluster, child: Child, decision: Restart) -> None:
    """After the policy's delay, start ``child`` again (ClusterError when it cannot start)."""
    await asyncio.sleep(decision.delay)
    await cluster.relaunch(child)


def _stood_down(cluster: LocalCluster, child: Child) -> bool:
    """An agent or the batch service that exited with status 0 on its own."""
    return (
        child.proc is not None
        and child.proc.returncode == 0
        and (child.name == BATCH or child.name in cluster.agent_names)
    )
