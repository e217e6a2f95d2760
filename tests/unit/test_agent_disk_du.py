"""The disk/du isolator's measuring (a du-like walk) and its usage report."""

from __future__ import annotations

import os
from pathlib import Path

from agora.agent.core import Agent, AgentConfig
from agora.agent.server.disk_du import DiskIsolator, DiskUse, sandbox_size
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import ContainerUsage
from agora.sdk.resources import Resources

MB = 1 << 20


def _blocks(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def test_counts_allocated_blocks_once_and_follows_no_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"\1" * (4 * MB))
    sandbox = tmp_path / "sandbox"
    (sandbox / "sub").mkdir(parents=True)
    (sandbox / "sub" / "data").write_bytes(b"\1" * MB)
    os.link(sandbox / "sub" / "data", sandbox / "hardlink")  # the same blocks again
    (sandbox / "link").symlink_to(outside)
    (sandbox / "dirlink").symlink_to(tmp_path)
    with open(sandbox / "sparse", "wb") as f:
        f.truncate(100 * MB)  # a size, not disk
    size, complete = sandbox_size(str(sandbox))
    assert complete
    counted = [sandbox, sandbox / "sub", sandbox / "sub" / "data", sandbox / "link"]
    counted += [sandbox / "dirlink", sandbox / "sparse"]
    expected = sum(_blocks(p) for p in counted)
    assert size == expected
    assert MB <= size < 2 * MB


def test_a_missing_sandbox_is_empty_and_the_walk_is_bounded(tmp_path: Path) -> None:
    assert sandbox_size(str(tmp_path / "none")) == (0, True)
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"x" * 4096)
    size, complete = sandbox_size(str(tmp_path), max_entries=10)
    assert not complete
    assert 0 < size < sum(_blocks(tmp_path / f"f{i}") for i in range(50))


def test_sizes_ride_on_the_usage_report() -> None:
    fid, eid = FrameworkID("f"), ExecutorID("agora-command")
    core = Agent(AgentConfig(hostname="h", resources=Resources()))
    isolator = DiskIsolator("/nonexistent", 15.0, True, lambda: core, lambda _: None)
    isolator.latest = {
        (fid, eid, TaskID("a")): DiskUse(3 * MB, MB, True, 10.0),
        (fid, eid, TaskID("b")): DiskUse(5, 0, True, 10.0),
    }
    sampled = ContainerUsage(framework_id=fid, executor_id=eid, task_id=TaskID("a"), rss_bytes=7)
    out = {u.task_id: u for u in isolator.annotate((sampled,))}
    assert (out["a"].rss_bytes, out["a"].disk_used_bytes, out["a"].disk_limit_bytes) == (
        7,
        3 * MB,
        MB,
    )
    assert (out["b"].disk_used_bytes, out["b"].disk_limit_bytes, out["b"].timestamp) == (5, 0, 10.0)
