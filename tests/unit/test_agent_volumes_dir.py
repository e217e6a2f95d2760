"""agent/server/volumes.py: a persistent volume's directory is keyed by role and volume id
under the work dir (never the agent id), shows up in a sandbox as a symlink, and goes on
DESTROY."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agora.agent.server import volumes
from agora.sdk.resources import Resources


def test_create_link_keep_and_destroy(tmp_path: Path) -> None:
    work = str(tmp_path)
    volumes.create(work, "gold", "data1")
    where = tmp_path / "volumes" / "roles" / "gold" / "data1"
    assert where.is_dir()
    sandbox = tmp_path / "frameworks" / "f" / "executors" / "e" / "tasks" / "t1"
    volumes.link(work, str(sandbox), Resources.parse("cpus:1;volumes(gold):{data1}"), None)
    (sandbox / "volumes" / "data1" / "file").write_text("kept")
    assert (where / "file").read_text() == "kept"
    # A second task's sandbox sees the same data; linking again replaces an old link.
    other = tmp_path / "t2"
    for _ in range(2):
        volumes.link(work, str(other), Resources.parse("volumes(gold):{data1}"), None)
    assert (other / "volumes" / "data1" / "file").read_text() == "kept"
    volumes.create(work, "gold", "data1")  # again: the data stays
    assert (where / "file").read_text() == "kept"
    volumes.destroy(work, "gold", "data1")
    assert not where.exists()
    assert not os.path.exists(other / "volumes" / "data1" / "file")


@pytest.mark.parametrize(("role", "volume_id"), [("gold", ".."), ("a/b", "x"), ("gold", "")])
def test_paths_cannot_escape(tmp_path: Path, role: str, volume_id: str) -> None:
    with pytest.raises(ValueError, match="bad volume"):
        volumes.volume_dir(str(tmp_path), role, volume_id)
