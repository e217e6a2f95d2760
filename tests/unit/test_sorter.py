"""Sorters: one shared contract suite run against both, then DRF- and random-specific tests."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest
from agora.master.allocator import AllocatorError, DRFSorter, RandomSorter, Sorter

SorterFactory = Callable[[], Sorter[str]]

FACTORIES: list[Any] = [
    pytest.param(DRFSorter, id="drf"),
    pytest.param(lambda: RandomSorter(seed=7), id="random"),
]

TOTAL = {"cpus": 100_000, "mem": 1_000_000}


@pytest.fixture(params=FACTORIES)
def sorter(request: pytest.FixtureRequest) -> Sorter[str]:
    made: Sorter[str] = request.param()
    made.add_total(TOTAL)
    return made


# ---------------------------------------------------------------------- shared contract


def test_add_remove_contains_len(sorter: Sorter[str]) -> None:
    assert len(sorter) == 0
    sorter.add("a")
    sorter.add("b", weight=2)
    assert "a" in sorter and "b" in sorter and "c" not in sorter
    assert len(sorter) == 2
    sorter.remove("a")
    assert "a" not in sorter
    assert sorter.sort() == ["b"]


def test_duplicate_add_and_unknown_client(sorter: Sorter[str]) -> None:
    sorter.add("a")
    with pytest.raises(AllocatorError):
        sorter.add("a")
    with pytest.raises(KeyError):
        sorter.remove("nope")
    with pytest.raises(KeyError):
        sorter.allocated("nope", {"cpus": 1})
    with pytest.raises(KeyError):
        sorter.share("nope")


@pytest.mark.parametrize("weight", [0, -1, float("inf"), float("nan")])
def test_bad_weights_rejected(sorter: Sorter[str], weight: float) -> None:
    with pytest.raises(AllocatorError):
        sorter.add("a", weight)
    sorter.add("b")
    with pytest.raises(AllocatorError):
        sorter.set_weight("b", weight)


def test_allocation_tracking(sorter: Sorter[str]) -> None:
    sorter.add("a")
    sorter.allocated("a", {"cpus": 2000, "mem": 100})
    sorter.allocated("a", {"cpus": 1000})
    assert sorter.allocation("a") == {"cpus": 3000, "mem": 100}
    sorter.unallocated("a", {"cpus": 3000})
    assert sorter.allocation("a") == {"mem": 100}
    with pytest.raises(AllocatorError):
        sorter.unallocated("a", {"mem": 101})
    assert sorter.allocation("a") == {"mem": 100}  # a refused change changes nothing


def test_allocation_is_a_copy(sorter: Sorter[str]) -> None:
    sorter.add("a")
    sorter.allocated("a", {"cpus": 5})
    sorter.allocation("a")["cpus"] = 99
    assert sorter.allocation("a") == {"cpus": 5}


def test_share_is_weighted_dominant_share(sorter: Sorter[str]) -> None:
    sorter.add("a")
    sorter.add("b", weight=4)
    sorter.allocated("a", {"cpus": 10_000, "mem": 500_000})  # 10% cpus, 50% mem
    sorter.allocated("b", {"cpus": 40_000})  # 40% / 4
    assert sorter.share("a") == pytest.approx(0.5)
    assert sorter.share("b") == pytest.approx(0.1)
    sorter.set_weight("a", 2)
    assert sorter.share("a") == pytest.approx(0.25)
    assert sorter.weight("a") == 2


def test_share_ignores_names_the_total_lacks(sorter: Sorter[str]) -> None:
    sorter.add("a")
    sorter.allocated("a", {"gpus": 1000, "cpus": 1000})
    assert sorter.share("a") == pytest.approx(0.01)


def test_total_changes_move_shares(sorter: Sorter[str]) -> None:
    sorter.add("a")
    sorter.allocated("a", {"cpus": 50_000})
    assert sorter.share("a") == pytest.approx(0.5)
    sorter.add_total({"cpus": 100_000})
    assert sorter.share("a") == pytest.approx(0.25)
    sorter.remove_total({"cpus": 150_000})
    assert sorter.total() == {"cpus": 50_000, "mem": 1_000_000}
    assert sorter.share("a") == pytest.approx(1.0)
    with pytest.raises(AllocatorError):
        sorter.remove_total({"cpus": 50_001})


def test_sort_and_iteration_are_permutations(sorter: Sorter[str]) -> None:
    names = [f"c{i}" for i in range(20)]
    for i, name in enumerate(names):
        sorter.add(name, weight=1 + i % 3)
        sorter.allocated(name, {"cpus": 100 * i})
    for _ in range(5):
        assert sorted(sorter.sort()) == sorted(names)
        assert sorted(sorter) == sorted(names)


def test_empty_sorter(sorter: Sorter[str]) -> None:
    assert sorter.sort() == []
    assert list(sorter) == []


def test_inactive_clients_keep_their_share_but_leave_the_order(sorter: Sorter[str]) -> None:
    for name in "abc":
        sorter.add(name)
    sorter.allocated("b", {"cpus": 10_000})
    sorter.set_active("b", False)
    assert sorted(sorter.sort()) == ["a", "c"]
    sorter.allocated("b", {"cpus": 10_000})  # an inactive client still gets and gives back
    sorter.unallocated("b", {"cpus": 5_000})
    assert sorter.allocation("b") == {"cpus": 15_000}
    assert sorter.share("b") == pytest.approx(0.15)
    sorter.add_total({"cpus": 100_000})  # a rebuild of the order leaves it out too
    assert sorted(sorter) == ["a", "c"]
    sorter.set_active("b", False)  # twice is once
    sorter.set_active("b", True)
    assert sorted(sorter.sort()) == ["a", "b", "c"]
    sorter.set_active("c", False)
    sorter.remove("c")  # an inactive client can go
    assert "c" not in sorter and sorted(sorter.sort()) == ["a", "b"]


def test_drf_reactivated_client_comes_back_at_its_share() -> None:
    drf: DRFSorter[str] = DRFSorter()
    drf.add_total(TOTAL)
    for name in "abc":
        drf.add(name)
    drf.allocated("a", {"cpus": 30_000})
    drf.allocated("c", {"cpus": 10_000})
    drf.set_active("b", False)
    drf.unallocated("a", {"cpus": 25_000})  # a's share drops while b is out of the order
    drf.set_active("b", True)
    assert drf.sort() == ["b", "a", "c"]


def test_partial_iteration_is_safe(sorter: Sorter[str]) -> None:
    for name in "abcde":
        sorter.add(name)
    first = next(iter(sorter))
    sorter.allocated(first, {"cpus": 1000})  # mutate only after abandoning the iterator
    assert sorted(sorter.sort()) == list("abcde")


# ---------------------------------------------------------------------- DRF


def drf() -> DRFSorter[str]:
    s: DRFSorter[str] = DRFSorter()
    s.add_total(TOTAL)
    return s


def test_drf_orders_by_dominant_share() -> None:
    s = drf()
    for name in "abc":
        s.add(name)
    s.allocated("a", {"cpus": 30_000})  # 0.30
    s.allocated("b", {"mem": 100_000})  # 0.10
    s.allocated("c", {"cpus": 10_000, "mem": 200_000})  # 0.20
    assert s.sort() == ["b", "c", "a"]
    s.unallocated("a", {"cpus": 30_000})
    assert s.sort() == ["a", "b", "c"]


def test_drf_weights_divide_share() -> None:
    s = drf()
    s.add("light")
    s.add("heavy", weight=3)
    s.allocated("light", {"cpus": 10_000})  # 0.10
    s.allocated("heavy", {"cpus": 27_000})  # 0.27 / 3 = 0.09
    assert s.sort() == ["heavy", "light"]
    s.set_weight("heavy", 2)  # 0.135
    assert s.sort() == ["light", "heavy"]


def test_drf_ties_broken_by_allocation_count_then_name() -> None:
    s = drf()
    for name in ("b", "a", "c"):
        s.add(name)
    assert s.sort() == ["a", "b", "c"]
    s.allocated("a", {})  # same share (0), one more allocation
    assert s.sort() == ["b", "c", "a"]


def test_drf_rekeys_lazily_after_total_change() -> None:
    s = drf()
    s.add("a")
    s.add("b")
    s.allocated("a", {"cpus": 50_000})  # 0.50
    s.allocated("b", {"mem": 400_000})  # 0.40
    assert s.sort() == ["b", "a"]
    s.add_total({"cpus": 900_000})  # cpus now 1000 total: a = 0.05
    s.allocated("b", {"mem": 1})  # while stale
    s.add("c")
    assert s.sort() == ["c", "a", "b"]
    s.remove("c")
    s.add_total({"mem": 1_000_000})
    s.remove("a")
    assert s.sort() == ["b"]


def test_drf_dominant_resource_switches() -> None:
    s = drf()
    s.add("cpu_heavy")
    s.add("mem_heavy")
    s.allocated("cpu_heavy", {"cpus": 40_000, "mem": 10_000})  # 0.40
    s.allocated("mem_heavy", {"cpus": 1_000, "mem": 300_000})  # 0.30
    assert s.sort() == ["mem_heavy", "cpu_heavy"]
    s.remove_total({"mem": 500_000})  # mem_heavy now 0.60
    assert s.sort() == ["cpu_heavy", "mem_heavy"]


# ---------------------------------------------------------------------- random


def test_random_is_deterministic_per_seed() -> None:
    def orders(seed: int) -> list[list[str]]:
        s: RandomSorter[str] = RandomSorter(seed=seed)
        for i in range(10):
            s.add(f"c{i}")
        return [s.sort() for _ in range(5)]

    assert orders(1) == orders(1)
    assert orders(1) != orders(2)


def test_random_order_varies() -> None:
    s: RandomSorter[str] = RandomSorter(seed=3)
    for i in range(5):
        s.add(f"c{i}")
    assert len({tuple(s.sort()) for _ in range(50)}) > 10


def test_random_first_pick_follows_weights() -> None:
    s: RandomSorter[str] = RandomSorter(seed=11)
    s.add("one", 1)
    s.add("three", 3)
    firsts = collections.Counter(next(iter(s)) for _ in range(4000))
    assert firsts["three"] / 4000 == pytest.approx(0.75, abs=0.03)


def test_random_ignores_shares_for_order() -> None:
    s: RandomSorter[str] = RandomSorter(seed=5)
    s.add_total(TOTAL)
    s.add("rich")
    s.add("poor")
    s.allocated("rich", {"cpus": 90_000})
    firsts = collections.Counter(s.sort()[0] for _ in range(2000))
    assert firsts["rich"] > 800 and firsts["poor"] > 800
