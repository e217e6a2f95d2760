"""The nemesis: its seeded plan (reproducible, bounded, every fault healed) and its executor,
driven against a fake cluster and a fake rig."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agora.sdk.daemon.history import History
from fault.nemesis import KINDS, Fault, Nemesis, Step, plan, schedule
from support.polling import wait_for


def test_same_seed_gives_the_same_schedule() -> None:
    assert plan(7, KINDS, steps=50, masters=5) == plan(7, KINDS, steps=50, masters=5)
    assert plan(7, KINDS, steps=50, masters=5) != plan(8, KINDS, steps=50, masters=5)


def test_durations_within_bounds_and_every_fault_healed() -> None:
    steps = list(
        itertools.islice(
            schedule(3, KINDS, duration=(1.0, 2.0), heal=(4.0, 6.0), pause_min=2.5), 2000
        )
    )
    assert len(steps) == 2000
    for s in steps:
        lo, hi = (2.5, 2.5) if s.fault.kind == "pause" else (1.0, 2.0)  # a pause outlasts 2 T
        assert lo <= s.duration <= hi, s
        assert 4.0 <= s.heal <= 6.0  # a settle time after each heal
    assert {s.fault.kind for s in steps} == set(KINDS)


def test_fault_parameters_follow_the_kind() -> None:
    steps = plan(11, ["loss", "split", "bridge", "cut"], steps=400, loss_percent=(10, 30))
    for s in steps:
        f = s.fault
        if f.kind == "loss":
            assert 10 <= f.percent <= 30
        if f.kind == "split":
            assert f.side in ("minority", "majority")
        if f.kind == "bridge":
            assert f.side in ("side", "bridge")
    assert {s.fault.both for s in steps if s.fault.kind == "cut"} == {True, False}
    assert {s.fault.kind for s in plan(1, ["kill"], steps=20)} == {"kill"}


@pytest.mark.parametrize(
    ("kinds", "kw", "match"),
    [
        ([], {}, "no fault kinds"),
        (["kill", "flood"], {}, "unknown fault kinds"),
        (["split"], {"masters": 2}, "at least 3 masters"),
        (["kill"], {"duration": (5.0, 1.0)}, "duration"),
        (["loss"], {"loss_percent": (50, 101)}, "loss_percent"),
    ],
)
def test_bad_plans_are_refused(kinds: list[str], kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(0, kinds, steps=1, **kw)


# --------------------------------------------------------------------------- executor


class FakeCluster:
    def __init__(self, leader: int | None) -> None:
        self.current = leader
        self.calls: list[tuple[str, int]] = []

    def leader(self) -> int | None:
        return self.current

    def kill(self, i: int) -> None:
        self.calls.append(("kill", i))

    def restart(self, i: int) -> None:
        self.calls.append(("restart", i))

    def pause(self, i: int) -> None:
        self.calls.append(("pause", i))

    def resume(self, i: int) -> None:
        self.calls.append(("resume", i))


class FakeRig:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def cut(self, a: int, b: int, *, both: bool = True) -> None:
        self.calls.append(("cut", a, b, both))

    def isolate(self, a: int) -> None:
        self.calls.append(("isolate", a))

    def partition(self, *groups: Sequence[int]) -> None:
        self.calls.append(("partition", *[sorted(g) for g in groups]))

    def loss(self, a: int, b: int, percent: int) -> None:
        self.calls.append(("loss", a, b, percent))

    def heal(self) -> None:
        self.calls.append(("heal",))


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def nemesis(tmp_path: Path, leader: int | None = 1, masters: int = 5) -> tuple[Nemesis, Path]:
    path = tmp_path / "nemesis.jsonl"
    n = Nemesis(
        FakeCluster(leader),
        FakeRig(),
        History(path, "nemesis"),
        masters=masters,
        master_hosts=[10 + i for i in range(masters)],
        others=[20, 21],
        leader_timeout=0.05,
    )
    return n, path


def test_executor_heals_every_fault_and_records_both(tmp_path: Path) -> None:
    n, path = nemesis(tmp_path)
    steps = plan(5, KINDS, steps=40, masters=5, duration=(0, 0), heal=(0, 0), pause_min=0)
    n.run(steps)
    kinds = [e["kind"] for e in records(path)]
    assert kinds == ["fault", "healed"] * 40
    cluster, rig = n.cluster, n.net
    assert isinstance(cluster, FakeCluster) and isinstance(rig, FakeRig)
    assert cluster.calls.count(("kill", 1)) == cluster.calls.count(("restart", 1))
    assert cluster.calls.count(("pause", 1)) == cluster.calls.count(("resume", 1))
    net_faults = sum(s.fault.kind not in ("kill", "killall", "pause") for s in steps)
    assert rig.calls.count(("heal",)) == net_faults


def test_killall_kills_the_whole_group_and_restarts_every_master(tmp_path: Path) -> None:
    n, path = nemesis(tmp_path, leader=2, masters=3)
    n.run([Step(Fault("killall", pick=9), 0, 0)])
    cluster = n.cluster
    assert isinstance(cluster, FakeCluster)
    kills = [at for at, (verb, _) in enumerate(cluster.calls) if verb == "kill"]
    restarts = [at for at, (verb, _) in enumerate(cluster.calls) if verb == "restart"]
    assert sorted(i for verb, i in cluster.calls if verb == "kill") == [0, 1, 2]
    assert sorted(i for verb, i in cluster.calls if verb == "restart") == [0, 1, 2]
    assert max(kills) < min(restarts), "the whole group is down before any master restarts"
    [fault, healed] = records(path)
    assert fault["masters"] == [0, 1, 2] and healed["fault"] == "killall"


def test_split_puts_the_leader_on_the_chosen_side(tmp_path: Path) -> None:
    for side in ("minority", "majority"):
        n, _ = nemesis(tmp_path)
        n.apply(Step(Fault("split", side=side, pick=3), 0, 0))
        rig = n.net
        assert isinstance(rig, FakeRig)
        (_, minority, majority) = rig.calls[0]
        assert len(minority) == 2 and len(majority) == 3 + 2  # agents' hosts join the majority
        assert {20, 21} <= set(majority)
        assert (11 in minority) == (side == "minority")


def test_bridge_cuts_only_between_the_sides(tmp_path: Path) -> None:
    n, _ = nemesis(tmp_path, leader=0, masters=3)
    applied = n.apply(Step(Fault("bridge", side="bridge", pick=1), 0, 0))
    rig = n.net
    assert isinstance(rig, FakeRig)
    assert applied.masters == [0]
    assert rig.calls == [("cut", 11, 12, True)] or rig.calls == [("cut", 12, 11, True)]


def test_without_a_leader_a_seeded_master_is_chosen(tmp_path: Path) -> None:
    n, _ = nemesis(tmp_path, leader=None)
    a = n.apply(Step(Fault("kill", pick=42), 0, 0))
    b = n.apply(Step(Fault("kill", pick=42), 0, 0))
    assert a.masters == b.masters and 0 <= a.masters[0] < 5


def test_stopping_mid_fault_still_heals(tmp_path: Path) -> None:
    n, path = nemesis(tmp_path)
    worker = threading.Thread(target=n.run, args=([Step(Fault("isolate"), 60.0, 60.0)],))
    worker.start()
    wait_for(lambda: path.exists() and "fault" in path.read_text(), 5, "the fault")
    n.stop.set()
    worker.join(5)
    assert not worker.is_alive()
    assert [e["kind"] for e in records(path)] == ["fault", "healed"]
    assert isinstance(n.net, FakeRig) and n.net.calls == [("isolate", 11), ("heal",)]
