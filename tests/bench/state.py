"""What an operator's view of a big cluster costs: ``/state`` with 10,000 simulated agents.

    .venv/bin/python tests/bench/state.py --agents 10000 --frameworks 50 --tasks 20000

A sans-IO master core is filled through its ordinary stimuli: ``--agents`` agents register
(cpus:16;mem:65536 each), ``--frameworks`` schedulers subscribe, one allocation offers every
agent, each offer is accepted launching its share of ``--tasks`` one-cpu tasks, and every agent
reports its tasks RUNNING. The core is then served by the daemon's own operator app
(``agora.master.server.http.make_app``) on an ephemeral port, and over ``--runs`` runs (after one
warm-up) the bench times, in milliseconds:

* ``http_state``: ``GET /state`` over real HTTP (aiohttp client in the same event loop): the
  document built, JSON-encoded, sent and read; ``http_state_parse``: the client's ``json.loads``;
* ``http_summary``: ``GET /state/summary``; ``http_metrics``: ``GET /metrics``;
* ``snapshot``: ``agora.master.core.operator.snapshot(core.state)``, ``pack``: that StateReply
  encoded with the SDK codec, ``snapshot_and_pack`` both (what ``agora state``/``agora top`` ask
  for over ZeroMQ), and ``unpack``: the client's ``codec.decode`` of that frame;
* ``console``: what ``agora top`` asks a big cluster for on each poll, a partial state
  (``GetState(agents_limit=40, tasks_limit=40)``: the agents to see and the busiest, the tasks
  updated last, the whole cluster's counts and sums): ``snapshot_and_pack`` (the core's
  ``snapshot`` with that query and the codec's encode), ``unpack`` (the client's decode) and the
  frame's ``bytes``.

Each as min/p50/p95/max; body and frame sizes in bytes. The issue's target: /state <= 200 ms at
10,000 agents. What the accepts leave of each agent is offered again to another framework, so
/state also lists ``outstanding_offers`` offers. The client runs in the bench's process, beside
the core's heap, as the server does; its own times (parse, unpack) carry that heap's garbage
collections too, which a separate ``agora top`` process would not. On a shared machine read min
and p50. ``--profile`` prints where the time of a few ``GET /state`` goes (cProfile, to
stderr). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import aiohttp
from agora.master.core import Master, MasterConfig, Send
from agora.master.core.operator import snapshot
from agora.master.server.http import make_app, start_http
from agora.master.server.http_access import OPEN
from agora.master.server.metrics import DaemonStats
from agora.sdk import codec
from agora.sdk.codec import MAX_FRAME_BYTES
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    Accept,
    AgentInfo,
    CommandInfo,
    Filters,
    FrameworkInfo,
    GetState,
    Launch,
    Offer,
    Offers,
    RegisterAgent,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Subscribe,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources

AGENT = Resources.parse("cpus:16;mem:65536")
TASK = Resources.parse("cpus:1;mem:1024")
TASKS_PER_AGENT = 16  # how many TASKs fit on one AGENT
TARGET_MS = 200.0
#: The partial state ``agora top`` asks a big cluster for (a tall screen's rows).
CONSOLE_QUERY = GetState(agents_limit=40, tasks_limit=40)


def percentiles(samples: Iterable[float]) -> dict[str, float]:
    values = sorted(samples)
    if not values:
        return {}

    def at(q: float) -> float:
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    return {
        "min": round(values[0], 2),
        "p50": round(at(0.5), 2),
        "p95": round(at(0.95), 2),
        "max": round(values[-1], 2),
    }


#: Messages the master daemon handles before one end-of-burst allocation (its MAX_BATCH).
BURST = 1024


def build(
    agents: int, frameworks: int, tasks: int, stages: dict[str, float] | None = None
) -> Master:
    """A core with ``agents`` agents, ``frameworks`` frameworks and ``tasks`` RUNNING tasks.

    ``stages``, if given, gets the seconds each stage took: ``register`` (every agent registers
    at once, handled in bursts as the daemon does), ``subscribe``, ``launch`` and ``running``."""
    if tasks > agents * TASKS_PER_AGENT:
        raise SystemExit(f"{tasks} tasks do not fit on {agents} agents of {AGENT}")
    core = Master(MasterConfig(master_id="bench", address="tcp://127.0.0.1:5050", bursts=True))
    now = 1.0
    stages = stages if stages is not None else {}
    mark = time.perf_counter()
    for i in range(agents):
        info = AgentInfo(hostname=f"host-{i:05d}", resources=AGENT)
        core.handle(f"agent-{i}", RegisterAgent(agent_info=info), now)
        if (i + 1) % BURST == 0:
            core.end_burst(now)
    core.end_burst(now)
    stages["register"], mark = time.perf_counter() - mark, time.perf_counter()
    peers = {a.agent_id: a.peer for a in core.state.agents.values()}
    for j in range(frameworks):
        fw_info = FrameworkInfo(name=f"bench-{j}", user="bench")
        core.handle(f"fw-{j}", Subscribe(framework_info=fw_info), now)
    stages["subscribe"], mark = time.perf_counter() - mark, time.perf_counter()
    by_framework: dict[str, list[Offer]] = {}
    for action in core.tick(now):
        if isinstance(action, Send) and isinstance(action.message, Offers):
            by_framework.setdefault(action.to, []).extend(action.message.offers)
    offers = [(peer, o) for peer, fw_offers in by_framework.items() for o in fw_offers]
    if len(offers) < agents:
        raise SystemExit(f"one allocation offered {len(offers)} of {agents} agents")
    base, extra = divmod(tasks, len(offers))
    launched: list[tuple[str, FrameworkID, str]] = []  # agent peer, framework, task id
    for n, (fw_peer, offer) in enumerate(offers):
        infos = tuple(
            TaskInfo(
                task_id=TaskID(f"task-{n}-{k}"),
                name=f"bench-{n}-{k}",
                agent_id=offer.agent_id,
                resources=TASK,
                command=CommandInfo(value="sleep 3600"),
            )
            for k in range(base + (n < extra))
        )
        accept = Accept(
            framework_id=offer.framework_id,
            offer_ids=(offer.offer_id,),
            operations=(Launch(task_infos=infos),) if infos else (),
            filters=Filters(refuse_seconds=3600.0),
        )
        core.handle(fw_peer, accept, now)
        launched.extend((peers[offer.agent_id], offer.framework_id, t.task_id) for t in infos)
    stages["launch"], mark = time.perf_counter() - mark, time.perf_counter()
    now += 1.0
    for serial, (agent_peer, framework_id, task_id) in enumerate(launched, 1):
        status = TaskStatus(
            task_id=TaskID(task_id),
            state=TaskState.RUNNING,
            source=StatusSource.EXECUTOR,
            uuid=serial.to_bytes(16, "big"),
            timestamp=now,
        )
        update = StatusUpdateMessage(update=StatusUpdate(framework_id=framework_id, status=status))
        core.handle(agent_peer, update, now)
    core.end_burst(now)
    stages["running"] = time.perf_counter() - mark
    running = sum(1 for t in core.state.tasks.values() if t.state is TaskState.RUNNING)
    if running != tasks:
        raise SystemExit(f"{running} of {tasks} tasks RUNNING after the launch")
    return core


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm-up
    out: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


async def serve_and_time(
    core: Master, runs: int, agents: int, tasks: int, profile: bool
) -> dict[str, Any]:
    runner, base = await start_http(
        make_app(lambda: core, DaemonStats(), access=OPEN), "127.0.0.1", 0
    )
    result: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:

            async def get(path: str) -> bytes:
                async with session.get(base + path) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"GET {path}: {resp.status} {body[:200]!r}")
                    return body

            state_body = b""
            for name, path in (
                ("http_state", "/state"),
                ("http_summary", "/state/summary"),
                ("http_metrics", "/metrics"),
            ):
                body = await get(path)  # warm-up
                samples = []
                for _ in range(runs):
                    start = time.perf_counter()
                    body = await get(path)
                    samples.append((time.perf_counter() - start) * 1000)
                result[name] = {**percentiles(samples), "bytes": len(body)}
                if path == "/state":
                    state_body = body
            doc = json.loads(state_body)
            if (len(doc["agents"]), len(doc["tasks"])) != (agents, tasks):
                raise SystemExit(
                    f"/state has {len(doc['agents'])} agents, {len(doc['tasks'])} tasks"
                )
            result["http_state_parse"] = percentiles(timed(lambda: json.loads(state_body), runs))
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(5):
                    await get("/state")
                prof.disable()
                for order, lines in (("cumulative", 30), ("tottime", 20)):
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats(order).print_stats(lines)
                    print(text.getvalue(), file=sys.stderr)
    finally:
        await runner.cleanup()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--frameworks", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--profile", action="store_true", help="cProfile GET /state to stderr")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    core = build(args.agents, args.frameworks, args.tasks)
    build_s = time.perf_counter() - start

    with unlimited_frames():
        out = measure(core, args.runs, args.agents, args.tasks, args.profile)
    out["build_s"] = round(build_s, 2)
    out["frameworks"] = args.frameworks
    print(json.dumps(out))


@contextlib.contextmanager
def unlimited_frames() -> Iterator[None]:
    """Let the codec make and read frames over its limit, to time and size what a whole state
    would be (the master answers a GET_STATE whose reply is over it with an error)."""
    saved = codec.MAX_FRAME_BYTES
    codec.MAX_FRAME_BYTES = 1 << 40  # type: ignore[misc]
    try:
        yield
    finally:
        codec.MAX_FRAME_BYTES = saved  # type: ignore[misc]


def measure(core: Master, runs: int, agents: int, tasks: int, profile: bool) -> dict[str, Any]:
    """Every figure of the module's docstring for ``core`` (see :func:`unlimited_frames`)."""
    http = asyncio.run(serve_and_time(core, runs, agents, tasks, profile))

    def snap_and_pack() -> bytes:
        return codec.encode(snapshot(core.state), epoch=core.epoch)

    reply = snapshot(core.state)
    frame = codec.encode(reply, epoch=core.epoch)

    def console_snap_and_pack() -> bytes:
        return codec.encode(snapshot(core.state, CONSOLE_QUERY), epoch=core.epoch)

    console_frame = console_snap_and_pack()
    big = 1 << 40
    return {
        "agents": agents,
        "tasks": tasks,
        "runs": runs,
        "target_state_ms": TARGET_MS,
        **{k: v for k, v in http.items() if k.startswith("http_state")},
        "state_within_target": http["http_state"]["p95"] <= TARGET_MS,
        "http_summary": http["http_summary"],
        "http_metrics": http["http_metrics"],
        "snapshot": percentiles(timed(lambda: snapshot(core.state), runs)),
        "pack": percentiles(timed(lambda: codec.encode(reply, epoch=core.epoch), runs)),
        "snapshot_and_pack": {
            **percentiles(timed(snap_and_pack, runs)),
            "bytes": len(frame),
            "frame_limit_bytes": MAX_FRAME_BYTES,
            "fits_one_frame": len(frame) <= MAX_FRAME_BYTES,
        },
        "unpack": percentiles(timed(lambda: codec.decode(frame, max_frame_bytes=big), runs)),
        "console": {
            "query": {
                "agents_limit": CONSOLE_QUERY.agents_limit,
                "tasks_limit": CONSOLE_QUERY.tasks_limit,
            },
            "snapshot_and_pack": percentiles(timed(console_snap_and_pack, runs)),
            "unpack": percentiles(timed(lambda: codec.decode(console_frame), runs)),
            "bytes": len(console_frame),
        },
        "outstanding_offers": len(core.state.offers),
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    main()
