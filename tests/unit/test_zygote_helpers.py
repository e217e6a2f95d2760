"""The executor zygote's pure helpers: the environment's layout, what a fork cannot honour, and
where /proc says a process keeps its argv and environment."""

from __future__ import annotations

import os

from agora.agent.server.zygote import environ_blob, fork_compatible, proc_regions


def test_environ_blob_is_the_kernels_layout() -> None:
    assert environ_blob({"A": "1", "B": "x=y"}) == b"A=1\x00B=x=y\x00"
    assert environ_blob({}) == b""


def test_only_interpreter_settings_must_match() -> None:
    ours = {"PATH": "/bin", "PYTHONHASHSEED": "0", "HOME": "/root"}
    assert fork_compatible(ours, {**ours, "PATH": "/usr/bin", "AGORA_X": "1"}) is None
    assert fork_compatible(ours, {**ours, "PYTHONHASHSEED": "1"}) == "PYTHONHASHSEED"
    assert fork_compatible(ours, {"PATH": "/bin", "HOME": "/root"}) == "PYTHONHASHSEED"
    assert fork_compatible(ours, {**ours, "LD_LIBRARY_PATH": "/x"}) == "LD_LIBRARY_PATH"
    assert fork_compatible(ours, {**ours, "MALLOC_ARENA_MAX": "2"}) == "MALLOC_ARENA_MAX"


def test_proc_regions_survive_a_hostile_command_name() -> None:
    tail = " ".join(str(n) for n in range(3, 53))  # fields 3..52
    stat = f"1234 (evil) (name 5) {tail}"
    assert proc_regions(stat) == (48, 49, 50, 51)


def test_proc_regions_of_this_process_bound_its_environment() -> None:
    with open("/proc/self/stat", encoding="ascii") as f:
        arg_start, arg_end, env_start, env_end = proc_regions(f.read())
    with open("/proc/self/environ", "rb") as f:
        assert len(f.read()) == env_end - env_start
    with open("/proc/self/cmdline", "rb") as f:
        assert len(f.read()) == arg_end - arg_start
    assert os.environ  # the regions are this process's own
