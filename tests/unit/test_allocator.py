"""The allocator: offers, filters, suppression, reservations, quota, DRF weights and gangs.

Plain synchronous tests; time is passed explicitly.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest
from agora.master.allocator import (
    Allocation,
    Allocator,
    AllocatorConfig,
    AllocatorError,
    GangAllocation,
    GangExpired,
)
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import GangRequest, Placement
from agora.sdk.resources import Resources

R = Resources.parse
EMPTY = Resources()
F1, F2, F3 = FrameworkID("f1"), FrameworkID("f2"), FrameworkID("f3")


def agent(i: int) -> AgentID:
    return AgentID(f"a{i}")


def offers(result: Iterable[Allocation | GangAllocation]) -> list[Allocation]:
    return [x for x in result if isinstance(x, Allocation)]


def gangs(result: Iterable[Allocation | GangAllocation]) -> list[GangAllocation]:
    return [x for x in result if isinstance(x, GangAllocation)]


def cluster(n: int, text: str = "cpus:4;mem:4096", **config: object) -> Allocator:
    a = Allocator(AllocatorConfig(**config))  # type: ignore[arg-type]
    for i in range(n):
        a.add_agent(agent(i), R(text), 0.0)
    return a


def decline(a: Allocator, o: Allocation, now: float, refuse: float | None = None) -> None:
    a.recover_resources(o.framework_id, o.agent_id, o.role, o.resources, now, refuse)
    a.offer_closed(o.framework_id, o.agent_id, o.role)


def held(a: Allocator, fw: FrameworkID) -> Resources:
    total = EMPTY
    for res in a.allocated(fw).values():
        total = total + res
    return total


def gang_request(
    gid: str,
    count: int,
    shape: str,
    placement: Placement = Placement.DISTINCT,
    role: str = "*",
    hold: float = 60.0,
    max_per_agent: int = 0,
) -> GangRequest:
    return GangRequest(
        gang_id=GangID(gid),
        role=role,
        count=count,
        shape=R(shape),
        placement=placement,
        hold_timeout=hold,
        max_per_agent=max_per_agent,
    )


# ---------------------------------------------------------------------- basic offers


def test_each_agent_offered_whole_to_one_framework() -> None:
    a = cluster(4, "cpus:4;mem:4096;ports:[31000-31010]")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    got = offers(a.allocate(1.0))
    assert len(got) == 4
    assert {o.agent_id for o in got} == {agent(i) for i in range(4)}
    assert all(o.resources == R("cpus:4;mem:4096;ports:[31000-31010]") for o in got)
    assert sorted(o.framework_id for o in got) == [F1, F1, F2, F2]  # DRF alternates
    for i in range(4):
        assert a.available(agent(i)) == EMPTY


def test_same_resources_never_in_two_outstanding_allocations() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    first = offers(a.allocate(1.0))
    assert offers(a.allocate(2.0)) == []  # everything is out already
    assert offers(a.allocate(2.5, [agent(0), agent(1)])) == []
    # Part of one offer comes back (declined): only that part can go out again.
    o = first[0]
    a.recover_resources(o.framework_id, o.agent_id, "*", R("cpus:1;mem:1024"), 3.0)
    again = offers(a.allocate(3.0))
    assert [x.resources for x in again] == [R("cpus:1;mem:1024")]
    assert again[0].framework_id != o.framework_id  # o's holder still has its offer open
    assert held(a, F1) + held(a, F2) == R("cpus:8;mem:8192")


def test_one_outstanding_offer_per_agent_framework_role() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    assert len(offers(a.allocate(1.0))) == 1
    a.recover_resources(F1, agent(0), "*", R("cpus:2;mem:2048"), 1.5)
    assert offers(a.allocate(2.0)) == []  # F1's offer on a0 is still outstanding
    assert a.outstanding(F1) == {(agent(0), "*")}
    a.offer_closed(F1, agent(0), "*")
    (again,) = offers(a.allocate(3.0, [agent(0)]))
    assert again.resources == R("cpus:2;mem:2048")
    assert held(a, F1) == R("cpus:4;mem:4096")


def test_recover_unknown_ids_is_ignored_and_overdraw_rejected() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    a.recover_resources(F1, agent(9), "*", R("cpus:1"), 0)
    a.recover_resources(FrameworkID("ghost"), agent(0), "*", R("cpus:1"), 0)
    a.recover_resources(F1, agent(0), "*", R("cpus:1"), 0)  # nothing allocated yet
    offers(a.allocate(1.0))
    with pytest.raises(AllocatorError):
        a.recover_resources(F1, agent(0), "*", R("cpus:5"), 2.0)
    assert held(a, F1) == R("cpus:4;mem:4096")


def test_dedupes_and_skips_unknown_agents_in_event_run() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    got = offers(a.allocate(1.0, [agent(0), agent(0), AgentID("nope")]))
    assert [o.agent_id for o in got] == [agent(0)]


def test_full_cycle_agent_order_is_seeded() -> None:
    def order(seed: int) -> list[AgentID]:
        a = cluster(30, seed=seed)
        a.add_framework(F1, ["*"], 0)
        return [o.agent_id for o in offers(a.allocate(1.0))]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(agent(i) for i in range(30))


# ---------------------------------------------------------------------- filters


def test_filter_refuses_until_timeout_and_one_batch() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    decline(a, o, 1.0, refuse=5.0)
    assert offers(a.allocate(2.0)) == []
    assert offers(a.allocate(5.9)) == []
    assert offers(a.allocate(6.0, [agent(0)])) != []  # past timeout, batches have run


def test_filter_lasts_at_least_one_batch() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    decline(a, o, 1.0, refuse=0.1)
    # Timed out, but no full batch has run since: event runs do not count.
    assert offers(a.allocate(2.0, [agent(0)])) == []
    assert offers(a.allocate(3.0, [agent(0)])) == []
    assert offers(a.allocate(4.0)) == []  # the first batch after the filter still honours it
    assert len(offers(a.allocate(5.0))) == 1


def test_zero_or_no_refuse_seconds_makes_no_filter() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    decline(a, o, 1.0, refuse=0.0)
    (o,) = offers(a.allocate(1.0, [agent(0)]))
    decline(a, o, 1.0, refuse=None)
    assert len(offers(a.allocate(1.0, [agent(0)]))) == 1


def test_filter_is_per_agent_and_per_framework() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    got = offers(a.allocate(0.0))
    for o in got:
        if o.agent_id == agent(0):
            decline(a, o, 1.0, refuse=100)
        else:
            decline(a, o, 1.0)
    got = offers(a.allocate(2.0))
    assert [o.agent_id for o in got] == [agent(1)]
    a.add_framework(F2, ["*"], 2.0)
    got = offers(a.allocate(3.0, [agent(0)]))
    assert [(o.framework_id, o.agent_id) for o in got] == [(F2, agent(0))]


def test_filter_applies_only_to_contained_candidates() -> None:
    a = cluster(1, "cpus:8;mem:8192")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    holder = o.framework_id
    other = F2 if holder == F1 else F1
    # The holder keeps half, declines half for a long time.
    a.recover_resources(holder, agent(0), "*", R("cpus:4;mem:4096"), 1.0, 1000)
    a.offer_closed(holder, agent(0), "*")
    a.suppress(other)
    assert offers(a.allocate(2.0)) == []  # the refused half alone: filtered
    # More is freed: the candidate is no longer inside the refused resources.
    a.recover_resources(holder, agent(0), "*", R("cpus:1;mem:1024"), 3.0)
    (again,) = offers(a.allocate(3.0))
    assert again.framework_id == holder
    assert again.resources == R("cpus:5;mem:5120")


def test_filter_is_per_role() -> None:
    a = cluster(1, "cpus:4;mem:4096;cpus(gold):2;mem(gold):2048")
    a.add_framework(F1, ["*", "gold"], 0)
    got = {o.role: o for o in offers(a.allocate(0.0))}
    assert set(got) == {"*", "gold"}
    decline(a, got["*"], 1.0, refuse=100)
    decline(a, got["gold"], 1.0)
    (o,) = offers(a.allocate(2.0))
    assert o.role == "gold"
    assert o.resources == R("cpus:4;mem:4096;cpus(gold):2;mem(gold):2048")


def test_revive_clears_filters() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    decline(a, o, 1.0, refuse=1000)
    assert offers(a.allocate(2.0)) == []
    a.revive(F1)
    assert len(offers(a.allocate(3.0))) == 1


def test_remove_agent_drops_filters_and_readd_offers() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    (o,) = offers(a.allocate(0.0))
    decline(a, o, 1.0, refuse=1000)
    a.remove_agent(agent(0))
    a.add_agent(agent(0), R("cpus:4;mem:4096"), 2.0)
    assert len(offers(a.allocate(3.0))) == 1


# ---------------------------------------------------------------------- suppress / revive


def test_suppress_and_revive() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    assert a.suppressed_roles(F1) == {"*"}
    assert offers(a.allocate(1.0)) == []
    a.revive(F1)
    assert a.suppressed_roles(F1) == frozenset()
    assert len(offers(a.allocate(2.0))) == 2


def test_suppressed_and_inactive_frameworks_are_not_walked_past() -> None:
    # A thousand idle schedulers must not cost every agent of every allocation a thousand
    # skips: the role's order lists only those that may take an offer.
    a = cluster(3)
    idle = [FrameworkID(f"idle-{i}") for i in range(50)]
    for fw in idle:
        a.add_framework(fw, ["*"], 0, suppressed_roles=["*"])
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    a.set_framework_active(F2, False)
    role = a._ledger.roles["*"]
    assert role.sorter.sort() == [F1]
    assert {o.framework_id for o in offers(a.allocate(1.0))} == {F1}
    a.revive(idle[0])
    a.set_framework_active(F2, True)
    assert sorted(role.sorter.sort()) == sorted([F1, F2, idle[0]])
    a.remove_framework(F1)
    assert sorted(role.sorter.sort()) == sorted([F2, idle[0]])


def test_suppress_one_role_and_on_subscribe() -> None:
    a = cluster(1, "cpus:4;mem:4096;cpus(gold):4;mem(gold):4096")
    a.add_framework(F1, ["*", "gold"], 0, suppressed_roles=["gold", "unknown-role"])
    assert a.suppressed_roles(F1) == {"gold"}
    got = offers(a.allocate(1.0))
    assert [(o.role, o.resources) for o in got] == [("*", R("cpus:4;mem:4096"))]
    a.revive(F1, ["gold"])
    a.suppress(F1, ["*"])
    assert a.suppressed_roles(F1) == {"*"}
    (o,) = offers(a.allocate(2.0))
    assert o.role == "gold" and o.resources == R("cpus(gold):4;mem(gold):4096")


def test_unknown_framework_calls_raise() -> None:
    a = cluster(1)
    for call in (
        lambda: a.suppress(F1),
        lambda: a.revive(F1),
        lambda: a.suppressed_roles(F1),
        lambda: a.set_framework_active(F1, False),
        lambda: a.share(F1),
    ):
        with pytest.raises(AllocatorError):
            call()
    a.add_framework(F1, ["*"], 0)
    with pytest.raises(AllocatorError):
        a.add_framework(F1, ["*"], 0)
    with pytest.raises(AllocatorError):
        a.add_agent(agent(0), R("cpus:1"), 0)
    a.remove_framework(F2)  # unknown: nothing to do
    a.remove_agent(agent(7))


# ---------------------------------------------------------------------- min_allocatable


def test_min_allocatable_default() -> None:
    a = Allocator()
    a.add_agent(agent(0), R("mem:16;disk:100"), 0)
    a.add_agent(agent(1), R("cpus:0.01"), 0)
    a.add_agent(agent(2), R("mem:32;ports:[1-2]"), 0)
    a.add_agent(agent(3), R("ports:[1-100]"), 0)
    a.add_framework(F1, ["*"], 0)
    got = {o.agent_id for o in offers(a.allocate(1.0))}
    assert got == {agent(1), agent(2)}


def test_min_allocatable_is_or_of_and_groups() -> None:
    a = Allocator(AllocatorConfig(min_allocatable=(R("cpus:1;mem:1024"), R("gpus:1"))))
    a.add_agent(agent(0), R("cpus:4;mem:512"), 0)
    a.add_agent(agent(1), R("cpus:1;mem:1024"), 0)
    a.add_agent(agent(2), R("gpus:1"), 0)
    a.add_agent(agent(3), R("cpus(gold):1;mem:1024"), 0)  # quantities: roles ignored
    a.add_framework(F1, ["*", "gold"], 0)
    got = {o.agent_id: o.role for o in offers(a.allocate(1.0))}
    assert set(got) == {agent(1), agent(2), agent(3)}
    assert got[agent(3)] == "gold"


def test_no_min_allocatable_offers_anything() -> None:
    a = Allocator(AllocatorConfig(min_allocatable=()))
    a.add_agent(agent(0), R("ports:[1-2]"), 0)
    a.add_framework(F1, ["*"], 0)
    assert [o.resources for o in offers(a.allocate(1.0))] == [R("ports:[1-2]")]


def test_min_allocatable_with_ranges() -> None:
    a = Allocator(AllocatorConfig(min_allocatable=(R("cpus:1;ports:[5-5]"),)))
    a.add_agent(agent(0), R("cpus:2;ports:[1-4]"), 0)
    a.add_agent(agent(1), R("cpus:2;ports:[1-10]"), 0)
    a.add_framework(F1, ["*"], 0)
    assert [o.agent_id for o in offers(a.allocate(1.0))] == [agent(1)]


# ---------------------------------------------------------------------- reservations


def test_reserved_resources_only_to_their_role() -> None:
    a = cluster(3, "cpus:4;mem:4096;cpus(gold):2;mem(gold):1024")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["silver"], 0)
    for o in offers(a.allocate(1.0)):
        assert "gold" not in o.resources.roles()
    a.add_framework(F3, ["gold"], 1.0)
    got = offers(a.allocate(2.0))
    assert {o.framework_id for o in got} == {F3}
    assert all(o.resources == R("cpus(gold):2;mem(gold):1024") for o in got)
    assert len(got) == 3


def test_reserved_role_framework_gets_reserved_plus_unreserved() -> None:
    a = cluster(1, "cpus:4;mem:4096;cpus(gold):2;mem(gold):1024")
    a.add_framework(F3, ["gold"], 0)
    (o,) = offers(a.allocate(1.0))
    assert o.resources == R("cpus:4;mem:4096;cpus(gold):2;mem(gold):1024")


# ---------------------------------------------------------------------- activity


def test_inactive_agents_get_no_offers() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.set_agent_active(agent(0), False)
    assert [o.agent_id for o in offers(a.allocate(1.0))] == [agent(1)]
    assert offers(a.allocate(1.5, [agent(0)])) == []
    a.set_agent_active(agent(0), True)
    assert [o.agent_id for o in offers(a.allocate(2.0))] == [agent(0)]


def test_inactive_agent_stays_in_the_share_denominator() -> None:
    # As Mesos's deactivateSlave: a drained agent is still part of the cluster (what runs there
    # still counts in the shares), it only gets no offers. Out of the totals, a framework
    # holding tasks on it would hold more than the whole cluster.
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    offers(a.allocate(1.0, [agent(0)]))
    assert a.share(F1) == pytest.approx(0.5)
    a.set_agent_active(agent(0), False)
    a.set_agent_active(agent(1), False)
    assert a.share(F1) == pytest.approx(0.5)
    assert a.role_share("*") == pytest.approx(0.5)
    a.remove_agent(agent(1))
    assert a.share(F1) == pytest.approx(1.0)


def test_inactive_framework_keeps_allocations_gets_nothing() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    offers(a.allocate(1.0, [agent(0)]))
    a.set_framework_active(F1, False)
    assert offers(a.allocate(2.0)) == []
    assert held(a, F1) == R("cpus:4;mem:4096")
    a.set_framework_active(F1, True)
    assert [o.agent_id for o in offers(a.allocate(3.0))] == [agent(1)]


def test_remove_framework_releases_everything() -> None:
    a = cluster(3, "cpus:4;mem:4096;ports:[1-10]")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    got = offers(a.allocate(1.0))
    f1_agents = {o.agent_id for o in got if o.framework_id == F1}
    mine = next(o for o in got if o.framework_id == F1)
    decline(a, mine, 1.5, refuse=100)  # a filter of F1 that must go too
    a.remove_framework(F1)
    assert a.allocated(F1) == {}
    for agent_id in f1_agents:
        assert a.available(agent_id) == R("cpus:4;mem:4096;ports:[1-10]")
    got = offers(a.allocate(2.0))
    assert {o.agent_id for o in got} == f1_agents
    assert all(o.framework_id == F2 for o in got)
    a.add_framework(F1, ["*"], 3.0)  # re-adding starts clean
    assert a.outstanding(F1) == frozenset()


def test_remove_agent_drops_allocations() -> None:
    a = cluster(2)
    a.add_framework(F1, ["*"], 0)
    offers(a.allocate(1.0))
    a.remove_agent(agent(0))
    assert set(a.allocated(F1)) == {(agent(1), "*")}
    assert a.share(F1) == pytest.approx(1.0)
    assert a.outstanding(F1) == {(agent(1), "*")}


def test_agent_with_used_resources_of_unknown_framework() -> None:
    a = Allocator()
    used = {(F1, "*"): R("cpus:3;mem:3072"), (F2, "gold"): R("cpus:1")}
    a.add_agent(agent(0), R("cpus:4;mem:4096"), 0, used=used)
    a.add_agent(agent(1), R("cpus:4;mem:4096"), 0)
    assert a.available(agent(0)) == R("mem:1024")
    assert a.allocated(F1) == {(agent(0), "*"): R("cpus:3;mem:3072")}
    assert a.role_share("*") == pytest.approx(3 / 8)
    a.add_framework(F3, ["*"], 0)
    got = offers(a.allocate(1.0))
    assert {(o.framework_id, o.agent_id) for o in got} == {(F3, agent(0)), (F3, agent(1))}
    a.add_framework(F1, ["*"], 2.0)
    assert a.share(F1) == pytest.approx(3 / 8)
    # The master recovers F1's task when it ends, even before F1 re-subscribed.
    a.recover_resources(F2, agent(0), "gold", R("cpus:1"), 3.0)
    assert a.role_share("gold") == 0.0
    with pytest.raises(AllocatorError):
        a.add_agent(agent(2), R("cpus:1"), 0, used={(F1, "*"): R("cpus:2")})


# ---------------------------------------------------------------------- quota


def test_quota_limit_caps_a_role() -> None:
    a = cluster(3, "cpus:4;mem:4096")
    a.add_framework(F1, ["capped"], 0)
    a.set_quota("capped", EMPTY, R("cpus:6"))
    got = offers(a.allocate(1.0))
    assert held(a, F1).scalar("cpus") == 6
    assert sum(o.resources.scalar("mem") for o in got) == 12288  # mem is not limited
    a.add_framework(F2, ["capped"], 1.0)
    assert all(o.resources.scalar("cpus") == 0 for o in offers(a.allocate(2.0)))
    assert held(a, F1).scalar("cpus") + held(a, F2).scalar("cpus") == 6


def test_quota_errors_and_removal() -> None:
    a = cluster(1)
    with pytest.raises(AllocatorError):
        a.set_quota("r", R("ports:[1-2]"))
    with pytest.raises(AllocatorError):
        a.set_quota("r", R("cpus:4"), R("cpus:2"))
    a.set_quota("r", EMPTY, R("cpus:1"))
    a.set_quota("r", EMPTY, None)  # removed
    a.add_framework(F1, ["r"], 0)
    assert held(a, F1) == EMPTY
    assert offers(a.allocate(1.0))[0].resources == R("cpus:4;mem:4096")


def test_quota_guarantee_keeps_headroom() -> None:
    a = cluster(4, "cpus:4;mem:4096")
    a.set_quota("prod", R("cpus:8"))
    a.add_framework(F2, ["dev"], 0)
    a.allocate(1.0)
    # dev may take only what leaves 8 unallocated cpus for prod's guarantee.
    assert held(a, F2).scalar("cpus") == 8
    a.add_framework(F1, ["prod"], 2.0)
    a.allocate(2.0)
    assert held(a, F1).scalar("cpus") == 8


def test_quota_guarantee_first_stage_wins_over_share_order() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.set_weight("big", 100)
    a.set_quota("small", R("cpus:2"))
    a.add_framework(F1, ["big"], 0)
    a.add_framework(F2, ["small"], 0)
    got = offers(a.allocate(1.0))
    small = [o for o in got if o.role == "small"]
    # Stage 1 serves "small" up to its guarantee before "big" (with the lower share) is served.
    assert sum(o.resources.scalar("cpus") for o in small) == 2
    assert held(a, F1).scalar("cpus") == 6


def test_quota_guarantee_role_can_exceed_it_in_stage_two() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.set_quota("prod", R("cpus:2"), R("cpus:6"))
    a.add_framework(F1, ["prod"], 0)
    a.allocate(1.0)
    assert held(a, F1).scalar("cpus") == 6


# ---------------------------------------------------------------------- DRF weights


def test_drf_shares_converge_to_weights() -> None:
    rng = random.Random(4)
    a = cluster(20, "cpus:8;mem:16384")
    task = R("cpus:1;mem:2048")
    a.set_weight("light", 1)
    a.set_weight("heavy", 3)
    a.add_framework(F1, ["light"], 0)
    a.add_framework(F2, ["heavy"], 0)
    running: list[tuple[FrameworkID, AgentID, str]] = []

    def accept_one(result: Sequence[Allocation | GangAllocation], now: float) -> None:
        for o in offers(result):
            if o.resources.contains(task):
                running.append((o.framework_id, o.agent_id, o.role))
                rest = o.resources - task
                if rest:
                    a.recover_resources(o.framework_id, o.agent_id, o.role, rest, now)
            else:
                a.recover_resources(o.framework_id, o.agent_id, o.role, o.resources, now)
            a.offer_closed(o.framework_id, o.agent_id, o.role)

    now = 0.0
    while len(running) < 160:  # fill the cluster, one task per offer
        now += 1
        accept_one(a.allocate(now), now)
    for _ in range(2000):  # tasks end at random; the freed slot is re-offered right away
        now += 0.01
        fw, agent_id, role = running.pop(rng.randrange(len(running)))
        a.recover_resources(fw, agent_id, role, task, now)
        accept_one(a.allocate(now, [agent_id]), now)
    light = held(a, F1).scalar("cpus") / 160
    heavy = held(a, F2).scalar("cpus") / 160
    assert light == pytest.approx(0.25, abs=0.02)
    assert heavy == pytest.approx(0.75, abs=0.02)
    assert a.role_share("light") == pytest.approx(a.role_share("heavy"), abs=0.02)


def test_weight_validation() -> None:
    a = Allocator()
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(AllocatorError):
            a.set_weight("r", bad)


def test_random_sorter_allocator_offers_everything() -> None:
    a = cluster(10, sorter="random", seed=3)
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    got = offers(a.allocate(1.0))
    assert len(got) == 10
    assert {o.framework_id for o in got} == {F1, F2}


# ---------------------------------------------------------------------- gangs


def test_gang_all_or_nothing_with_exact_parts() -> None:
    a = cluster(4, "cpus:4;mem:4096;ports:[1-10]")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    a.request_gang(F1, gang_request("g", 3, "cpus:2;mem:1024"), 0.0)
    result = a.allocate(1.0)
    assert isinstance(result[0], GangAllocation)  # gangs go before ordinary offers
    (g,) = gangs(result)
    assert (g.framework_id, g.gang_id, g.role) == (F1, GangID("g"), "*")
    assert len(g.parts) == 3
    assert len({p.agent_id for p in g.parts}) == 3  # DISTINCT
    assert all(p.resources == R("cpus:2;mem:1024") for p in g.parts)
    assert all(p.framework_id == F1 for p in g.parts)
    # The rest of the agents is offered as usual; F1's slots there are taken by the gang.
    rest = offers(result)
    assert all(o.framework_id == F2 for o in rest if o.agent_id in {p.agent_id for p in g.parts})
    assert a.pending_gangs() == 0


def test_gang_that_does_not_fit_takes_nothing() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.add_framework(F1, ["*"], 0)
    a.request_gang(F1, gang_request("g", 3, "cpus:1;mem:512"), 0.0)  # DISTINCT: 3 agents
    a.suppress(F1)
    assert a.allocate(1.0) == []
    assert a.allocated(F1) == {}
    assert a.pending_gangs() == 1
    a.add_agent(agent(2), R("cpus:4;mem:4096"), 2.0)
    (g,) = gangs(a.allocate(2.0))  # suppression stops ordinary offers only
    assert sorted(p.agent_id for p in g.parts) == [agent(0), agent(1), agent(2)]


def test_gang_pack_uses_fewest_agents() -> None:
    a = Allocator()
    a.add_agent(agent(0), R("cpus:2;mem:2048"), 0)
    a.add_agent(agent(1), R("cpus:8;mem:8192"), 0)
    a.add_agent(agent(2), R("cpus:4;mem:4096"), 0)
    a.add_agent(agent(3), R("cpus:6;mem:6144"), 0)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 11, "cpus:1;mem:1024", Placement.PACK), 0.0)
    (g,) = gangs(a.allocate(1.0))
    parts = {p.agent_id: p.resources for p in g.parts}
    # 8 on the biggest, then the 3 left on the smallest agent that holds 3 (best fit).
    assert parts == {agent(1): R("cpus:8;mem:8192"), agent(2): R("cpus:3;mem:3072")}


def test_gang_any_with_max_per_agent() -> None:
    a = cluster(3, "cpus:8;mem:8192")
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 5, "cpus:1", Placement.ANY, max_per_agent=2), 0.0)
    (g,) = gangs(a.allocate(1.0))
    slots = sorted(int(p.resources.scalar("cpus")) for p in g.parts)
    assert sum(slots) == 5 and max(slots) <= 2
    assert all(p.resources == R("cpus:1") * int(p.resources.scalar("cpus")) for p in g.parts)


def test_gang_uses_reserved_resources_of_its_role_first() -> None:
    a = cluster(2, "cpus:2;mem:2048;cpus(mpi):2;mem(mpi):2048")
    a.add_framework(F1, ["mpi"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 2, "cpus:3;mem:1024", role="mpi"), 0.0)
    (g,) = gangs(a.allocate(1.0))
    for p in g.parts:
        assert p.resources == R("cpus(mpi):2;cpus:1;mem(mpi):1024")
        assert p.resources.scalar_totals_milli() == {"cpus": 3000, "mem": 1024000}


def test_gang_occupies_the_offer_slot() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.add_framework(F1, ["*"], 0)
    a.request_gang(F1, gang_request("g", 2, "cpus:1;mem:1024"), 0.0)
    result = a.allocate(1.0)
    (g,) = gangs(result)
    assert offers(result) == []  # F1 holds the gang's offer on both agents
    for p in g.parts:
        a.offer_closed(F1, p.agent_id, "*")
    assert len(offers(a.allocate(2.0))) == 2


def test_gang_excludes_agents_with_outstanding_offer() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.add_framework(F1, ["*"], 0)
    offers(a.allocate(0.0, [agent(0)]))  # F1 holds an offer on a0
    a.recover_resources(F1, agent(0), "*", R("cpus:4;mem:4096"), 0.5)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 2, "cpus:1;mem:1024"), 0.0)
    assert gangs(a.allocate(1.0)) == []
    a.offer_closed(F1, agent(0), "*")
    (g,) = gangs(a.allocate(2.0))
    assert len(g.parts) == 2


def test_gang_request_errors() -> None:
    a = cluster(1)
    a.add_framework(F1, ["*"], 0)
    with pytest.raises(AllocatorError):
        a.request_gang(F2, gang_request("g", 1, "cpus:1"), 0)
    with pytest.raises(AllocatorError):
        a.request_gang(F1, gang_request("g", 1, "cpus:1;ports:[1-2]"), 0)
    with pytest.raises(AllocatorError):
        a.request_gang(F1, gang_request("g", 1, "cpus:1", role="other"), 0)
    a.request_gang(F1, gang_request("g", 5, "cpus:1"), 0)
    with pytest.raises(AllocatorError):  # the same id for another gang
        a.request_gang(F1, gang_request("g", 1, "cpus:1"), 0)
    a.cancel_gang(F1, GangID("g"))
    a.cancel_gang(F1, GangID("g"))  # not pending: nothing to do
    assert a.pending_gangs() == 0


def test_the_same_gang_asked_again_keeps_its_place() -> None:
    """A framework that asks again for a gang still pending (a retried REQUEST, or the batch
    service re-requesting after a restart) is not refused: the request keeps its place in the
    queue and its deadline. Found by the simulation's batch service."""
    a = cluster(1, "cpus:1;mem:1024")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    a.request_gang(F1, gang_request("first", 2, "cpus:1"), 0)  # cannot fit: waits at the head
    a.request_gang(F2, gang_request("second", 1, "cpus:1"), 1)
    a.request_gang(F1, gang_request("first", 2, "cpus:1", hold=300), 2)
    assert a.pending_gangs() == 2
    expired = a.expire(60.5)  # the first deadline holds: asking again did not extend it
    assert [g.gang_id for g in expired] == ["first"]
    with pytest.raises(AllocatorError, match="different pending gang"):
        a.request_gang(F2, gang_request("second", 2, "cpus:1"), 3)


def test_gangs_are_fifo_and_inactive_framework_waits() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F2, ["*"], 0)
    a.suppress(F1)
    a.suppress(F2)
    a.request_gang(F1, gang_request("first", 2, "cpus:3"), 1.0)
    a.request_gang(F2, gang_request("second", 2, "cpus:3"), 2.0)
    a.set_framework_active(F1, False)
    (g,) = gangs(a.allocate(3.0))
    assert g.gang_id == GangID("second")
    assert a.pending_gangs() == 1


def busy_cluster(n_agents: int) -> tuple[Allocator, list[tuple[AgentID, Resources]]]:
    """n agents of 4 cpus, all used by F2's 1-cpu tasks."""
    a = cluster(n_agents, "cpus:4;mem:4096")
    a.add_framework(F2, ["*"], 0)
    tasks: list[tuple[AgentID, Resources]] = []
    for o in offers(a.allocate(0.0)):
        a.offer_closed(F2, o.agent_id, "*")
        tasks += [(o.agent_id, R("cpus:1;mem:1024"))] * 4
    return a, tasks


def test_head_gang_not_starved_by_small_tasks() -> None:
    rng = random.Random(1)
    a, tasks = busy_cluster(4)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("big", 2, "cpus:4;mem:4096", hold=1e9), 0.0)
    now = 0.0
    got: list[GangAllocation] = []
    for _ in range(200):
        now += 1.0
        agent_id, task = tasks.pop(rng.randrange(len(tasks)))
        a.recover_resources(F2, agent_id, "*", task, now)
        result = a.allocate(now, [agent_id])
        got += gangs(result)
        for o in offers(result):  # F2 launches a task in anything it is offered
            assert o.framework_id == F2
            n = int(o.resources.scalar("cpus"))
            tasks += [(o.agent_id, R("cpus:1;mem:1024"))] * n
            a.offer_closed(F2, o.agent_id, "*")
        if got:
            break
        # Earmarked resources never reach F2.
        for i in range(4):
            assert a.available(agent(i)) == a.earmarked(agent(i))
    assert len(got) == 1, "the gang was starved"
    assert [p.resources for p in got[0].parts] == [R("cpus:4;mem:4096")] * 2
    assert all(a.earmarked(agent(i)) == EMPTY for i in range(4))


def test_without_earmarks_small_tasks_win() -> None:
    # Control for the test above: a gang that is not the head's kind (infeasible, so it does
    # not earmark) shows F2 retakes every freed cpu.
    a, tasks = busy_cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("never", 3, "cpus:4", hold=100), 0.0)  # needs 3 agents
    agent_id, task = tasks.pop()
    a.recover_resources(F2, agent_id, "*", task, 1.0)
    assert a.earmarked(agent_id) == EMPTY
    (o,) = offers(a.allocate(1.0, [agent_id]))
    assert o.framework_id == F2


def test_gang_hold_timeout_releases_earmarks_and_reports() -> None:
    a, tasks = busy_cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 2, "cpus:4;mem:4096", hold=10.0), 0.0)
    agent_id, task = tasks.pop()
    a.recover_resources(F2, agent_id, "*", task, 1.0)
    a.offer_closed(F2, agent_id, "*")
    assert a.allocate(1.0, [agent_id]) == []
    assert a.earmarked(agent_id) == R("cpus:1;mem:1024")
    assert a.expire(9.9) == []
    assert a.allocate(10.0, [agent_id]) != []  # expired: no longer holds; F2 gets it back
    (e,) = a.expire(10.0)
    assert e == GangExpired(F1, GangID("g"), e.reason)
    assert "timeout" in e.reason
    assert a.earmarked(agent_id) == EMPTY
    assert a.pending_gangs() == 0
    assert a.expire(11.0) == []


def test_expire_releases_earmarks_immediately() -> None:
    a, tasks = busy_cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 2, "cpus:4;mem:4096", hold=5.0), 0.0)
    agent_id, task = tasks.pop()
    a.recover_resources(F2, agent_id, "*", task, 1.0)
    a.offer_closed(F2, agent_id, "*")
    a.allocate(1.0, [agent_id])
    assert a.earmarked(agent_id) != EMPTY
    assert [x.gang_id for x in a.expire(6.0)] == [GangID("g")]
    assert a.earmarked(agent_id) == EMPTY
    (o,) = offers(a.allocate(6.0, [agent_id]))
    assert o.framework_id == F2 and o.resources == R("cpus:1;mem:1024")


def test_cancel_and_remove_framework_release_earmarks() -> None:
    for how in ("cancel", "remove", "deactivate"):
        a, tasks = busy_cluster(2)
        a.add_framework(F1, ["*"], 0)
        a.suppress(F1)
        a.request_gang(F1, gang_request("g", 2, "cpus:4;mem:4096"), 0.0)
        agent_id, task = tasks.pop()
        a.recover_resources(F2, agent_id, "*", task, 1.0)
        a.offer_closed(F2, agent_id, "*")
        a.allocate(1.0, [agent_id])
        assert a.earmarked(agent_id) != EMPTY
        if how == "cancel":
            a.cancel_gang(F1, GangID("g"))
        elif how == "remove":
            a.remove_framework(F1)
        else:
            a.set_framework_active(F1, False)
        assert a.earmarked(agent_id) == EMPTY, how
        assert [o.framework_id for o in offers(a.allocate(2.0, [agent_id]))] == [F2]


def test_infeasible_head_expires_and_next_gang_earmarks() -> None:
    a, tasks = busy_cluster(2)
    a.add_framework(F1, ["*"], 0)
    a.add_framework(F3, ["*"], 0)
    a.suppress(F1)
    a.suppress(F3)
    a.request_gang(F1, gang_request("huge", 3, "cpus:4", hold=5.0), 0.0)  # 3 agents: never
    a.request_gang(F3, gang_request("ok", 1, "cpus:2;mem:2048"), 0.5)
    agent_id, task = tasks.pop()
    a.recover_resources(F2, agent_id, "*", task, 1.0)
    a.offer_closed(F2, agent_id, "*")
    assert a.allocate(1.0, [agent_id]) == []
    assert a.earmarked(agent_id) == R("cpus:1;mem:1024")  # earmarked for "ok", not "huge"
    (e,) = a.expire(5.0)
    assert e.gang_id == GangID("huge")
    agent_id2, task2 = next((x, t) for x, t in tasks if x == agent_id)
    tasks.remove((agent_id2, task2))
    a.recover_resources(F2, agent_id2, "*", task2, 6.0)
    (g,) = gangs(a.allocate(6.0, [agent_id2]))
    assert g.gang_id == GangID("ok")
    assert [p.resources for p in g.parts] == [R("cpus:2;mem:2048")]


def test_gang_respects_quota_limit() -> None:
    a = cluster(2, "cpus:4;mem:4096")
    a.add_framework(F1, ["mpi"], 0)
    a.suppress(F1)
    a.set_quota("mpi", EMPTY, R("cpus:4"))
    a.request_gang(F1, gang_request("too-big", 2, "cpus:3", role="mpi", hold=5.0), 0.0)
    a.request_gang(F1, gang_request("fits", 2, "cpus:2", role="mpi"), 0.0)
    with pytest.raises(AllocatorError):
        a.request_gang(F1, gang_request("wrong-role", 1, "cpus:1", role="*"), 0.0)
    result = a.allocate(1.0)
    assert [g.gang_id for g in gangs(result)] == [GangID("fits")]


def test_pack_gang_waits_on_the_fewest_agents() -> None:
    a, tasks = busy_cluster(3)
    a.add_framework(F1, ["*"], 0)
    a.suppress(F1)
    a.request_gang(F1, gang_request("g", 4, "cpus:1;mem:1024", Placement.PACK), 0.0)

    def free_one(agent_id: AgentID, now: float) -> list[Allocation | GangAllocation]:
        tasks.remove((agent_id, R("cpus:1;mem:1024")))
        a.recover_resources(F2, agent_id, "*", R("cpus:1;mem:1024"), now)
        result = a.allocate(now, [agent_id])
        for o in offers(result):
            a.offer_closed(o.framework_id, o.agent_id, o.role)
        return result

    assert free_one(agent(0), 1.0) == []
    assert a.earmarked(agent(0)) == R("cpus:1;mem:1024")  # the plan: all 4 slots on a0
    (o,) = offers(free_one(agent(1), 2.0))  # not in the plan: F2 gets it back
    assert o.framework_id == F2 and a.earmarked(agent(1)) == EMPTY
    assert free_one(agent(0), 3.0) == []
    assert free_one(agent(0), 4.0) == []
    (g,) = gangs(free_one(agent(0), 5.0))
    assert [(p.agent_id, p.resources) for p in g.parts] == [(agent(0), R("cpus:4;mem:4096"))]
