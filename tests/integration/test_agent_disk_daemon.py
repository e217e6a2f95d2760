"""The real agent daemon's disk/du isolator and sandbox garbage collection, against a fake master.

Short intervals (0.2 s) stand in for Mesos's 15 s and 1 min; every wait polls with a deadline and
every process is killed on the way out (support.agent_daemon_kit).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from agora.agent.core.limits import MIB
from agora.sdk.messages import Ping, Pong, Reason, StatusUpdateMessage, TaskState
from support.agent_daemon_kit import FID, WAIT, eventually, run, scenario, wait_for_executor

pytestmark = pytest.mark.timeout(90)

THREE_MB = "head -c 3145728 /dev/zero > blob"


@pytest.fixture(scope="module", autouse=True)
def _command_executor() -> None:
    wait_for_executor()


def _updates_of(seen: list[object], task_id: str) -> list[TaskState]:
    return [
        m.update.status.state
        for m in seen
        if isinstance(m, StatusUpdateMessage) and m.update.status.task_id == task_id
    ]


def test_a_task_over_its_disk_fails_with_container_limitation_disk(tmp_path: Path) -> None:
    async def main() -> None:
        interval = ("--container-disk-watermark-interval", "0.2")
        async with scenario(tmp_path, *interval) as (master, agent):
            await master.register()
            # Within its disk: it writes 3 MB of its 10 and is left alone.
            await master.run_to_running(
                "fits", f"{THREE_MB}; touch written; exec sleep 1000", "cpus:0.1;mem:32;disk:10"
            )
            written = agent.task_sandbox("fits") / "written"
            await eventually(written.exists, "the task within its disk to write")
            await master.run_to_running(
                "big", f"{THREE_MB}; exec sleep 1000", "cpus:0.1;mem:32;disk:1"
            )
            failed = await master.update("big", TaskState.FAILED)
            assert failed.reason == Reason.CONTAINER_LIMITATION_DISK
            assert re.fullmatch(
                r"Disk usage \(3\.\d MB\) exceeds quota \(1\.0 MB\)", failed.message
            ), failed.message
            await master.ack(failed)
            # The pass that caught "big" measured "fits" with its 3 MB too: it still runs.
            assert _updates_of(master.seen, "fits") == [TaskState.RUNNING]
            assert "container_disk_limit_exceeded" in agent.log()

    run(main())


def test_no_enforcement_only_measures(tmp_path: Path) -> None:
    async def main() -> None:
        flags = ("--container-disk-watermark-interval", "0.2", "--no-enforce-container-disk-quota")
        async with scenario(tmp_path, *flags) as (master, agent):
            await master.register()
            await master.run_to_running(
                "big", f"{THREE_MB}; exec sleep 1000", "cpus:0.1;mem:32;disk:1"
            )
            await eventually(
                lambda: (
                    '"enforced": false' in agent.log()
                    and "container_disk_limit_exceeded" in agent.log()
                ),
                "the agent to see the task over its disk",
            )
            assert _updates_of(master.seen + master.backlog, "big") == [TaskState.RUNNING]
            # The sizes ride on the heartbeat's container usage.
            deadline = time.monotonic() + WAIT
            while True:
                await master.send(Ping())
                pong = await master.expect(Pong)
                usage = [u for u in pong.usage if u.task_id == "big"]
                if usage and usage[0].disk_used_bytes >= 3 * MIB:
                    break
                assert time.monotonic() < deadline, pong
                await asyncio.sleep(0.05)
            assert usage[0].disk_limit_bytes == MIB

    run(main())


def _read(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_old_sandboxes_are_collected_and_live_ones_kept(tmp_path: Path) -> None:
    # A sandbox an earlier agent run left: scheduled from its mtime, long past.
    stale = tmp_path / "work" / "frameworks" / "old-fw" / "executors" / "old-ex"
    (stale / "tasks" / "old-task").mkdir(parents=True)
    (stale / "tasks" / "old-task" / "stdout").write_text("old\n")
    for path in (stale / "tasks" / "old-task" / "stdout", stale / "tasks" / "old-task", stale):
        os.utime(path, (1_000_000, 1_000_000))

    async def main() -> None:
        flags = ("--gc-delay", "2", "--disk-watermark-interval", "0.2")
        async with scenario(tmp_path, *flags) as (master, agent):
            reg = await master.register()
            await eventually(lambda: not stale.exists(), "the stale sandbox to be collected", 10)
            assert not (tmp_path / "work" / "frameworks" / "old-fw").exists()
            # A live task, then one that finishes beside it in the same executor.
            await master.run_to_running("live", "echo live; exec sleep 1000")
            await master.run_to_running("done", "echo done")
            finished = await master.update("done", TaskState.FINISHED)
            await master.ack(finished)
            done = agent.task_sandbox("done")
            assert (done / "stdout").read_text() == "done\n"
            await eventually(lambda: not done.exists(), "the finished task's sandbox to go", 15)
            # Several passes have seen the live task and its executor: both are kept.
            assert (agent.task_sandbox("live") / "stdout").read_text() == "live\n"
            assert (agent.sandbox() / "executor.pid").exists()
            collected = (tmp_path / "work" / "sandbox-gc" / "collected").read_text()
            assert f"\t{FID}\tagora-command\tdone\n" in collected
            assert "\told-fw\told-ex\told-task\n" in collected
            # The HTTP API says the output was collected (410), not that it is unknown.
            base = f"http://127.0.0.1:{reg.agent_info.http_port}/files/read"
            status, body = await asyncio.to_thread(_read, f"{base}?task=done")
            assert status == 410, body
            assert "garbage-collected" in str(body["error"])
            status, body = await asyncio.to_thread(_read, f"{base}?task=live")
            assert (status, body["data"]) == (200, "live\n")
            status, _ = await asyncio.to_thread(_read, f"{base}?task=never-ran")
            assert status == 404

    run(main())
