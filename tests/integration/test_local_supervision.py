"""`agora local`'s supervision loop on small stand-in processes (fast limits, no real daemon).

What it must do: start again a child that dies (reporting the exit, the attempt and the delay),
give up on one that keeps crashing, leave an agent that stood down (exit 0) alone, and, when
stopped, cancel a pending restart and leave no process behind; and report each restart in one
line and in its log.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from pathlib import Path

from agora.sdk.cli.cluster import Child, LocalCluster
from agora.sdk.cli.local import file_logger, report_supervision
from agora.sdk.cli.restarts import RestartLimits, RestartPolicy
from agora.sdk.cli.supervision import (
    Crashed,
    GaveUp,
    Restarted,
    StoodDown,
    SupervisionEvent,
    supervise,
)
from rich.console import Console
from support.polling import until

SLEEPER = "import time; time.sleep(60)"


async def _cluster(tmp_path: Path, limits: RestartLimits, **scripts: str) -> LocalCluster:
    """A cluster whose children (named by the keywords, ``agent_1`` → ``agent-1``) run the
    given Python one-liners."""
    cluster = LocalCluster(tmp_path, agents=1, restart_limits=limits)
    cluster.logs.mkdir(parents=True, exist_ok=True)
    for key, script in scripts.items():
        name = key.replace("_", "-")
        child = Child(
            name,
            [sys.executable, "-c", script],
            cluster.logs / f"{name}.log",
            policy=RestartPolicy(limits),
        )
        await cluster.relaunch(child)
        cluster.children.append(child)
    return cluster


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_child_that_keeps_crashing_is_restarted_then_given_up_on(tmp_path: Path) -> None:
    limits = RestartLimits(first_delay=0.01, max_delay=0.02, max_crashes=3)

    async def go() -> tuple[GaveUp, list[SupervisionEvent], LocalCluster]:
        cluster = await _cluster(tmp_path, limits, master="raise SystemExit(3)")
        events: list[SupervisionEvent] = []
        async with asyncio.timeout(20):
            gave_up = await supervise(cluster, events.append)
            await cluster.stop(asyncio.Event())
        return gave_up, events, cluster

    gave_up, events, cluster = asyncio.run(go())
    (master,) = cluster.children
    assert (gave_up.child, gave_up.crashes, gave_up.status) == (master, 3, "exited with status 3")
    assert [type(e) for e in events] == [Crashed, Restarted, Crashed, Restarted, GaveUp]
    crashes = [e for e in events if isinstance(e, Crashed)]
    assert [(c.attempt, c.delay, c.status) for c in crashes] == [
        (1, 0.01, "exited with status 3"),
        (2, 0.02, "exited with status 3"),
    ]
    assert master.restarts == 2


def test_a_killed_child_is_restarted_and_stop_leaves_nothing(tmp_path: Path) -> None:
    limits = RestartLimits(first_delay=0.01)

    async def go() -> tuple[list[SupervisionEvent], list[int]]:
        cluster = await _cluster(tmp_path, limits, master=SLEEPER, agent_1="pass")
        master, agent = cluster.children
        assert master.proc is not None
        first = master.proc.pid
        events: list[SupervisionEvent] = []
        task = asyncio.ensure_future(supervise(cluster, events.append))
        try:
            # The agent exits 0 on its own: it stood down, and is not started again.
            await until(lambda: any(isinstance(e, StoodDown) for e in events), 10, "stood down")
            os.kill(first, signal.SIGKILL)
            await until(lambda: any(isinstance(e, Restarted) for e in events), 10, "restart")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert master.proc.pid != first and master.running
        pids = [first, master.proc.pid]
        async with asyncio.timeout(20):
            await cluster.stop(asyncio.Event())
        assert agent.restarts == 0
        return events, pids

    events, pids = asyncio.run(go())
    crashed = next(e for e in events if isinstance(e, Crashed))
    assert (crashed.child.name, crashed.status, crashed.attempt) == (
        "master",
        "was killed by signal 9",
        1,
    )
    assert [e.child.name for e in events if isinstance(e, StoodDown)] == ["agent-1"]
    assert not any(_alive(pid) for pid in pids)


def test_stopping_cancels_a_pending_restart(tmp_path: Path) -> None:
    limits = RestartLimits(first_delay=30.0, max_delay=30.0)

    async def go() -> tuple[list[SupervisionEvent], Child]:
        cluster = await _cluster(tmp_path, limits, master="raise SystemExit(1)")
        events: list[SupervisionEvent] = []
        task = asyncio.ensure_future(supervise(cluster, events.append))
        await until(lambda: bool(events), 10, "the crash")
        task.cancel()
        async with asyncio.timeout(5):  # not the 30 s restart delay
            await asyncio.gather(task, return_exceptions=True)
            await cluster.stop(asyncio.Event())
        return events, cluster.children[0]

    events, master = asyncio.run(go())
    assert [type(e) for e in events] == [Crashed]
    assert master.restarts == 0 and not master.running


def test_each_restart_is_one_line_on_stderr_and_every_event_is_in_the_log(tmp_path: Path) -> None:
    """What `agora local` prints and logs of the events above (a crash loop given up on)."""
    limits = RestartLimits(first_delay=0.01, max_delay=0.01, max_crashes=2)
    out = io.StringIO()
    console = Console(file=out, width=400, soft_wrap=True, highlight=False)

    async def go() -> None:
        cluster = await _cluster(tmp_path, limits, master="print('bad flag'); raise SystemExit(2)")
        with open(tmp_path / "local.log", "w", encoding="utf-8") as log_file:
            log = file_logger(log_file)
            async with asyncio.timeout(20):
                await supervise(cluster, lambda e: report_supervision(e, console, log))
                await cluster.stop(asyncio.Event())

    asyncio.run(go())
    master_log = tmp_path / "logs" / "master.log"
    lines = out.getvalue().splitlines()
    assert lines[:2] == [
        "agora local: master exited with status 2; restarting it in 0.01 s "
        f"(attempt 1; log: {master_log})",
        "agora local: master crashed 2 times within 60 s (the last: exited with status 2); "
        f"giving up, stopping the cluster (log: {master_log})",
    ]
    assert "bad flag" in lines[2:]  # the last lines of its log follow
    log = (tmp_path / "local.log").read_text().splitlines()
    assert [line.split("event=")[1].split()[0] for line in log] == [
        "'daemon_restarting'",
        "'daemon_restarted'",
        "'daemon_gave_up'",
    ]
    assert "daemon='master' status='exited with status 2' attempt=1 delay=0.01" in log[0]
