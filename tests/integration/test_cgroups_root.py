"""The cgroup library against the real kernel (cgroup v1 on the test machine; v2 where that is
the only hierarchy): limits hold, usage is measured, destroy leaves nothing. Needs root."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from agora.agent.containers.cgroups import Cgroup, CgroupError, Cgroups, Limits
from support.polling import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates cgroups")

MiB = 1 << 20


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    found = Cgroups.detect(f"agora-test-{uuid.uuid4().hex[:8]}")
    if found is None:
        pytest.skip("no writable cgroup hierarchy")
    try:
        yield found
    finally:
        for name in found.names():
            cg = found.open(name)
            assert cg is not None
            cg.destroy()
        found.cleanup_root()
    assert not any(os.path.exists(root) for root in found.roots)


@pytest.fixture
def spawn() -> Iterator[Callable[[Cgroup, str], subprocess.Popen[str]]]:
    """Start ``python -c code`` that puts itself into a cgroup before exec."""
    children: list[subprocess.Popen[str]] = []

    def start(cg: Cgroup, code: str) -> subprocess.Popen[str]:
        files = cg.procs_files()

        def enter() -> None:
            pid = str(os.getpid()).encode()
            for path in files:
                fd = os.open(path, os.O_WRONLY)
                os.write(fd, pid)
                os.close(fd)

        child = subprocess.Popen(
            [sys.executable, "-c", code], preexec_fn=enter, stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(5)
        assert child.stdout is not None
        child.stdout.close()


def test_memory_limit_oom_kills_the_offender_and_spares_its_sibling(
    cgroups: Cgroups, spawn: Callable[[Cgroup, str], subprocess.Popen[str]]
) -> None:
    hog_cg = cgroups.create("hog", Limits(mem_bytes=64 * MiB))
    calm_cg = cgroups.create("calm", Limits(mem_bytes=64 * MiB))
    calm = spawn(
        calm_cg, "import time; b = b'x' * (16 << 20); print('ready', flush=True); time.sleep(60)"
    )
    assert calm.stdout is not None and calm.stdout.readline() == "ready\n"
    hog = spawn(hog_cg, "b = b'x' * (128 << 20); print('survived', flush=True)")

    assert hog.wait(15) == -signal.SIGKILL
    assert hog_cg.oom_killed()
    assert hog_cg.usage().oom_kills >= 1
    assert calm.poll() is None
    assert not calm_cg.oom_killed()
    calm_usage = calm_cg.usage()
    assert calm_usage.mem_limit_bytes == 64 * MiB
    assert 16 * MiB <= calm_usage.rss_bytes < 64 * MiB


def test_cfs_quota_holds_a_busy_loop_to_half_a_core(
    cgroups: Cgroups, spawn: Callable[[Cgroup, str], subprocess.Popen[str]]
) -> None:
    cg = cgroups.create("busy", Limits(cpus=0.5, cfs_quota=True))
    assert cg.usage().cpu_limit == pytest.approx(0.5)
    started = time.monotonic()
    busy = spawn(cg, "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end: pass")
    assert busy.wait(15) == 0
    wall = time.monotonic() - started
    share = cg.usage().cpu_seconds / wall
    assert 0.35 <= share <= 0.65, f"used {share:.2f} of a core"


def test_pids_max_stops_a_fork_loop(
    cgroups: Cgroups, spawn: Callable[[Cgroup, str], subprocess.Popen[str]]
) -> None:
    cg = cgroups.create("forky", Limits(pids_max=5))
    code = (
        "import os, time\n"
        "forked = 0\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    forked += 1\n"
        "print(forked, flush=True)\n"
        "time.sleep(60)\n"
    )
    forky = spawn(cg, code)
    assert forky.stdout is not None
    assert forky.stdout.readline() == "4\n"
    assert len(cg.pids()) == 5
    cg.destroy()
    assert forky.wait(5) == -signal.SIGKILL


def test_destroy_kills_a_process_tree_and_removes_every_directory(
    cgroups: Cgroups, spawn: Callable[[Cgroup, str], subprocess.Popen[str]]
) -> None:
    cg = cgroups.create("tree", Limits(cpus=1, mem_bytes=256 * MiB, pids_max=50))
    code = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen(['sleep', '60']) for _ in range(3)]\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = spawn(cg, code)
    assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
    members = cg.pids()
    assert len(members) == 4

    cg.destroy()

    assert parent.wait(5) == -signal.SIGKILL
    for pid in members:
        wait_for(lambda pid=pid: not _alive(pid), timeout=5, what=f"pid {pid} gone")
    assert cgroups.names() == []
    assert cgroups.open("tree") is None
    assert not any(os.path.exists(os.path.dirname(p)) for p in cg.procs_files())
    cg.destroy()  # idempotent


def test_update_grows_and_shrinks_the_memory_limit(cgroups: Cgroups) -> None:
    cg = cgroups.create("grow", Limits(mem_bytes=64 * MiB, pids_max=10))
    cg.update(Limits(mem_bytes=256 * MiB, pids_max=10))
    assert cg.usage().mem_limit_bytes == 256 * MiB
    cg.update(Limits(mem_bytes=32 * MiB))
    assert cg.usage().mem_limit_bytes == 32 * MiB
    cg.update(Limits())
    assert cg.usage().mem_limit_bytes == 0


def test_a_rejected_limit_fails_loudly_and_leaves_nothing(cgroups: Cgroups) -> None:
    with pytest.raises(CgroupError) as failure:
        cgroups.create("huge", Limits(cpus=1e9, cfs_quota=True))
    assert failure.value.errno == errno.EINVAL
    assert failure.value.path is not None and failure.value.path.endswith("cfs_quota_us")
    assert cgroups.names() == []


def test_open_finds_an_existing_cgroup_after_a_restart(cgroups: Cgroups) -> None:
    cgroups.create("kept", Limits(pids_max=7))
    again = Cgroups.detect(os.path.basename(cgroups.roots[0]))
    assert again is not None and again.names() == ["kept"]
    kept = again.open("kept")
    assert kept is not None and kept.pids() == []
    with pytest.raises(CgroupError):
        again.create("kept", Limits())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
