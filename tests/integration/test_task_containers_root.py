"""Tasks in containers, through the real built-in executor (driven by a fake agent) with the
isolation an agent running as root gives it: cgroup limits, pid/mount/uts/ipc namespaces, an
image's root filesystem, network isolation. Each test leaves no cgroup and no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from agora.agent.containers.cgroups import Cgroups
from agora.agent.containers.containerizer import container_name
from agora.agent.containers.isolation import CONTAINER_CONFIG_ENV, ISOLATORS, ContainerConfig
from agora.sdk.daemon.images import ImageStore
from agora.sdk.messages import (
    ContainerInfo,
    HealthCheck,
    HealthCheckKind,
    LaunchTaskGroup,
    Reason,
    TaskGroupInfo,
    TaskState,
)
from agora.sdk.resources import Resources
from support.busybox import MARKER, busybox_rootfs
from support.executor_kit import (
    EXECUTOR_INFO,
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    run_bounded,
    task,
)
from support.executor_kit import (
    with_executor as run_with_executor,
)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: cgroups and namespaces"),
    pytest.mark.timeout(60),
]


@pytest.fixture
def config(tmp_path: Path) -> Iterator[ContainerConfig]:
    root = f"agora-test/{uuid.uuid4().hex[:12]}"
    cgroups = Cgroups.detect(root)
    if cgroups is None or not {"cpu", "memory", "pids"} <= cgroups.controllers:
        pytest.skip("needs the cpu, memory and pids cgroup controllers")
    yield ContainerConfig(
        isolators=frozenset(ISOLATORS),
        cgroups_root=root,
        cfs_quota=True,
        image_store=str(tmp_path / "images"),
    )
    assert cgroups.names() == [], "a container's cgroup was left behind"
    cgroups.cleanup_root()
    for base in cgroups.roots:  # and the shared agora-test above it, once nobody uses it
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(base))


async def with_executor(
    root: Path,
    config: ContainerConfig,
    body: Callable[[FakeAgent, ExecutorProcess], Awaitable[None]],
) -> None:
    try:
        await run_with_executor(root, body, env={CONTAINER_CONFIG_ENV: config.to_json()})
    finally:
        # What the executor did not get to destroy (it was killed): as the agent would.
        cgroups = Cgroups.detect(config.cgroups_root)
        assert cgroups is not None
        for name in cgroups.names():
            cgroup = cgroups.open(name)
            if cgroup is not None:
                cgroup.destroy()


def run(coro: Awaitable[None]) -> None:
    run_bounded(coro, timeout=50.0)


def _res(text: str) -> Resources:
    return Resources.parse(text)


def test_memory_breach_fails_the_task_and_spares_its_neighbour(
    tmp_path: Path, config: ContainerConfig
) -> None:
    hog = "python3 -c 'import time; b = b\"x\" * (128 << 20); time.sleep(30)'"

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await agent.send_launch(
            task("calm", "echo $$ > pid; exec sleep 60", resources=_res("cpus:0.2;mem:64"))
        )
        await agent.wait_state("calm", TaskState.RUNNING)
        await agent.send_launch(task("hog", hog, resources=_res("cpus:0.2;mem:64")))
        status = await agent.wait_terminal("hog", timeout=30)
        assert status.state is TaskState.FAILED
        assert status.reason is Reason.CONTAINER_LIMITATION_MEMORY
        await asyncio.sleep(0.3)  # the neighbour has had every chance to be hit
        assert agent.terminal("calm") is None
        cgroups = Cgroups.detect(config.cgroups_root)
        assert cgroups is not None
        calm = cgroups.open(container_name(FRAMEWORK_ID, "calm"))
        assert calm is not None and calm.pids(), "the neighbour's container still runs"

    run(with_executor(tmp_path, config, body))


def test_half_a_cpu_under_cfs_gets_half_a_core(tmp_path: Path, config: ContainerConfig) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await agent.send_launch(
            task("busy", "while :; do :; done", resources=_res("cpus:0.5;mem:64"))
        )
        await agent.wait_state("busy", TaskState.RUNNING)
        cgroups = Cgroups.detect(config.cgroups_root)
        assert cgroups is not None
        cgroup = cgroups.open(container_name(FRAMEWORK_ID, "busy"))
        assert cgroup is not None
        await asyncio.sleep(0.3)  # past the spawn
        cpu0, t0 = cgroup.usage().cpu_seconds, time.monotonic()
        await asyncio.sleep(3.0)
        share = (cgroup.usage().cpu_seconds - cpu0) / (time.monotonic() - t0)
        assert 0.35 <= share <= 0.65, f"{share:.2f} of a core"
        assert cgroup.usage().cpu_limit == pytest.approx(0.5)

    run(with_executor(tmp_path, config, body))


def test_ps_sees_only_the_task_and_the_hostname_is_its_own(
    tmp_path: Path, config: ContainerConfig
) -> None:
    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await agent.send_launch(task("lonely", "hostname; ps -e -o pid= -o comm="))
        assert (await agent.wait_terminal("lonely")).state is TaskState.FINISHED
        lines = (executor.task_dir("lonely") / "stdout").read_text().splitlines()
        assert lines[0] == "lonely" and lines[0] != os.uname().nodename
        procs = [line.split() for line in lines[1:]]
        # The init, the shell and ps itself (hostname came and went): nothing of the host.
        assert len(procs) == 3, procs
        assert [int(pid) for pid, _ in procs[:2]] == [1, 2] and int(procs[2][0]) < 10, procs
        assert [comm for _, comm in procs[1:]] == ["sh", "ps"]

    run(with_executor(tmp_path, config, body))


def test_a_task_with_an_image_sees_the_image_not_the_host(
    tmp_path: Path, config: ContainerConfig
) -> None:
    assert config.image_store is not None
    ImageStore(config.image_store).import_image("bb", str(busybox_rootfs(tmp_path / "rootfs")))
    script = (
        "cat /etc/agora-image; test -e /etc/debian_version || echo no-debian; "
        "pwd; echo $AGORA_SANDBOX"
    )

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await agent.send_launch(task("boxed", script, container=ContainerInfo(image="bb")))
        status = await agent.wait_terminal("boxed")
        assert status.state is TaskState.FINISHED, status.message
        out = (executor.task_dir("boxed") / "stdout").read_text().split()
        assert out == [MARKER, "no-debian", "/mnt/sandbox", "/mnt/sandbox"]

    run(with_executor(tmp_path, config, body))


def test_a_task_with_an_image_reaches_its_persistent_volume_through_its_sandbox(
    tmp_path: Path, config: ContainerConfig
) -> None:
    """The agent links a persistent volume at volumes/<id> in the task's sandbox, to a
    directory of its own: inside the image that directory is bound at its own path, so the link
    leads there and what the task writes is on the host."""
    assert config.image_store is not None
    ImageStore(config.image_store).import_image("bb", str(busybox_rootfs(tmp_path / "rootfs")))
    volume = tmp_path / "work" / "volumes" / "roles" / "gold" / "v1"
    volume.mkdir(parents=True)
    (volume / "old").write_text("kept\n")

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        links = executor.task_dir("boxed") / "volumes"
        links.mkdir(parents=True)
        (links / "v1").symlink_to(volume)
        script = "cat volumes/v1/old; echo new > volumes/v1/new"
        await agent.send_launch(task("boxed", script, container=ContainerInfo(image="bb")))
        status = await agent.wait_terminal("boxed")
        assert status.state is TaskState.FINISHED, status.message
        assert (executor.task_dir("boxed") / "stdout").read_text() == "kept\n"
        assert (volume / "new").read_text() == "new\n"

    run(with_executor(tmp_path, config, body))


def test_a_task_in_a_private_tmp_reaches_its_persistent_volume_under_tmp(
    tmp_path: Path, config: ContainerConfig
) -> None:
    """Without an image, the mount namespace gives the task a private /tmp: a volume under the
    host's /tmp (the agent's default work dir is there) stays reachable, read-write."""
    assert "mount" in config.namespaces
    volume = tmp_path / "work" / "volumes" / "roles" / "gold" / "v1"
    volume.mkdir(parents=True)
    (volume / "old").write_text("kept\n")

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        links = executor.task_dir("plain") / "volumes"
        links.mkdir(parents=True)
        (links / "v1").symlink_to(volume)
        script = "cat volumes/v1/old; echo new > volumes/v1/new; ls /tmp | wc -l"
        await agent.send_launch(task("plain", script))
        status = await agent.wait_terminal("plain")
        assert status.state is TaskState.FINISHED, status.message
        out = (executor.task_dir("plain") / "stdout").read_text().split()
        assert out[0] == "kept"
        assert (volume / "new").read_text() == "new\n"

    run(with_executor(tmp_path, config, body))


def test_an_unknown_image_fails_the_launch_clearly(tmp_path: Path, config: ContainerConfig) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await agent.send_launch(task("lost", "true", container=ContainerInfo(image="nope")))
        status = await agent.wait_terminal("lost")
        assert status.state is TaskState.FAILED
        assert "no image 'nope'" in status.message
        assert agent.states("lost") == [TaskState.FAILED]

    run(with_executor(tmp_path, config, body))


def test_network_isolation_leaves_only_loopback(tmp_path: Path, config: ContainerConfig) -> None:
    script = "cat /proc/net/dev | tail -n +3 | cut -d: -f1"

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        info = ContainerInfo(network_isolation=True)
        await agent.send_launch(task("netless", script, container=info))
        assert (await agent.wait_terminal("netless")).state is TaskState.FINISHED
        interfaces = (executor.task_dir("netless") / "stdout").read_text().split()
        assert interfaces == ["lo"]

    run(with_executor(tmp_path, config, body))


def test_a_groups_isolated_tasks_share_one_network(tmp_path: Path, config: ContainerConfig) -> None:
    show = "readlink /proc/self/ns/net; sleep 0.5"

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        info = ContainerInfo(network_isolation=True)
        group = TaskGroupInfo(
            tasks=(task("left", show, container=info), task("right", show, container=info))
        )
        assert await agent.send(
            LaunchTaskGroup(framework_id=FRAMEWORK_ID, executor=EXECUTOR_INFO, task_group=group)
        )
        for task_id in ("left", "right"):
            assert (await agent.wait_terminal(task_id)).state is TaskState.FINISHED
        left, right = (
            (executor.task_dir(t) / "stdout").read_text().strip() for t in ("left", "right")
        )
        assert left == right, "the group's tasks are in one network namespace"
        assert left != os.readlink("/proc/self/ns/net"), "and it is not the host's"

    run(with_executor(tmp_path, config, body))


def test_a_health_check_runs_inside_the_task_container_as_its_user(
    tmp_path: Path, config: ContainerConfig
) -> None:
    inside = 'test "$(hostname)" = checked && test "$(id -un)" = nobody'
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND,
        command=inside,
        delay=0.0,
        interval=0.2,
        timeout=5.0,
        grace_period=0.0,
    )

    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await agent.send_launch(task("checked", "sleep 60", user="nobody", health_check=check))
        await agent.wait_for(
            lambda: any(s.healthy is True for s in agent.statuses("checked")), timeout=20
        )

    run(with_executor(tmp_path, config, body))


def test_the_devices_cgroup_fences_off_the_gpus_a_task_was_not_given(
    tmp_path: Path, config: ContainerConfig
) -> None:
    # Two stand-in GPUs, device minors 200 and 201 (no driver: opening an allowed node fails
    # with ENXIO, a denied one with EPERM from the devices cgroup).
    gpus = replace(config, gpus=((0, 200), (1, 201)))
    cgroups = Cgroups.detect(gpus.cgroups_root, devices=True)
    if cgroups is None or "devices" not in cgroups.controllers:
        pytest.skip("needs the cgroup v1 devices controller")
    env = {"CUDA_VISIBLE_DEVICES": "0"}  # what the agent gives a task holding GPU 0

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        sandbox = executor.task_dir("gpu")
        sandbox.mkdir(parents=True)
        for minor in (200, 201):
            os.mknod(sandbox / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        script = "cat nvidia200 2>&1; cat nvidia201 2>&1; true"
        await agent.send_launch(task("gpu", script, environment=env))
        assert (await agent.wait_terminal("gpu")).state is TaskState.FINISHED
        mine, other = (sandbox / "stdout").read_text().splitlines()
        assert "No such device" in mine, mine
        assert "Operation not permitted" in other, other

    try:
        run(with_executor(tmp_path, gpus, body))
    finally:
        cgroups.cleanup_root()
        for base in cgroups.roots:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(base))
