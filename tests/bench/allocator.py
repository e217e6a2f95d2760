"""Allocator benchmark (Mesos ``HierarchicalAllocator_BENCHMARK_Test`` style).

    .venv/bin/python tests/bench/allocator.py --agents 10000 --frameworks 1000

One role ``*``, every framework wants everything, no filters, no quota, no gangs.

* ``full_cycle_ms`` — one ``allocate(now)`` over every agent after all agents and frameworks
  were added (median over ``--rounds``; between rounds every allocation is recovered with no
  filter and its offer closed).
* ``event_alloc_p50_us`` / ``event_alloc_p99_us`` — allocator work after one task's resources
  are released on one agent of a fully used cluster: ``recover_resources`` of a task-sized
  piece + ``offer_closed`` + ``allocate(now, [agent])`` (``--samples`` of them; the new
  offer is then treated as accepted, i.e. its slot closed, outside the timing).

With ``--reclaim``: role ``claim`` has a quota guarantee of 5% of the cluster's cpus and one
framework, suppressed at first; the ``--frameworks`` take revocable offers, so the full cycles
lend that guarantee (stage 3). Then the claimant revives and the bench times, over
``--rounds``, the allocator's part of a reclaim round: ``reclaim_claims_ms`` (finding the claim)
and ``reclaim_plan_ms`` (planning over every allocation as a candidate task, one per
framework per agent, 10% of them revocable). The master's part (gathering candidates from its
tasks) is measured by ``tests/bench/reclaim.py``.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time

from agora.master.allocator import Allocation, Allocator, AllocatorConfig
from agora.master.allocator.reclaim import Candidate, ReclaimConfig
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.resources import Resources

TASK = Resources.parse("cpus:1;mem:2048")


def agent_resources(rng: random.Random) -> Resources:
    cpus = rng.choice((12, 16, 16, 16, 20, 24))
    mem = cpus * 4096
    return Resources.parse(f"cpus:{cpus};mem:{mem};disk:1048576;ports:[31000-32000]")


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--frameworks", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reclaim", action="store_true", help="quota, lending and reclaim on")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    allocator = Allocator(AllocatorConfig(seed=args.seed))
    now = 0.0
    setup_start = time.perf_counter()
    frameworks = [FrameworkID(f"fw-{i:05d}") for i in range(args.frameworks)]
    for fw in frameworks:
        allocator.add_framework(fw, ["*"], now, revocable=args.reclaim)
    agents = [AgentID(f"agent-{i:06d}") for i in range(args.agents)]
    for agent in agents:
        allocator.add_agent(agent, agent_resources(rng), now)
    claimant = FrameworkID("claimant")
    if args.reclaim:
        cpus = sum(allocator.total(a).scalar_totals_milli()["cpus"] for a in agents) // 1000
        allocator.set_quota("claim", Resources.parse(f"cpus:{max(1, cpus // 20)}"))
        allocator.add_framework(claimant, ["claim"], now, suppressed_roles=["claim"])
    setup_s = time.perf_counter() - setup_start

    gc.collect()
    cycles: list[float] = []
    offers: list[Allocation] = []
    for round_ in range(args.rounds):
        now += 1.0
        if round_:
            for offer in offers:
                allocator.recover_resources(
                    offer.framework_id, offer.agent_id, offer.role, offer.resources, now, None
                )
                allocator.offer_closed(offer.framework_id, offer.agent_id, offer.role)
        start = time.perf_counter()
        result = allocator.allocate(now)
        cycles.append((time.perf_counter() - start) * 1000)
        offers = [o for o in result if isinstance(o, Allocation)]

    # Steady state: the last cycle's offers are all accepted (in use), the cluster is full.
    holders: dict[AgentID, dict[FrameworkID, Resources]] = {}
    for offer in offers:
        allocator.offer_closed(offer.framework_id, offer.agent_id, offer.role)
        holders.setdefault(offer.agent_id, {})[offer.framework_id] = offer.resources
    samples: list[float] = []
    misses = 0
    timer = time.perf_counter
    while len(samples) < args.samples:
        agent = rng.choice(agents)
        mine = holders.get(agent, {})
        owner = next((fw for fw, res in mine.items() if res.contains(TASK)), None)
        if owner is None:
            misses += 1
            if misses > 100 * args.samples:
                raise SystemExit("cluster too small for the requested samples")
            continue
        now += 0.001
        start = timer()
        allocator.recover_resources(owner, agent, "*", TASK, now, None)
        allocator.offer_closed(owner, agent, "*")
        result = allocator.allocate(now, [agent])
        samples.append((timer() - start) * 1e6)
        left = mine[owner] - TASK
        if left:
            mine[owner] = left
        else:
            del mine[owner]
        for item in result:
            assert isinstance(item, Allocation)
            allocator.offer_closed(item.framework_id, item.agent_id, item.role)
            have = mine.get(item.framework_id)
            mine[item.framework_id] = item.resources if have is None else have + item.resources
    samples.sort()
    extra: dict[str, object] = {}
    if args.reclaim:
        extra = reclaim_figures(allocator, frameworks, claimant, args.rounds, now, rng)

    print(
        json.dumps(
            {
                "agents": args.agents,
                "frameworks": args.frameworks,
                "full_cycle_ms": round(statistics.median(cycles), 1),
                "event_alloc_p50_us": round(percentile(samples, 0.50), 1),
                "event_alloc_p99_us": round(percentile(samples, 0.99), 1),
                "cycles_ms": [round(c, 1) for c in cycles],
                "offers_per_cycle": len(offers),
                "samples": len(samples),
                "setup_s": round(setup_s, 2),
                "python": sys.version.split()[0],
                **extra,
            }
        )
    )


def reclaim_figures(
    allocator: Allocator,
    frameworks: list[FrameworkID],
    claimant: FrameworkID,
    rounds: int,
    now: float,
    rng: random.Random,
) -> dict[str, object]:
    """The allocator's part of a reclaim round once the claimant wants its guarantee."""
    allocator.revive(claimant)
    candidates = []
    for fw in frameworks:
        for (agent, role), res in allocator.allocated(fw).items():
            if role == "claim":
                continue
            candidates.append(
                Candidate(
                    key=(fw, agent, role),
                    kind="task",
                    role=role,
                    scalars=res.scalar_totals_milli(),
                    revocable=rng.random() < 0.1,
                    started_at=rng.uniform(0.0, now),
                )
            )
    config = ReclaimConfig(min_runtime=0.0)
    claims_ms: list[float] = []
    plan_ms: list[float] = []
    victims = 0
    for _ in range(rounds):
        start = time.perf_counter()
        claims = allocator.claims(now)
        claims_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        victims = len(allocator.plan_reclaim(claims, candidates, now, config))
        plan_ms.append((time.perf_counter() - start) * 1000)
    return {
        "reclaim_claims_ms": round(statistics.median(claims_ms), 2),
        "reclaim_plan_ms": round(statistics.median(plan_ms), 2),
        "reclaim_candidates": len(candidates),
        "reclaim_victims": victims,
        "reclaim_need": {c.role: c.need for c in allocator.claims(now)},
    }


if __name__ == "__main__":
    main()
