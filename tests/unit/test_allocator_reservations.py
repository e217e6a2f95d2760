"""Dynamic reservations in the allocator: ``Allocator.convert`` (RESERVE / UNRESERVE).

Plain synchronous tests; time is passed explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from agora.master.allocator import Allocation, Allocator, AllocatorError, GangAllocation
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.resources import Resources

R = Resources.parse
EMPTY = Resources()
A1 = AgentID("a1")
GOLD, SILVER = FrameworkID("gold-fw"), FrameworkID("silver-fw")


def offers(result: Iterable[Allocation | GangAllocation]) -> list[Allocation]:
    return [x for x in result if isinstance(x, Allocation)]


def allocated_on(a: Allocator, agent_id: AgentID) -> Resources:
    """Everything held by any framework on the agent (offered or in use)."""
    total = EMPTY
    for fw in (GOLD, SILVER):
        for (aid, _), res in a.allocated(fw).items():
            if aid == agent_id:
                total = total + res
    return total


def assert_balanced(a: Allocator, agent_id: AgentID = A1) -> None:
    assert allocated_on(a, agent_id) + a.available(agent_id) == a.total(agent_id)


def gold_holds_agent(text: str = "cpus:4;mem:4096") -> tuple[Allocator, Allocation]:
    """One agent, a framework in role gold holding an offer of all of it."""
    a = Allocator()
    a.add_agent(A1, R(text), 0.0)
    a.add_framework(GOLD, ["gold"], 0.0)
    (o,) = offers(a.allocate(1.0))
    assert o.framework_id == GOLD
    return a, o


def give_back(a: Allocator, o: Allocation, resources: Resources, now: float) -> None:
    a.recover_resources(o.framework_id, o.agent_id, o.role, resources, now)
    a.offer_closed(o.framework_id, o.agent_id, o.role)


def test_reserve_changes_allocation_and_total_alike() -> None:
    a, _ = gold_holds_agent()
    share = a.share(GOLD)
    a.convert(A1, GOLD, "gold", R("cpus:2;mem:1024"), R("cpus(gold):2;mem(gold):1024"))
    assert a.total(A1) == R("cpus:2;mem:3072;cpus(gold):2;mem(gold):1024")
    assert a.allocated(GOLD) == {(A1, "gold"): a.total(A1)}
    assert a.share(GOLD) == share  # same quantities: the sorters do not move
    assert_balanced(a)


def test_reserved_leftovers_go_only_to_the_role() -> None:
    a, o = gold_holds_agent()
    a.convert(A1, GOLD, "gold", R("cpus:2;mem:1024"), R("cpus(gold):2;mem(gold):1024"))
    a.add_framework(SILVER, ["silver"], 1.0)
    a.suppress(GOLD)
    give_back(a, o, a.allocated(GOLD)[(A1, "gold")], 2.0)
    assert_balanced(a)
    (silver,) = offers(a.allocate(3.0))
    assert silver.framework_id == SILVER
    assert silver.resources == R("cpus:2;mem:3072")  # never the reserved part
    assert a.available(A1) == R("cpus(gold):2;mem(gold):1024")
    assert offers(a.allocate(4.0)) == []  # nobody else may take it
    assert_balanced(a)
    a.revive(GOLD)
    (gold,) = offers(a.allocate(5.0))
    assert gold.framework_id == GOLD
    assert gold.resources == R("cpus(gold):2;mem(gold):1024")
    assert_balanced(a)


def test_unreserve_returns_resources_to_everyone() -> None:
    a, o = gold_holds_agent()
    a.convert(A1, GOLD, "gold", R("cpus:2"), R("cpus(gold):2"))
    a.convert(A1, GOLD, "gold", R("cpus(gold):2"), R("cpus:2"))
    assert a.total(A1) == R("cpus:4;mem:4096")
    assert_balanced(a)
    a.add_framework(SILVER, ["silver"], 1.0)
    a.suppress(GOLD)
    give_back(a, o, o.resources, 2.0)
    (silver,) = offers(a.allocate(3.0))
    assert (silver.framework_id, silver.resources) == (SILVER, R("cpus:4;mem:4096"))
    assert_balanced(a)


def test_partial_use_then_recovery_keeps_books_balanced() -> None:
    a, o = gold_holds_agent("cpus:4;mem:4096;ports:[31000-31009]")
    a.convert(
        A1,
        GOLD,
        "gold",
        R("cpus:1;ports:[31000-31004]"),
        R("cpus(gold):1;ports(gold):[31000-31004]"),
    )
    # a task uses part of the reservation; the rest of the offer comes back
    task = R("cpus(gold):0.5;ports(gold):[31000-31000];mem:128")
    held = a.allocated(GOLD)[(A1, "gold")]
    give_back(a, o, held - task, 2.0)
    assert a.allocated(GOLD) == {(A1, "gold"): task}
    assert_balanced(a)
    a.recover_resources(GOLD, A1, "gold", task, 3.0)
    assert a.allocated(GOLD) == {}
    assert a.available(A1) == a.total(A1)
    assert a.total(A1).reserved("gold") == R("cpus(gold):1;ports(gold):[31000-31004]")


def test_convert_on_an_inactive_agent_then_reactivate() -> None:
    a, o = gold_holds_agent()
    a.set_agent_active(A1, False)
    a.convert(A1, GOLD, "gold", R("cpus:4"), R("cpus(gold):4"))
    give_back(a, o, a.allocated(GOLD)[(A1, "gold")], 1.0)
    a.set_agent_active(A1, True)
    a.add_framework(SILVER, ["silver"], 1.0)
    a.suppress(GOLD)
    (silver,) = offers(a.allocate(2.0))
    assert silver.resources == R("mem:4096")
    assert_balanced(a)


@pytest.mark.parametrize(
    ("role", "before", "after", "match"),
    [
        ("gold", "cpus:1", "cpus(gold):2", "keep the amounts"),
        ("gold", "cpus:1", "mem(gold):1", "keep the amounts"),
        ("gold", "cpus:1", "cpus(silver):1", "other roles"),
        ("gold", "cpus(silver):1", "cpus:1", "other roles"),
        ("*", "cpus:1", "cpus:1", "role '\\*'"),
        ("gold", "cpus:5", "cpus(gold):5", "only .* is allocated"),
        ("gold", "cpus(gold):1", "cpus:1", "only .* is allocated"),
        ("silver", "cpus:1", "cpus(silver):1", "only .* is allocated"),
    ],
)
def test_convert_misuse_raises_and_changes_nothing(
    role: str, before: str, after: str, match: str
) -> None:
    a, o = gold_holds_agent()
    with pytest.raises(AllocatorError, match=match):
        a.convert(A1, GOLD, role, R(before), R(after))
    assert a.total(A1) == R("cpus:4;mem:4096")
    assert a.allocated(GOLD) == {(A1, "gold"): o.resources}


def test_convert_unknown_agent_raises() -> None:
    a, _ = gold_holds_agent()
    with pytest.raises(AllocatorError, match="unknown agent"):
        a.convert(AgentID("nope"), GOLD, "gold", R("cpus:1"), R("cpus(gold):1"))
