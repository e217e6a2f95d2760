"""The kill grace period in containers, through the real built-in executor (fake agent): with a
pid namespace (the container's init passes the SIGTERM on and waits for every process of the
container) and with cgroups alone (the task's process group, as with posix isolation). Each
test leaves no cgroup and no process behind (see support/grace_kit.py for the scenarios)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.cgroups import Cgroups
from agora.agent.containers.isolation import CONTAINER_CONFIG_ENV, ContainerConfig
from support import grace_kit
from support.executor_kit import ExecutorProcess, FakeAgent, run_bounded, with_executor

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups and namespaces"),
    pytest.mark.timeout(60),
]

CGROUPS = frozenset({"posix", "cgroups/cpu", "cgroups/mem", "cgroups/pids"})
NAMESPACES = frozenset({"namespaces/pid", "namespaces/mount", "namespaces/ipc"})


@pytest.fixture(params=["pid-namespace", "cgroups-only"])
def config(request: pytest.FixtureRequest) -> Iterator[ContainerConfig]:
    root = f"agora-test/{uuid.uuid4().hex[:12]}"
    cgroups = Cgroups.detect(root)
    if cgroups is None or not {"cpu", "memory", "pids"} <= cgroups.controllers:
        pytest.skip("needs the cpu, memory and pids cgroup controllers")
    isolators = CGROUPS | NAMESPACES if request.param == "pid-namespace" else CGROUPS
    try:
        yield ContainerConfig(isolators=isolators, cgroups_root=root)
    finally:
        left = cgroups.names()
        for name in left:  # what a failed test's executor did not destroy
            cgroup = cgroups.open(name)
            if cgroup is not None:
                cgroup.destroy()
        cgroups.cleanup_root()
        for base in cgroups.roots:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(base))
    assert left == [], "a container's cgroup was left behind"


def test_every_grace_scenario_in_a_container(tmp_path: Path, config: ContainerConfig) -> None:
    init = "pid" in config.namespaces

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await grace_kit.all_scenarios(agent, executor, init=init)

    env = {CONTAINER_CONFIG_ENV: config.to_json()}
    run_bounded(with_executor(tmp_path, body, env=env), timeout=50)
