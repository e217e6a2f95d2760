"""The cgroup library against fake v1 and v2 trees in tmp_path: a small fake kernel makes the
files mkdir would, checks what writes the kernel would refuse, and records kills."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from agora.agent.containers.cgroups import Cgroup, CgroupError, CgroupFs, Cgroups, Limits, Usage

UNLIMITED = "9223372036854771712"
MiB = 1 << 20
V1_FILES = {
    "cpu": {"cpu.shares": "1024", "cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"},
    "cpuacct": {"cpuacct.usage": "0"},
    "memory": {
        "memory.limit_in_bytes": UNLIMITED,
        "memory.memsw.limit_in_bytes": UNLIMITED,
        "memory.usage_in_bytes": "0",
        "memory.stat": "cache 0\nrss 0\ntotal_rss 0\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    },
    "pids": {"pids.max": "max", "pids.current": "0"},
    "freezer": {"freezer.state": "THAWED"},
}
V2_FILES = {
    "": {"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.freeze": "0", "cgroup.kill": "",
         "cgroup.events": "populated 0\nfrozen 0\n", "cpu.stat": "usage_usec 0\n"},
    "cpu": {"cpu.weight": "100", "cpu.max": "max 100000"},
    "memory": {"memory.max": "max", "memory.swap.max": "max", "memory.current": "0",
               "memory.stat": "anon 0\nfile 0\n", "memory.events": "oom 0\noom_kill 0\n"},
    "pids": {"pids.max": "max"},
}  # fmt: skip


class FakeKernel(CgroupFs):
    def __init__(self, mounts: dict[Path, set[str]] | None = None, top: Path | None = None) -> None:
        self.mounts = mounts or {}  # v1 mountpoint -> controllers; empty: v2 mounted at top
        self.top = top or Path("/nonexistent")
        self.absent: set[str] = set()  # files the kernel does not offer
        self.refuse: dict[str, int] = {}  # file name -> errno of a refused write
        self.immortal: set[int] = set()
        self.kills: list[tuple[int, int]] = []
        self.writes: list[tuple[str, str]] = []
        self.deny_mkdir = False

    def mkdir(self, path: str) -> None:
        if self.deny_mkdir:
            raise PermissionError(errno.EACCES, "denied", path)
        os.mkdir(path)
        files = {"cgroup.procs": ""}
        if self.mounts:
            for mount, controllers in self.mounts.items():
                if Path(path).is_relative_to(mount):
                    for controller in controllers:
                        files.update(V1_FILES[controller])
        else:
            enabled = Path(path, "..", "cgroup.subtree_control").read_text().split()
            files.update(V2_FILES[""])
            files["cgroup.controllers"] = " ".join(enabled)
            for controller in enabled:
                files.update(V2_FILES[controller])
        for name, text in files.items():
            if name not in self.absent:
                Path(path, name).write_text(text)

    def rmdir(self, path: str) -> None:
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "gone", path)
        if any(p.is_dir() for p in Path(path).iterdir()) or _procs(Path(path)):
            raise OSError(errno.EBUSY, "busy", path)
        shutil.rmtree(path)

    def kill(self, pid: int, sig: int) -> None:
        self.kills.append((pid, sig))
        if pid in self.immortal:
            return
        for mount in self.mounts or [self.top]:
            for procs in Path(mount).rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in _procs(procs.parent) if p != pid))

    def write(self, path: str, data: bytes) -> None:
        p, text = Path(path), data.decode()
        self.writes.append((p.name, text))
        if p.name in self.refuse:
            raise OSError(self.refuse[p.name], os.strerror(self.refuse[p.name]), path)
        if not p.exists() or p.name in self.absent:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if p.name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            text = UNLIMITED if text == "-1" else text
            limit = p.with_name("memory.limit_in_bytes")
            memsw = p.with_name("memory.memsw.limit_in_bytes")
            new_limit = int(text if p == limit else limit.read_text())
            if memsw.exists() and new_limit > int(text if p == memsw else memsw.read_text()):
                raise OSError(errno.EINVAL, "limit above memsw limit", path)
        if p.name == "cgroup.subtree_control":
            text = self._subtree(p, text)
        if p.name == "cgroup.freeze":
            p.with_name("cgroup.events").write_text(f"populated 1\nfrozen {text}\n")
        if p.name == "cgroup.kill":
            for pid in _procs(p.parent):
                self.kill(pid, 9)
            return
        p.write_text(text)

    def _subtree(self, p: Path, text: str) -> str:
        allowed = set(p.with_name("cgroup.controllers").read_text().split())
        enabled = set(p.read_text().split())
        if _procs(p.parent) and p.parent != self.top:
            raise OSError(errno.EBUSY, "no internal processes", str(p))
        for word in text.split():
            if word[1:] not in allowed:
                raise OSError(errno.ENOENT, "not available", str(p))
            (enabled.add if word[0] == "+" else enabled.discard)(word[1:])
        return " ".join(sorted(enabled))


def _procs(directory: Path) -> list[int]:
    path = directory / "cgroup.procs"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _proc(tmp_path: Path, mounts: list[str], own: list[str]) -> Path:
    self_dir = tmp_path / "proc" / "self"
    self_dir.mkdir(parents=True)
    (self_dir / "mounts").write_text("".join(f"{m} 0 0\n" for m in mounts))
    (self_dir / "cgroup").write_text("".join(f"{line}\n" for line in own))
    return tmp_path / "proc"


def v1_tree(tmp_path: Path, *, comount: bool = True) -> tuple[Cgroups, FakeKernel, Path]:
    sys_dir = tmp_path / "sys"
    cpu_mounts = (
        {"cpu,cpuacct": {"cpu", "cpuacct"}} if comount else {"cpu": {"cpu"}, "cpuacct": {"cpuacct"}}
    )
    hierarchies = {**cpu_mounts, "memory": {"memory"}, "pids": {"pids"}, "freezer": {"freezer"}}
    own = {"memory": "/process_api/abc", "pids": "/user.slice"}
    kernel = FakeKernel({sys_dir / name: ctrls for name, ctrls in hierarchies.items()})
    mounts, lines = [f"tmpfs {sys_dir} tmpfs rw"], []
    for n, (name, controllers) in enumerate(hierarchies.items(), 1):
        (sys_dir / name / own.get(name, "/").lstrip("/")).mkdir(parents=True)
        mounts.append(f"cgroup {sys_dir / name} cgroup rw,nosuid,{','.join(sorted(controllers))}")
        lines.append(f"{n}:{','.join(sorted(controllers))}:{own.get(name, '/')}")
    mounts.append(f"cgroup2 {sys_dir}/unified cgroup2 rw")
    proc = _proc(tmp_path, mounts, [*lines, "0::/"])
    found = Cgroups.detect("agora", proc=str(proc), sysfs=str(sys_dir), fs=kernel)
    assert found is not None
    return found, kernel, sys_dir


def v2_tree(tmp_path: Path, *, busy_parent: bool = False) -> tuple[Cgroups, FakeKernel, Path]:
    sys_dir = tmp_path / "sys"
    kernel = FakeKernel(top=sys_dir)
    sys_dir.mkdir()
    (sys_dir / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (sys_dir / "cgroup.subtree_control").write_text("cpu memory pids\n")
    kernel.mkdir(str(sys_dir / "agent.slice"))
    kernel.write(str(sys_dir / "agent.slice" / "cgroup.subtree_control"), b"+cpu +memory +pids")
    kernel.mkdir(str(sys_dir / "agent.slice" / "agora.service"))
    if busy_parent:
        (sys_dir / "agent.slice" / "agora.service" / "cgroup.procs").write_text("4242\n")
    proc = _proc(
        tmp_path, [f"cgroup2 {sys_dir} cgroup2 rw,nosuid"], ["0::/agent.slice/agora.service"]
    )
    found = Cgroups.detect("agora", proc=str(proc), sysfs=str(sys_dir), fs=kernel)
    assert found is not None
    return found, kernel, sys_dir


def read(cg: Cgroup, name: str) -> str:
    for procs in cg.procs_files():
        path = Path(procs).with_name(name)
        if path.exists():
            return path.read_text().strip()
    raise AssertionError(f"{name} in no directory of {cg}")


def put(cg: Cgroup, name: str, text: str) -> None:
    for procs in cg.procs_files():
        if Path(procs).with_name(name).exists():
            Path(procs).with_name(name).write_text(text)


@pytest.mark.parametrize("comount", [True, False])
def test_v1_roots_sit_under_our_own_cgroup_in_each_hierarchy(tmp_path: Path, comount: bool) -> None:
    cgroups, _, sys_dir = v1_tree(tmp_path, comount=comount)
    assert cgroups.version == 1
    assert cgroups.controllers == {"cpu", "memory", "pids", "freezer"}
    cpu = ["cpu,cpuacct"] if comount else ["cpu", "cpuacct"]
    expected = [*cpu, "memory/process_api/abc", "pids/user.slice", "freezer"]
    assert sorted(cgroups.roots) == sorted(str(sys_dir / d / "agora") for d in expected)
    cg = cgroups.create("c-1", Limits(cpus=1))
    put(cg, "cpuacct.usage", "2000000000")
    assert cg.usage().cpu_seconds == 2.0


def test_v1_create_writes_every_limit(tmp_path: Path) -> None:
    cgroups, _, _ = v1_tree(tmp_path)
    cg = cgroups.create("c-1", Limits(cpus=0.5, cfs_quota=True, mem_bytes=64 * MiB, pids_max=5))
    assert read(cg, "cpu.shares") == "512"
    assert (read(cg, "cpu.cfs_quota_us"), read(cg, "cpu.cfs_period_us")) == ("50000", "100000")
    assert read(cg, "memory.limit_in_bytes") == str(64 * MiB)
    assert read(cg, "memory.memsw.limit_in_bytes") == str(64 * MiB)
    assert read(cg, "pids.max") == "5"
    assert read(cgroups.create("tiny", Limits(cpus=0.0001)), "cpu.shares") == "2"


def test_v1_update_grows_and_shrinks_memory_in_the_order_the_kernel_accepts(
    tmp_path: Path,
) -> None:
    cgroups, _, _ = v1_tree(tmp_path)
    cg = cgroups.create("c-1", Limits(mem_bytes=64 * MiB))
    cg.update(Limits(mem_bytes=256 * MiB))
    assert cg.usage().mem_limit_bytes == 256 * MiB
    cg.update(Limits(mem_bytes=32 * MiB))
    assert read(cg, "memory.memsw.limit_in_bytes") == str(32 * MiB)
    cg.update(Limits())
    assert cg.usage() == Usage(cpu_seconds=0, rss_bytes=0, mem_limit_bytes=0, cpu_limit=1,
                               oom_kills=0)  # fmt: skip
    assert (read(cg, "pids.max"), read(cg, "cpu.cfs_quota_us")) == ("max", "-1")


def test_v1_absent_optional_files_are_skipped(tmp_path: Path) -> None:
    cgroups, kernel, _ = v1_tree(tmp_path)
    kernel.absent |= {"memory.memsw.limit_in_bytes", "cpu.cfs_period_us", "cpu.cfs_quota_us"}
    cg = cgroups.create("c-1", Limits(cpus=2, cfs_quota=True, mem_bytes=64 * MiB))
    assert cg.usage().mem_limit_bytes == 64 * MiB
    assert cg.usage().cpu_limit == 2.0  # from shares, as no quota could be set


def test_a_refused_write_names_file_and_errno_and_leaves_nothing(tmp_path: Path) -> None:
    cgroups, kernel, _ = v1_tree(tmp_path)
    kernel.refuse["pids.max"] = errno.EINVAL
    with pytest.raises(CgroupError) as failure:
        cgroups.create("c-1", Limits(mem_bytes=64 * MiB, pids_max=5))
    assert failure.value.errno == errno.EINVAL
    assert failure.value.path is not None and failure.value.path.endswith("/c-1/pids.max")
    assert "pids.max" in str(failure.value)
    assert cgroups.names() == []


def test_v1_usage_and_oom(tmp_path: Path) -> None:
    cgroups, _, _ = v1_tree(tmp_path)
    cg = cgroups.create("c-1", Limits(cpus=0.5, cfs_quota=True, mem_bytes=64 * MiB))
    assert not cg.oom_killed()
    put(cg, "cpuacct.usage", "1500000000")
    put(cg, "memory.stat", f"cache 7\nrss 1\ntotal_rss {5 * MiB}\n")
    put(cg, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cg.usage() == Usage(1.5, 5 * MiB, 64 * MiB, 0.5, 2)
    assert cg.oom_killed()
    put(cg, "memory.stat", "cache 7\n")
    put(cg, "memory.usage_in_bytes", "4096")
    assert cg.usage().rss_bytes == 4096


def test_v1_destroy_freezes_kills_thaws_then_removes_everything(tmp_path: Path) -> None:
    cgroups, kernel, _ = v1_tree(tmp_path)
    cg = cgroups.create("c-1", Limits(mem_bytes=64 * MiB))
    for procs in cg.procs_files():
        Path(procs).write_text("111\n222\n")
    kernel.mkdir(os.path.join(os.path.dirname(cg.procs_files()[0]), "inner"))
    Path(cg.procs_files()[0]).with_name("inner").joinpath("cgroup.procs").write_text("333\n")
    assert cg.pids() == [111, 222, 333]
    cg.destroy()
    assert sorted(kernel.kills) == [(111, 9), (222, 9), (333, 9)]
    assert [t for f, t in kernel.writes if f == "freezer.state"] == ["FROZEN", "THAWED"]
    assert cgroups.names() == [] and cgroups.open("c-1") is None
    cg.destroy()


def test_destroy_gives_up_on_a_survivor_and_still_thaws(tmp_path: Path) -> None:
    cgroups, kernel, _ = v1_tree(tmp_path)
    cg = cgroups.create("c-1", Limits())
    put(cg, "cgroup.procs", "111\n")
    kernel.immortal.add(111)
    with pytest.raises(CgroupError, match="survive"):
        cg.destroy(timeout=0.05)
    assert read(cg, "freezer.state") == "THAWED"
    assert cgroups.names() == ["c-1"]


def test_names_open_and_cleanup_root(tmp_path: Path) -> None:
    cgroups, _, _ = v1_tree(tmp_path)
    a, _ = cgroups.create("a", Limits()), cgroups.create("b", Limits())
    assert cgroups.names() == ["a", "b"]
    opened = cgroups.open("a")
    assert opened is not None and opened.procs_files() == a.procs_files()
    assert cgroups.open("zzz") is None
    with pytest.raises(CgroupError):
        cgroups.create("a", Limits())
    cgroups.cleanup_root()  # still holds a and b: kept
    assert all(os.path.isdir(root) for root in cgroups.roots)
    for name in cgroups.names():
        opened = cgroups.open(name)
        assert opened is not None
        opened.destroy()
    cgroups.cleanup_root()
    assert not any(os.path.exists(root) for root in cgroups.roots)


@pytest.mark.parametrize("name", ["", "..", ".hidden", "a/b", "/abs", "../up", "x" * 300])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    cgroups, _, _ = v1_tree(tmp_path)
    with pytest.raises(CgroupError, match="bad cgroup name"):
        cgroups.create(name, Limits())


def test_bad_limits_are_refused() -> None:
    for bad in ({"cpus": 0}, {"cfs_quota": True}, {"mem_bytes": 0}, {"pids_max": -1}):
        with pytest.raises(ValueError):
            Limits(**bad)  # type: ignore[arg-type]


def test_detect_finds_nothing_without_cgroups_or_permission(tmp_path: Path) -> None:
    proc = _proc(tmp_path, ["proc /proc proc rw"], ["0::/"])
    assert Cgroups.detect("agora", proc=str(proc), sysfs=str(tmp_path)) is None
    kernel = FakeKernel()
    kernel.deny_mkdir = True
    (tmp_path / "mem").mkdir()
    proc2 = _proc(tmp_path / "b", [f"cgroup {tmp_path}/mem cgroup rw,memory"], ["1:memory:/"])
    assert Cgroups.detect("agora", proc=str(proc2), sysfs=str(tmp_path), fs=kernel) is None


def test_v1_uses_the_mount_root_when_our_path_is_not_under_it(tmp_path: Path) -> None:
    (tmp_path / "sys" / "memory").mkdir(parents=True)
    mounts = [f"cgroup {tmp_path}/sys/memory cgroup rw,memory"]
    proc = _proc(tmp_path, mounts, ["3:memory:/docker/0123abc", "0::/"])
    kernel = FakeKernel({tmp_path / "sys" / "memory": {"memory"}})
    found = Cgroups.detect("agora", proc=str(proc), sysfs=str(tmp_path / "sys"), fs=kernel)
    assert found is not None and found.controllers == {"memory"}
    assert found.roots == (str(tmp_path / "sys" / "memory" / "agora"),)


def test_v2_detect_delegates_controllers_down_to_the_root(tmp_path: Path) -> None:
    cgroups, _, sys_dir = v2_tree(tmp_path)
    assert cgroups.version == 2
    assert cgroups.controllers == {"cpu", "memory", "pids", "freezer"}
    own = sys_dir / "agent.slice" / "agora.service"
    assert cgroups.roots == (str(own / "agora"),)
    assert (own / "cgroup.subtree_control").read_text() == "cpu memory pids"
    assert (own / "agora" / "cgroup.subtree_control").read_text() == "cpu memory pids"


def test_v2_create_update_and_usage(tmp_path: Path) -> None:
    cgroups, _, _ = v2_tree(tmp_path)
    cg = cgroups.create("c-1", Limits(cpus=0.5, cfs_quota=True, mem_bytes=64 * MiB, pids_max=5))
    assert cg.procs_files() == (f"{cgroups.roots[0]}/c-1/cgroup.procs",)
    assert (read(cg, "cpu.weight"), read(cg, "cpu.max")) == ("50", "50000 100000")
    assert (read(cg, "memory.max"), read(cg, "memory.swap.max")) == (str(64 * MiB), "0")
    assert read(cg, "pids.max") == "5"
    put(cg, "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n")
    put(cg, "memory.stat", f"anon {3 * MiB}\nfile 99\n")
    put(cg, "memory.events", "oom 1\noom_kill 1\n")
    assert cg.usage() == Usage(2.5, 3 * MiB, 64 * MiB, 0.5, 1)
    assert cg.oom_killed()
    cg.update(Limits(cpus=3))
    assert (read(cg, "cpu.weight"), read(cg, "cpu.max")) == ("300", "max 100000")
    assert (read(cg, "memory.max"), read(cg, "pids.max")) == ("max", "max")
    assert (cg.usage().cpu_limit, cg.usage().mem_limit_bytes) == (3.0, 0)


def test_v2_destroy_uses_cgroup_kill(tmp_path: Path) -> None:
    cgroups, kernel, _ = v2_tree(tmp_path)
    cg = cgroups.create("c-1", Limits())
    put(cg, "cgroup.procs", "111\n222\n")
    cg.destroy()
    assert ("cgroup.kill", "1") in kernel.writes
    assert ("cgroup.freeze", "1") not in kernel.writes
    assert cgroups.names() == []


def test_v2_destroy_freezes_when_cgroup_kill_is_missing(tmp_path: Path) -> None:
    cgroups, kernel, _ = v2_tree(tmp_path)
    kernel.absent.add("cgroup.kill")
    cg = cgroups.create("c-1", Limits())
    put(cg, "cgroup.procs", "111\n")
    cg.destroy()
    assert kernel.kills == [(111, 9)]
    assert [t for f, t in kernel.writes if f == "cgroup.freeze"] == ["1", "0"]
    assert cgroups.names() == []


def test_v2_own_cgroup_with_processes_cannot_delegate(tmp_path: Path) -> None:
    cgroups, _, _ = v2_tree(tmp_path, busy_parent=True)
    assert cgroups.controllers == {"freezer"}
    with pytest.raises(CgroupError, match="no usable memory/pids controller"):
        cgroups.create("c-1", Limits(mem_bytes=64 * MiB, pids_max=5))
    assert cgroups.names() == []
    cg = cgroups.create("c-1", Limits())
    with pytest.raises(CgroupError, match="no usable cpu controller"):
        cg.update(Limits(cpus=1))
    cg.destroy()
