"""Lending and reclaim in the allocator core: an unmet guarantee is lent as revocable offers,
and a claimant role below its guarantee takes back what it is owed, never below anyone's own
guarantee. Plain synchronous tests; time is an argument."""

from __future__ import annotations

from collections.abc import Iterable

from agora.master.allocator import Allocation, Allocator, AllocatorConfig, GangAllocation
from agora.master.allocator.reclaim import Candidate, Claim, ReclaimConfig, plan
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import GangRequest
from agora.sdk.resources import Resources
from hypothesis import given, settings
from hypothesis import strategies as st

R = Resources.parse
A, B = FrameworkID("fa"), FrameworkID("fb")
CFG = ReclaimConfig(min_runtime=10.0, max_victims=100)


def offers(result: Iterable[Allocation | GangAllocation]) -> list[Allocation]:
    return [x for x in result if isinstance(x, Allocation)]


def two_queues(revocable: bool = True) -> Allocator:
    """4 cpus on two agents; role a is guaranteed 2 cpus; b's framework may borrow."""
    alloc = Allocator(AllocatorConfig(seed=1))
    alloc.add_agent(AgentID("h1"), R("cpus:2;mem:2048"), 0.0)
    alloc.add_agent(AgentID("h2"), R("cpus:2;mem:2048"), 0.0)
    alloc.set_quota("a", R("cpus:2"))
    alloc.add_framework(A, ["a"], 0.0, suppressed_roles=["a"])
    alloc.add_framework(B, ["b"], 0.0, revocable=revocable)
    return alloc


def cpus(res: Resources) -> float:
    return res.scalar_totals_milli().get("cpus", 0) / 1000


def test_an_idle_guarantee_is_lent_as_revocable_offers() -> None:
    alloc = two_queues()
    got = offers(alloc.allocate(0.0))
    assert {o.framework_id for o in got} == {B}
    assert sum(cpus(o.resources) for o in got if not o.revocable) == 2.0
    assert sum(cpus(o.resources) for o in got if o.revocable) == 2.0


def test_a_framework_without_the_capability_borrows_nothing() -> None:
    alloc = two_queues(revocable=False)
    got = offers(alloc.allocate(0.0))
    assert sum(cpus(o.resources) for o in got) == 2.0
    assert not any(o.revocable for o in got)


def test_no_claim_while_the_owner_is_suppressed() -> None:
    alloc = two_queues()
    alloc.allocate(0.0)
    assert alloc.claims(1.0) == []


def test_an_owner_with_demand_claims_its_guarantee_when_nothing_is_free() -> None:
    alloc = two_queues()
    alloc.allocate(0.0)  # b holds all 4 cpus
    alloc.revive(A)
    (claim,) = alloc.claims(1.0)
    assert claim.role == "a" and claim.need == {"cpus": 2000}


def test_free_resources_shrink_the_claim() -> None:
    alloc = two_queues()
    got = offers(alloc.allocate(0.0))
    lent = next(o for o in got if o.revocable)
    alloc.recover_resources(B, lent.agent_id, lent.role, R("cpus:1"), 0.5)
    alloc.revive(A)
    (claim,) = alloc.claims(1.0)
    assert claim.need == {"cpus": 1000}


def test_an_owner_holding_its_guarantee_or_declining_it_does_not_claim() -> None:
    alloc = two_queues()
    got = offers(alloc.allocate(0.0))
    lent = next(o for o in got if o.revocable)
    alloc.recover_resources(B, lent.agent_id, lent.role, lent.resources, 0.5)
    alloc.offer_closed(B, lent.agent_id, lent.role, revocable=True)
    alloc.revive(A)
    (to_a,) = offers(alloc.allocate(1.0))
    assert to_a.framework_id == A and not to_a.revocable
    assert alloc.claims(1.5) == []  # it holds an offer of all it is owed
    alloc.recover_resources(A, to_a.agent_id, "a", to_a.resources, 2.0, refuse_seconds=30)
    alloc.offer_closed(A, to_a.agent_id, "a")
    alloc.allocate(2.5)  # lent to b again
    assert alloc.claims(3.0) == []  # a declined all of it: it does not want it
    assert alloc.claims(40.0)  # the filter has expired: a wants it again


def test_a_pending_gang_is_demand_even_when_suppressed() -> None:
    alloc = two_queues()
    alloc.allocate(0.0)
    request = GangRequest(gang_id=GangID("g"), role="a", count=2, shape=R("cpus:1"))
    alloc.request_gang(A, request, 1.0)
    assert [c.role for c in alloc.claims(1.0)] == ["a"]


def task(
    key: str,
    role: str,
    cpus: float,
    *,
    revocable: bool = False,
    priority: int = 0,
    started: float = 0.0,
    stopping: bool = False,
) -> Candidate:
    return Candidate(
        key=key,
        kind="task",
        role=role,
        scalars={"cpus": int(cpus * 1000)},
        revocable=revocable,
        priority=priority,
        started_at=started,
        stopping=stopping,
    )


def run_plan(candidates: list[Candidate], need: float = 2.0, **alloc: float) -> list[str]:
    victims = plan(
        [Claim("a", {"cpus": int(need * 1000)})],
        candidates,
        {role: {"cpus": int(v * 1000)} for role, v in alloc.items()},
        {"a": {"cpus": 2000}, "c": {"cpus": 2000}},
        {"cpus": 8000},
        100.0,
        CFG,
    )
    return [str(v.candidate.key) for v in victims]


def test_offers_go_first_then_revocable_tasks_then_newest_lowest_priority() -> None:
    cands = [
        task("b-old", "b", 1, started=1.0),
        task("b-new", "b", 1, started=50.0),
        task("b-rev", "b", 1, revocable=True, started=60.0),
        Candidate(key="b-offer", kind="offer", role="b", scalars={"cpus": 1000}),
    ]
    assert run_plan(cands, b=4) == ["b-offer", "b-rev"]
    assert run_plan(cands, need=3, b=4) == ["b-offer", "b-rev", "b-new"]
    prio = [task("hi", "b", 1, priority=5, started=1.0), task("lo", "b", 1, started=2.0)]
    assert run_plan(prio, need=1, b=2) == ["lo"]


def test_young_tasks_and_tasks_being_stopped_are_not_taken_again() -> None:
    assert run_plan([task("young", "b", 2, started=95.0)], b=2) == []
    # One already stopping covers the need: nothing more is taken.
    cands = [task("going", "b", 2, stopping=True), task("other", "b", 2)]
    assert run_plan(cands, b=4) == []


def test_never_below_the_victims_own_guarantee() -> None:
    # c holds 3 cpus and is guaranteed 2: one cpu may go, not the 2-cpu task.
    cands = [task("c-big", "c", 2), task("c-small", "c", 1, started=5.0)]
    assert run_plan(cands, c=3) == ["c-small"]


def test_the_role_furthest_above_its_guarantee_gives_first() -> None:
    cands = [task("c1", "c", 1, started=9.0), task("b1", "b", 1, started=1.0)]
    assert run_plan(cands, need=1, b=1, c=5) == ["c1"]  # c: 3 above; b: 1 above


def test_at_most_max_victims_tasks_per_round() -> None:
    cands = [task(f"t{i}", "b", 0.5, started=float(i)) for i in range(8)]
    victims = plan(
        [Claim("a", {"cpus": 4000})],
        cands,
        {"b": {"cpus": 4000}},
        {"a": {"cpus": 4000}},
        {"cpus": 8000},
        100.0,
        ReclaimConfig(min_runtime=0.0, max_victims=3),
    )
    assert len(victims) == 3


@st.composite
def scenario(
    draw: st.DrawFn,
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], list[Candidate], list[Claim]]:
    roles = ["r0", "r1", "r2", "r3"]
    guarantees = {r: {"cpus": draw(st.integers(0, 4)) * 1000} for r in roles}
    candidates: list[Candidate] = []
    allocations: dict[str, dict[str, int]] = {}
    for r in roles:
        sizes = draw(st.lists(st.integers(1, 3), max_size=6))
        for i, size in enumerate(sizes):
            candidates.append(
                Candidate(
                    key=f"{r}-{i}",
                    kind=draw(st.sampled_from(["task", "task", "offer"])),
                    role=r,
                    scalars={"cpus": size * 500},
                    revocable=draw(st.booleans()),
                    priority=draw(st.integers(0, 3)),
                    started_at=draw(st.floats(0, 100)),
                    stopping=draw(st.booleans()) and draw(st.booleans()),
                )
            )
        allocations[r] = {"cpus": sum(c.scalars["cpus"] for c in candidates if c.role == r)}
    claimants = draw(st.lists(st.sampled_from(roles), unique=True, max_size=2))
    claims = [Claim(r, {"cpus": draw(st.integers(1, 6)) * 500}) for r in claimants]
    return allocations, guarantees, candidates, claims


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_property_no_role_is_taken_below_its_guarantee(
    case: tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], list[Candidate], list[Claim]],
) -> None:
    allocations, guarantees, candidates, claims = case
    cfg = ReclaimConfig(min_runtime=20.0, max_victims=5)
    victims = plan(claims, candidates, allocations, guarantees, {"cpus": 40000}, 100.0, cfg)
    claimants = {c.role for c in claims}
    taken: dict[str, int] = {}
    for c in candidates:
        if c.stopping:
            taken[c.role] = taken.get(c.role, 0) + c.scalars["cpus"]
    keys = [v.candidate.key for v in victims]
    assert len(keys) == len(set(keys))
    assert sum(v.candidate.kind == "task" for v in victims) <= cfg.max_victims
    for v in victims:
        c = v.candidate
        assert c.role not in claimants and not c.stopping
        assert c.kind == "offer" or 100.0 - c.started_at >= cfg.min_runtime
        taken[c.role] = taken.get(c.role, 0) + c.scalars["cpus"]
    for role, amount in taken.items():
        if role in claimants or not any(v.candidate.role == role for v in victims):
            continue
        assert allocations[role]["cpus"] - amount >= guarantees[role]["cpus"]
