"""A task's final usage on its TaskStatus (cpu_seconds, max_rss_bytes): the wire form, frames of
peers that predate the fields, bounds; and the cgroup totals the executor reads them from."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from agora.agent.containers._cgroup_v1 import V1Cgroup
from agora.agent.containers._cgroup_v2 import V2Cgroup
from agora.agent.containers.cgroups import CgroupFs, Totals
from agora.sdk.codec import decode, encode
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)


def _frame(status: TaskStatus) -> bytes:
    update = StatusUpdate(framework_id=FrameworkID("fw"), status=status)
    frame: bytes = encode(StatusUpdateMessage(update=update))
    return frame


def _status(cpu_seconds: float | None = None, max_rss_bytes: int | None = None) -> TaskStatus:
    return TaskStatus(
        task_id=TaskID("t1"),
        state=TaskState.FINISHED,
        source=StatusSource.EXECUTOR,
        exit_code=0,
        cpu_seconds=cpu_seconds,
        max_rss_bytes=max_rss_bytes,
    )


def _decoded_status(frame: bytes) -> TaskStatus:
    message = decode(frame).message
    assert isinstance(message, StatusUpdateMessage)
    return message.update.status


def test_usage_travels_with_a_status() -> None:
    status = _status(cpu_seconds=1.25, max_rss_bytes=70 << 20)
    assert _decoded_status(_frame(status)) == status


def test_a_frame_from_a_peer_without_the_fields_decodes_with_no_usage() -> None:
    name, version, epoch, body = msgpack.unpackb(_frame(_status()), raw=False)
    status_body = body["update"]["status"]
    del status_body["cpu_seconds"], status_body["max_rss_bytes"]
    old = msgpack.packb((name, version, epoch, body), use_bin_type=True)
    status = _decoded_status(old)
    assert status.cpu_seconds is None and status.max_rss_bytes is None
    assert status.exit_code == 0


@pytest.mark.parametrize(("cpu_seconds", "max_rss_bytes"), [(-0.5, None), (2e15, None), (None, -1)])
def test_usage_out_of_bounds_is_refused(
    cpu_seconds: float | None, max_rss_bytes: int | None
) -> None:
    with pytest.raises(ProtocolError):
        _frame(_status(cpu_seconds, max_rss_bytes))


def test_v1_totals_are_cpuacct_usage_and_the_memory_high_water_mark(tmp_path: Path) -> None:
    cpuacct, memory = tmp_path / "cpuacct" / "c", tmp_path / "memory" / "c"
    cpuacct.mkdir(parents=True)
    memory.mkdir(parents=True)
    (cpuacct / "cpuacct.usage").write_text("1500000000\n")
    (memory / "memory.max_usage_in_bytes").write_text(f"{80 << 20}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{4 << 20}\n")  # now: not the peak
    dirs = {"cpuacct": str(cpuacct), "memory": str(memory)}
    cgroup = V1Cgroup("c", dirs, tuple(dirs.values()), CgroupFs())
    assert cgroup.totals() == Totals(cpu_seconds=1.5, max_rss_bytes=80 << 20)


def test_v1_totals_without_cpuacct_or_memory_are_unknown(tmp_path: Path) -> None:
    pids = tmp_path / "pids" / "c"
    pids.mkdir(parents=True)
    cgroup = V1Cgroup("c", {"pids": str(pids)}, (str(pids),), CgroupFs())
    assert cgroup.totals() == Totals(cpu_seconds=None, max_rss_bytes=None)


def test_v2_totals_read_usage_usec_and_memory_peak_only_when_present(tmp_path: Path) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    cgroup = V2Cgroup("c", {"memory": str(directory)}, (str(directory),), CgroupFs())
    assert cgroup.totals() == Totals(cpu_seconds=2.5, max_rss_bytes=None)  # kernel < 5.19
    (directory / "memory.peak").write_text(f"{96 << 20}\n")
    assert cgroup.totals() == Totals(cpu_seconds=2.5, max_rss_bytes=96 << 20)
