"""A custom executor in a container of its own (agent daemon, fake master): a cgroup whose memory
limit covers the executor's resources and its tasks', and its own pid namespace. Draining the
agent removes the container."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from agora.agent.containers.containerizer import container_name
from agora.sdk.ids import ExecutorID, TaskID
from agora.sdk.messages import (
    CommandInfo,
    ExecutorInfo,
    Reason,
    ReregisterAgent,
    RunTask,
    ShutdownExecutor,
    TaskInfo,
    TaskState,
)
from agora.sdk.resources import Resources
from support.agent_daemon_kit import (
    AGENT_ID,
    FID,
    FRAMEWORK,
    agent_process,
    eventually,
    read_pid,
    run,
    scenario,
)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups and namespaces"),
    pytest.mark.timeout(90),
]

ISOLATION = "posix,cgroups/cpu,cgroups/mem,namespaces/pid,namespaces/mount"


def _run_on_custom_executor(script: str) -> RunTask:
    executor = ExecutorInfo(
        executor_id=ExecutorID("boxed"),
        framework_id=FID,
        command=CommandInfo(value=script),
        resources=Resources.parse("cpus:0.1;mem:32"),
    )
    task = TaskInfo(
        task_id=TaskID("x1"),
        name="x1",
        agent_id=AGENT_ID,
        resources=Resources.parse("cpus:0.2;mem:64"),
        executor=executor,
    )
    return RunTask(framework_info=FRAMEWORK, framework_id=FID, task=task)


def test_a_custom_executor_runs_in_its_own_container(tmp_path: Path) -> None:
    script = "cat /proc/self/cgroup > cgroup.txt; echo $$ > inner.pid; exec sleep 1000"

    async def main() -> None:
        async with scenario(tmp_path, "--isolation", ISOLATION) as (master, agent):
            await master.register()
            await master.send(_run_on_custom_executor(script))
            sandbox = agent.sandbox("boxed")
            assert await read_pid(sandbox / "inner.pid") == 2  # the init is pid 1
            name = container_name(FID, "executor", "boxed")
            memory = [
                line.split(":", 2)[2]
                for line in (sandbox / "cgroup.txt").read_text().splitlines()
                if line.split(":")[1] == "memory"
            ]
            assert memory and memory[0].endswith(f"/{name}")
            limit = Path(f"/sys/fs/cgroup/memory{memory[0]}/memory.limit_in_bytes")
            assert int(limit.read_text()) == (32 + 64) * 1024 * 1024
            agent.proc.send_signal(signal.SIGUSR1)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to drain")
            assert not limit.parent.exists(), "the executor's container outlived the agent"

    run(main())


def _cgroup_dirs(name: str) -> list[Path]:
    return [p for p in Path("/sys/fs/cgroup").glob(f"**/{name}") if p.is_dir()]


def test_a_restarted_agent_adopts_a_contained_executor(tmp_path: Path) -> None:
    script = "echo $$ > inner.pid; exec sleep 1000"

    async def main() -> None:
        async with scenario(tmp_path, "--isolation", ISOLATION) as (master, agent):
            await master.register()
            await master.send(_run_on_custom_executor(script))
            await read_pid(agent.sandbox("boxed") / "inner.pid")
            agent.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: agent.proc.poll() is not None, "the agent to exit")
            name = container_name(FID, "executor", "boxed")
            with agent_process(tmp_path, master.endpoint, "--isolation", ISOLATION) as again:
                rereg = await master.expect(ReregisterAgent)  # (the fake master learns its peer)
                assert rereg.agent_id == AGENT_ID
                await eventually(lambda: "executor_adopted" in again.log(), "the adoption")
                assert '"executors_alive": 1' in again.log()
                mine = _cgroup_dirs(name)
                assert mine, "the executor's container is still there"
                # Ours again: when the executor goes, its container goes with it.
                await master.send(
                    ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("boxed"))
                )
                await eventually(lambda: not any(p.exists() for p in mine), "the container to go")

    run(main())


def test_an_executor_over_its_memory_fails_its_tasks_with_the_limit(tmp_path: Path) -> None:
    hog = "exec python3 -c 'import time; b = b\"x\" * (256 << 20); time.sleep(30)'"

    async def main() -> None:
        async with scenario(tmp_path, "--isolation", ISOLATION) as (master, _agent):
            await master.register()
            await master.send(_run_on_custom_executor(hog))
            failed = await master.update("x1", TaskState.FAILED)
            assert failed.reason is Reason.CONTAINER_LIMITATION_MEMORY

    run(main())
