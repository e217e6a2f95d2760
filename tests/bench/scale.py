"""Scale: 10,000 agents, 100,000 tasks and 1,000 frameworks on one master group.

    .venv/bin/python tests/bench/scale.py                      # 10,000 agents, then 20,000
    .venv/bin/python tests/bench/scale.py --agents 2000 --tasks 20000 --frameworks 100 --kills 2

Two phases, one JSON line.

``sockets``: 3 masters as processes (``--insecure``: the simulated peers speak ZMTP without
CURVE) and, in a thread of this process, ``--frameworks`` simulated schedulers and ``--agents``
simulated agents, one TCP connection each (``_zmtp_sim``). The schedulers subscribe and decline
every offer; then every agent registers at once (the registration storm: ``storm_s``); then
every agent re-registers reporting its share of ``--tasks`` RUNNING tasks, so the leader holds
them all. Measured there: the leader's resident memory (``leader_rss_mib``), ``GET /state`` on
its HTTP API (``state_http_ms``, ``state_bytes``), its allocation runs so far (from
``/metrics``), and ``--kills`` rounds of: SIGKILL the leader; a survivor is the active leader
(``elected_s``); every agent has re-registered with its tasks (``reregistered_s``); the new
leader counts every agent ACTIVE (``all_active_s``); the killed master rejoins. ``step_downs``
counts the leaders that lost the lead without being killed (``leadership_lost`` in the masters'
logs): the target is zero, through the storm and every kill.

``core``: for each size in ``--core-sizes`` (default: ``--agents`` and 20,000), a process of its
own (``_scale_core``) builds one master core at that size and reports its memory, the cost of a
registration storm per agent, the allocation cycle, ``/state``, the whole GET_STATE (its size
against the frame limit) and the console's partial state; plus, for ``--agents``, where the
memory goes (tracemalloc).

The masters' descriptors bound the socket phase: each simulated peer is one connection at the
leader, whose RLIMIT_NOFILE hard limit (20,000 here) can be raised only with CAP_SYS_RESOURCE.
More agents than fit are carried over ``--relay-links`` connections (by default one per 1,000
agents), each speaking to the leader as ``agora-relay`` does: the leader then handles every
agent as a peer of its own, as with relays in a real cluster (``relay_links`` in the JSON).
With ``--relay-links 0`` the JSON says in ``limited_by`` how many agents did not fit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/bench for the helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.*

from _failover_procs import Daemon, Group, Probe, percentiles
from _failover_scale import Leader, _wait, kill_round, step_downs
from agora.sdk.cli.cluster import free_ports
from agora.sdk.logs import configure_logging
from support.zmtp_sim import SimPeers

_STORM_TIMEOUT = 600.0
_FDS_RESERVED = 400  # a master's own: its peers, HTTP, logs, Raft files, ZeroMQ's threads
_T0 = time.perf_counter()


def _say(text: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {text}", file=sys.stderr, flush=True)


def fd_room() -> tuple[int, str | None]:
    """How many simulated peers fit (the masters inherit this limit), and why no more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    why = (
        f"RLIMIT_NOFILE hard limit {hard} per process (raising it needs CAP_SYS_RESOURCE): "
        "one descriptor per simulated peer at the leader"
    )
    return hard - _FDS_RESERVED, why


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def http_get(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def time_state(port: int, runs: int) -> dict[str, Any]:
    samples = []
    body = b""
    for _ in range(runs + 1):  # the first warms up
        start = time.perf_counter()
        body = http_get(f"http://127.0.0.1:{port}/state")
        samples.append((time.perf_counter() - start) * 1000)
    doc = json.loads(body)
    return {
        **percentiles(samples[1:]),
        "bytes": len(body),
        "agents": len(doc["agents"]),
        "tasks": len(doc["tasks"]),
        "frameworks": len(doc["frameworks"]),
    }


def allocation_runs(port: int) -> dict[str, Any]:
    """The leader's allocation runs so far, from its /metrics histogram."""
    text = http_get(f"http://127.0.0.1:{port}/metrics").decode()
    total = float(_metric(text, "agora_master_allocation_run_seconds_sum"))
    count = int(float(_metric(text, "agora_master_allocation_run_seconds_count")))
    buckets = [
        (float(m.group(1)), int(float(m.group(2))))
        for m in re.finditer(
            r'^agora_master_allocation_run_seconds_bucket\{le="([0-9.e+-]+)"\} (\S+)$',
            text,
            re.M,
        )
    ]
    slowest = next((le for le, n in buckets if n == count), None)
    return {
        "runs": count,
        "mean_ms": round(total / count * 1000, 2) if count else None,
        "all_within_s": slowest,
    }


def _metric(text: str, name: str) -> str:
    found = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    if found is None:
        raise RuntimeError(f"{name} not in /metrics")
    return found.group(1)


async def run_sockets(
    group: Group,
    agents: int,
    frameworks: int,
    tasks: int,
    kills: int,
    links: int = 0,
    relays: int = 0,
) -> dict[str, Any]:
    group.start_masters(("--agent-reregister-timeout", "600"), http=True)
    relay_daemons: list[Daemon] = []
    try:
        start_relays(group, relays, relay_daemons)
        return await _measure(group, agents, frameworks, tasks, kills, links, relay_daemons)
    finally:
        for daemon in relay_daemons:
            daemon.kill()


async def _measure(
    group: Group,
    agents: int,
    frameworks: int,
    tasks: int,
    kills: int,
    links: int,
    relay_daemons: list[Daemon],
) -> dict[str, Any]:
    port_of = dict(zip(group.endpoints, group.http_ports, strict=True))
    per_agent = tasks // agents
    elected: list[float] = []
    reregistered: list[float] = []
    all_active: list[float] = []
    out: dict[str, Any] = {}
    async with Probe(group.endpoints) as probe:
        info = await probe.wait_leader(group.endpoints, -1, time.perf_counter() + 60, every=0.05)
        assert info.leader is not None
        leader = Leader(info.leader, info.epoch)
        sim = SimPeers(
            agents,
            frameworks,
            leader.endpoint,
            tasks_per_agent=per_agent,
            relay_links=links,
            agents_at=[d.argv[d.argv.index("--bind") + 1] for d in relay_daemons],
        )
        sim.start()
        try:
            started = time.perf_counter()
            await _wait(
                lambda: sim.subscribed == frameworks and sim.registered == agents,
                started + _STORM_TIMEOUT,
                "registration storm",
                sim,
                probe,
                leader,
            )
            out["storm_s"] = round(time.perf_counter() - started, 3)
            _say(f"{frameworks} frameworks and {agents} agents registered in {out['storm_s']}s")
            sim.reregister()
            started = time.perf_counter()
            await _wait(
                lambda: sim.reregistered == agents,
                started + _STORM_TIMEOUT,
                "re-registration with tasks",
                sim,
                probe,
                leader,
            )
            out["tasks_reported_s"] = round(time.perf_counter() - started, 3)
            await probe.wait_active_agents(leader.endpoint, agents, time.perf_counter() + 120)
            _say(f"{agents * per_agent} tasks reported in {out['tasks_reported_s']}s")
            pid = group.master_at(leader.endpoint).proc.pid  # type: ignore[union-attr]
            out["leader_rss_mib"] = rss_mib(pid)
            try:
                out["state_http_ms"] = time_state(port_of[leader.endpoint], 3)
                await asyncio.sleep(3.0)  # a few allocation runs with every framework declining
                out["allocation"] = allocation_runs(port_of[leader.endpoint])
            except urllib.error.HTTPError as exc:
                # It no longer leads (a standby answers 503): a step-down, counted from the logs
                # below. The kill rounds need the leader the simulated peers follow: skipped.
                out["aborted"] = f"the leader answered HTTP {exc.code} while it was measured"
                out["kills_skipped"], kills = kills, 0
            _say(f"leader RSS {out['leader_rss_mib']} MiB; /state {out.get('state_http_ms')}")
            for n in range(kills):
                round_ = await kill_round(group, probe, sim, leader, agents)
                elected.append(round_.elected)
                reregistered.append(round_.reregistered)
                all_active.append(round_.all_active)
                _say(f"kill {n + 1}/{kills}: {round_}")
            if kills:
                pid = group.master_at(leader.endpoint).proc.pid  # type: ignore[union-attr]
                out["leader_rss_after_kills_mib"] = rss_mib(pid)
            if relay_daemons:
                out["relays"] = [relay_usage(d) for d in relay_daemons]
        finally:
            sim.stop()
            sim.join(30)
    return {
        "agents": agents,
        "frameworks": frameworks,
        "tasks": agents * per_agent,
        "relay_links": links,
        "real_relays": len(relay_daemons),
        **out,
        "kills": kills,
        "elected_s": percentiles(elected),
        "reregistered_s": percentiles(reregistered),
        "all_active_s": percentiles(all_active),
        "step_downs": step_downs(group),
        "unforced_leader_changes_seen": leader.changes,
        "election_timeout": group.election_timeout,
        "sim": {
            "pings_answered": sim.pings,
            "offers_declined": sim.declined,
            "reconnects": sim.reconnects,
            "registrations_put_off": sim.put_off,
            "other_messages": sim.other,
        },
    }


def start_relays(group: Group, count: int, daemons: list[Daemon]) -> None:
    """``count`` agora-relay processes in front of the group, added to ``daemons`` as each is
    started (the caller kills them), returning once each accepts connections."""
    for j, port in enumerate(free_ports(count) if count else ()):
        endpoint = f"tcp://127.0.0.1:{port}"
        argv = [
            *(sys.executable, "-m", "agora.master.relay", "--bind", endpoint, "--insecure"),
            *("--masters", ",".join(group.endpoints), "--log-level", "warning"),
        ]
        daemon = Daemon(f"relay-{j}", argv, group.work_dir / "logs" / f"relay-{j}.log")
        daemon.start()
        daemons.append(daemon)
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or not daemon.alive:
                raise RuntimeError(f"relay-{j} did not start: {daemon.log.read_text()[-2000:]}")
            time.sleep(0.05)


def relay_usage(daemon: Daemon) -> dict[str, float]:
    """A relay's CPU seconds so far and its resident memory."""
    assert daemon.proc is not None
    with open(f"/proc/{daemon.proc.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return {"cpu_s": round(cpu, 2), "rss_mib": rss_mib(daemon.proc.pid)}


def run_core(agents: int, frameworks: int, tasks: int, memory: bool) -> dict[str, Any]:
    here = Path(__file__).resolve().parent
    argv = [
        sys.executable,
        str(here / "_scale_core.py"),
        *("--agents", str(agents), "--frameworks", str(frameworks), "--tasks", str(tasks)),
    ]
    result: dict[str, Any] = json.loads(subprocess.check_output(argv, timeout=1800))
    if memory:
        traced = subprocess.check_output([*argv, "--tracemalloc"], timeout=1800)
        result["memory"] = json.loads(traced)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--frameworks", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--election-timeout", type=float, default=1.0)
    parser.add_argument(
        "--core-sizes", default=None, help="agents per core-phase run (default: --agents,20000)"
    )
    parser.add_argument("--skip-sockets", action="store_true")
    parser.add_argument(
        "--relay-links",
        type=int,
        default=None,
        help="carry the agents over this many connections, as agora-relay does (default: one "
        "connection per agent while they fit the leader's descriptors, else one per 1,000)",
    )
    parser.add_argument(
        "--real-relays",
        type=int,
        default=0,
        help="start this many agora-relay processes and connect the agents to them, one "
        "connection each (the relays' CPU and memory are reported)",
    )
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result: dict[str, Any] = {"bench": "scale"}
    if not args.skip_sockets:
        room, why = fd_room()
        links = args.relay_links
        if links is None:
            fits = args.real_relays or args.agents + args.frameworks <= room
            links = 0 if fits else -(-args.agents // 1_000)
        agents = args.agents if links else min(args.agents, room - args.frameworks)
        result["limited_by"] = why if agents < args.agents else None
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(prefix="agora-scale-", dir=base) as tmp:
            group = Group(Path(tmp), agents=0, election_timeout=args.election_timeout)
            try:
                result["sockets"] = asyncio.run(
                    run_sockets(
                        group,
                        agents,
                        args.frameworks,
                        args.tasks,
                        args.kills,
                        links,
                        args.real_relays,
                    )
                )
            finally:
                _say("stopping the masters")
                with contextlib.suppress(Exception):
                    result.setdefault("step_downs_at_exit", step_downs(group))
                group.close()
    sizes = (
        [int(s) for s in args.core_sizes.split(",") if s]
        if args.core_sizes is not None
        else [args.agents, 20_000]
    )
    result["core"] = []
    for n, size in enumerate(sizes):
        _say(f"core phase: {size} agents")
        result["core"].append(run_core(size, args.frameworks, args.tasks, memory=n == 0))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
