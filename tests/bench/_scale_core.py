"""The scale bench's core phase, in a process of its own: one master core at full size.

    python tests/bench/_scale_core.py --agents 10000 --frameworks 1000 --tasks 100000

Fills a sans-IO master core through its ordinary stimuli (:func:`state.build`: a registration
storm handled in bursts as the daemon handles it, subscriptions, one allocation, accepts,
RUNNING updates), then measures what the issue names at that size: the process's resident
memory, the allocation cycle (every outstanding offer declined, then one timed full allocation
over every agent and framework; ``--cycles`` times), and the operator views (``state.measure``:
``/state`` over HTTP, the whole GET_STATE and the console's partial one). With ``--tracemalloc``
it reports instead where the core's memory goes (tracemalloc slows the build several times, so
its run times nothing). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from typing import Any

from agora.master.core import Master
from agora.sdk.messages import Decline, Filters
from state import build, measure, percentiles, unlimited_frames


def rss_mib() -> float:
    """This process's resident set now (VmRSS), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS in /proc/self/status")


def allocation_cycles(core: Master, cycles: int) -> list[float]:
    """Milliseconds of ``cycles`` full allocations, each after every outstanding offer was
    declined (so each offers every agent's free resources again)."""
    st = core.state
    now = 10.0
    out = []
    for _ in range(cycles):
        outstanding = list(st.offers.values())
        for offer in outstanding:
            peer = st.frameworks[offer.framework_id].peer
            assert peer is not None
            decline = Decline(
                framework_id=offer.framework_id,
                offer_ids=(offer.offer_id,),
                filters=Filters(refuse_seconds=0.0),
            )
            core.handle(peer, decline, now)
        now += st.config.allocation_interval + 1.0
        start = time.perf_counter()
        core.tick(now)
        out.append((time.perf_counter() - start) * 1000)
        if len(st.offers) < len(outstanding) // 2:
            raise SystemExit(f"a full allocation offered {len(st.offers)} of {len(outstanding)}")
    return out


def where_memory_goes(agents: int, frameworks: int, tasks: int) -> dict[str, Any]:
    tracemalloc.start()
    core = build(agents, frameworks, tasks)
    gc.collect()
    snap = tracemalloc.take_snapshot()
    traced, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    by_file = snap.statistics("filename")[:12]
    by_line = snap.statistics("lineno")[:12]
    del core
    return {
        "traced_mib": round(traced / 2**20, 1),
        "by_file": [
            {"file": _short(str(s.traceback[0].filename)), "mib": round(s.size / 2**20, 1)}
            for s in by_file
        ],
        "by_line": [
            {
                "where": f"{_short(str(s.traceback[0].filename))}:{s.traceback[0].lineno}",
                "mib": round(s.size / 2**20, 1),
                "blocks": s.count,
            }
            for s in by_line
        ],
    }


def _short(path: str) -> str:
    for marker in ("/agora/", "/site-packages/", "/lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--frameworks", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args(argv)
    if args.tracemalloc:
        print(json.dumps(where_memory_goes(args.agents, args.frameworks, args.tasks)))
        return
    before = rss_mib()
    stages: dict[str, float] = {}
    core = build(args.agents, args.frameworks, args.tasks, stages)
    gc.collect()
    rss = rss_mib()
    cycles = allocation_cycles(core, args.cycles)
    with unlimited_frames():
        views = measure(core, args.runs, args.agents, args.tasks, profile=False)
    out = {
        "agents": args.agents,
        "frameworks": args.frameworks,
        "tasks": args.tasks,
        "rss_mib": rss,
        "rss_before_build_mib": before,
        "registration_storm_s": round(stages["register"], 3),
        "register_per_agent_us": round(stages["register"] / args.agents * 1e6, 1),
        "stages_s": {k: round(v, 3) for k, v in stages.items()},
        "allocation_cycle_ms": percentiles(cycles),
        "state_http_ms": views["http_state"],
        "state_http_parse_ms": views["http_state_parse"],
        "get_state": views["snapshot_and_pack"],
        "console": views["console"],
        "metrics_http_ms": views["http_metrics"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
