"""GPUs and container usage through the real agent daemon (fake master): a stand-in nvidia-smi
makes the agent advertise gpus and hand each task exactly its own, remembered across a restart
(an older agent's gpus.json too); with cgroups, the agent's PONG carries each running task's
container usage."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from agora.sdk.messages import AgentReregistered, MasterInfo, Ping, Pong, ReregisterAgent
from support.agent_daemon_kit import (
    AGENT_ID,
    EPOCH,
    FID,
    AgentProcess,
    FakeMaster,
    agent_process,
    eventually,
    run,
    scenario,
)

pytestmark = pytest.mark.timeout(90)

FAKE_SMI = """#!/bin/sh
cat <<'END'
0, GPU-aaaaaaaa-0000-0000-0000-000000000000, Stand-in GPU, 00000000:01:00.0, 16384
1, GPU-bbbbbbbb-0000-0000-0000-000000000001, Stand-in GPU, 00000000:02:00.0, 16384
END
"""


def _smi(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "nvidia-smi"
    path.parent.mkdir()
    path.write_text(FAKE_SMI)
    path.chmod(0o755)
    return path


def test_tasks_get_exactly_their_gpus(tmp_path: Path) -> None:
    smi = _smi(tmp_path)
    flags = ("--nvidia-smi", str(smi), "--isolation", "posix,gpu/nvidia")

    async def main() -> None:
        async with scenario(tmp_path, *flags) as (master, agent):
            reg = await master.register()
            assert reg.agent_info.resources.scalar("gpus") == 2
            show = 'echo "[$CUDA_VISIBLE_DEVICES]" > gpus.txt; sleep 30'
            await master.run_to_running("one", show, "cpus:0.1;mem:16;gpus:1")
            await master.run_to_running("other", show, "cpus:0.1;mem:16;gpus:1")
            await master.run_to_running("none", show, "cpus:0.1;mem:16")
            seen = {}
            for task_id in ("one", "other", "none"):
                path = agent.task_sandbox(task_id) / "gpus.txt"
                await eventually(lambda p=path: p.exists() and p.read_text().strip() != "", "gpus")
                seen[task_id] = path.read_text().strip()
            assert sorted([seen["one"], seen["other"]]) == ["[0]", "[1]"]
            assert seen["none"] == "[]"
            assert not (agent.work_dir / "gpus.json").exists()  # the checkpoint holds them

    run(main())


SHOW = 'echo "[$CUDA_VISIBLE_DEVICES]" > gpus.txt; sleep 60'


async def _shown(agent: AgentProcess, task_id: str) -> str:
    path = agent.task_sandbox(task_id) / "gpus.txt"
    await eventually(lambda: path.exists() and path.read_text().strip() != "", "gpus.txt")
    return path.read_text().strip()


async def _restarted(master: FakeMaster, agent: AgentProcess) -> None:
    """Stop ``agent`` leaving its executor running (the caller then starts it again)."""
    agent.proc.send_signal(signal.SIGTERM)
    await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")


async def _reregister(master: FakeMaster) -> None:
    assert (await master.expect(ReregisterAgent)).agent_id == AGENT_ID
    info = MasterInfo(master_id="fake", address=master.endpoint, epoch=EPOCH)
    await master.send(AgentReregistered(agent_id=AGENT_ID, master_info=info))


def test_a_restarted_agent_never_hands_out_a_gpu_a_running_task_holds(tmp_path: Path) -> None:
    flags = ("--nvidia-smi", str(_smi(tmp_path)), "--isolation", "posix,gpu/nvidia")

    async def main() -> None:
        async with scenario(tmp_path, *flags) as (master, agent):
            await master.register()
            await master.run_to_running("one", SHOW, "cpus:0.1;mem:16;gpus:1")
            assert await _shown(agent, "one") == "[0]"
            await _restarted(master, agent)
            with agent_process(tmp_path, master.endpoint, *flags) as again:
                await _reregister(master)
                await master.run_to_running("two", SHOW, "cpus:0.1;mem:16;gpus:1")
                assert await _shown(again, "two") == "[1]"

    run(main())


def test_a_restarted_agent_takes_an_older_agents_gpus_json(tmp_path: Path) -> None:
    smi = str(_smi(tmp_path))
    before = ("--nvidia-smi", smi, "--isolation", "posix")  # assigns nothing itself
    after = ("--nvidia-smi", smi, "--isolation", "posix,gpu/nvidia")

    async def main() -> None:
        async with scenario(tmp_path, *before) as (master, agent):
            await master.register()
            await master.run_to_running("old", SHOW, "cpus:0.1;mem:16;gpus:1")
            await _shown(agent, "old")
            await _restarted(master, agent)
            legacy = agent.work_dir / "gpus.json"
            legacy.write_text(json.dumps({f"{FID}/old": [0]}))
            with agent_process(tmp_path, master.endpoint, *after) as again:
                await _reregister(master)
                await master.run_to_running("new", SHOW, "cpus:0.1;mem:16;gpus:1")
                assert await _shown(again, "new") == "[1]"
                assert not legacy.exists()  # read once: the checkpoint holds it now

    run(main())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups")
def test_pong_carries_each_running_tasks_container_usage(tmp_path: Path) -> None:
    flags = ("--isolation", "posix,cgroups/cpu,cgroups/mem")

    async def main() -> None:
        async with scenario(tmp_path, *flags) as (master, _agent):
            await master.register()
            busy = "while :; do :; done"
            await master.run_to_running("u1", busy, "cpus:0.5;mem:32")

            async def usage_of_u1() -> float:
                await master.send(Ping())
                pong = await master.expect(Pong)
                mine = [u for u in pong.usage if u.task_id == "u1"]
                assert len(mine) <= 1
                if not mine:
                    return 0.0
                (usage,) = mine
                assert usage.mem_limit_bytes == 32 * 1024 * 1024
                assert usage.cpu_limit == pytest.approx(0.5)
                assert usage.rss_bytes >= 0
                return usage.cpu_seconds

            cpu = 0.0
            deadline = time.monotonic() + 20
            while cpu < 0.2 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                cpu = await usage_of_u1()
            assert cpu >= 0.2

    run(main())
