"""What lending and reclaim cost the master per allocation cycle, at 10,000 agents.

    .venv/bin/python tests/bench/reclaim.py --agents 10000 --frameworks 1000 --tasks 100000

A sans-IO master core is filled through its ordinary stimuli: ``--agents`` agents register
(cpus:10;mem:65536 each: 100,000 one-cpu tasks fill 10,000 of them); role ``a`` has a quota
guarantee of ``--guarantee`` cpus, and its one framework subscribes suppressed (it wants
nothing yet); ``--frameworks`` frameworks in ten roles
``b0``..``b9`` take revocable offers. Allocations run until every cpu is offered (a's guarantee
lent as revocable offers), and each offer is accepted launching one-cpu tasks, ``--tasks`` in all,
reported RUNNING. Then, in milliseconds (median and max over ``--runs``):

* ``cycle_off_ms`` / ``cycle_on_ms``: one full ``Master.tick`` allocation cycle with reclaim off
  and on while nobody claims (reclaim's standing cost is finding no claimant);
* ``reclaim_idle_ms``: ``reclaim`` alone when nobody claims;
* ``reclaim_claim_ms``: ``reclaim`` when role ``a`` wants its guarantee back (it has revived):
  finding the claim, gathering every task and offer as a candidate, planning, and sending the
  kills (each run starts from the same state: the previous run's victims are un-marked);
* ``victims``: tasks one round stops (bounded by ``--max-victims``).

Each as min, median and max: with 100,000 tasks in the heap a full garbage collection that
lands inside a timing adds tens of milliseconds; on a shared machine read min and p50.

The issue's target: reclaim decisions at 10,000 agents x 1,000 frameworks cost <= 50 ms per
allocation cycle on top of today's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core import Master, MasterConfig, Send
from agora.master.core import reclaim as reclaim_step
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    Accept,
    AgentInfo,
    CommandInfo,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    KillTask,
    Launch,
    Offer,
    Offers,
    RegisterAgent,
    Revive,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Subscribe,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources

AGENT = Resources.parse("cpus:10;mem:65536")
TASK = Resources.parse("cpus:1;mem:1024")


def build(agents: int, frameworks: int, tasks: int, guarantee: int, victims: int) -> Master:
    config = MasterConfig(
        master_id="bench",
        bursts=True,
        quotas={"a": (Resources.parse(f"cpus:{guarantee}"), None)},
        reclaim=ReclaimConfig(min_runtime=0.0, max_victims=victims),
    )
    core = Master(config)
    now = 1.0
    for i in range(agents):
        core.handle(
            f"agent-{i}",
            RegisterAgent(agent_info=AgentInfo(hostname=f"h{i}", resources=AGENT)),
            now,
        )
    owner = FrameworkInfo(name="owner", user="bench", roles=("a",))
    core.handle("owner", Subscribe(framework_info=owner, suppressed_roles=("a",)), now)
    for j in range(frameworks):
        info = FrameworkInfo(
            name=f"bench-{j}",
            user="bench",
            roles=(f"b{j % 10}",),
            capabilities=(FrameworkCapability.REVOCABLE_RESOURCES,),
        )
        core.handle(f"fw-{j}", Subscribe(framework_info=info), now)
    peers = {a.agent_id: a.peer for a in core.state.agents.values()}
    launched: list[tuple[str, FrameworkID, str]] = []
    serial = 0
    offers: list[tuple[str, Offer]] = []

    def collect(actions: list[Send]) -> None:
        for action in actions:
            if isinstance(action, Send) and isinstance(action.message, Offers):
                offers.extend((action.to, o) for o in action.message.offers)

    for _round in range(4):  # ordinary offers first, then what a's guarantee lends
        now += 1.0
        collect(core.tick(now))
        # A framework's offers on one agent are accepted together: its memory may be in an
        # ordinary offer and the cpus lent beside it in a revocable one.
        grouped: dict[tuple[str, str], list[Offer]] = {}
        for fw_peer, offer in offers:
            grouped.setdefault((fw_peer, offer.agent_id), []).append(offer)
        offers.clear()
        for (fw_peer, _agent), held in grouped.items():
            offer = held[0]
            pool = Resources()
            for o in held:
                pool = pool + o.resources
            have = pool.scalar_totals_milli()
            fit = min(have.get("cpus", 0) // 1000, have.get("mem", 0) // 1_024_000)
            room = min(fit, tasks - len(launched))
            infos = []
            for _ in range(room):
                serial += 1
                infos.append(
                    TaskInfo(
                        task_id=TaskID(f"t{serial}"),
                        name=f"t{serial}",
                        agent_id=offer.agent_id,
                        resources=TASK,
                        command=CommandInfo(value="sleep 3600"),
                    )
                )
            accept = Accept(
                framework_id=offer.framework_id,
                offer_ids=tuple(o.offer_id for o in held),
                operations=(Launch(task_infos=tuple(infos)),) if infos else (),
                filters=Filters(refuse_seconds=3600.0),
            )
            collect(core.handle(fw_peer, accept, now))
            launched.extend((peers[offer.agent_id], offer.framework_id, t.task_id) for t in infos)
        collect(core.end_burst(now))
    for n, (agent_peer, framework_id, task_id) in enumerate(launched, 1):
        status = TaskStatus(
            task_id=TaskID(task_id),
            state=TaskState.RUNNING,
            source=StatusSource.EXECUTOR,
            uuid=n.to_bytes(16, "big"),
            timestamp=now,
        )
        update = StatusUpdateMessage(update=StatusUpdate(framework_id=framework_id, status=status))
        core.handle(agent_peer, update, now)
    core.end_burst(now)
    return core


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "min": round(min(samples), 2),
        "p50": round(statistics.median(samples), 2),
        "max": round(max(samples), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--frameworks", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--guarantee", type=int, default=4_000, help="role a's cpus")
    parser.add_argument("--max-victims", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    core = build(args.agents, args.frameworks, args.tasks, args.guarantee, args.max_victims)
    setup_s = time.perf_counter() - start
    st = core.state
    now = 1000.0
    revocable = sum(1 for t in st.tasks.values() if t.revocable)

    def cycle(enabled: bool) -> Callable[[], object]:
        def run() -> object:
            nonlocal now
            now += 1.0
            st.config = replace(st.config, reclaim=replace(st.config.reclaim, enabled=enabled))
            st.full_allocation_due = True
            return core.tick(now)

        return run

    cycle_off = timed(cycle(False), args.runs)
    cycle_on = timed(cycle(True), args.runs)

    def idle() -> object:
        st.next_reclaim_at = 0.0
        return reclaim_step.reclaim(st, now)

    reclaim_idle = timed(idle, args.runs)
    assert st.allocator.claims(now) == []
    core.handle("owner", Revive(framework_id=st.frameworks_by_peer["owner"]), now)
    core.end_burst(now)
    victims: list[int] = []

    def claim() -> object:
        for task in st.tasks.values():
            task.stop_reason = None
        st.outbox.clear()
        st.next_reclaim_at = 0.0
        reclaim_step.reclaim(st, now)
        victims.append(sum(1 for a in st.outbox if isinstance(a.message, KillTask)))
        return None

    reclaim_claim = timed(claim, args.runs)
    print(
        json.dumps(
            {
                "agents": args.agents,
                "frameworks": args.frameworks,
                "tasks": len(st.tasks),
                "revocable_tasks": revocable,
                "guarantee_cpus": args.guarantee,
                "cycle_off_ms": summary(cycle_off),
                "cycle_on_ms": summary(cycle_on),
                "reclaim_idle_ms": summary(reclaim_idle),
                "reclaim_claim_ms": summary(reclaim_claim),
                "victims": victims[-1],
                "setup_s": round(setup_s, 1),
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
