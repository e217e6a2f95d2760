"""End-to-end throughput and latency on a real local cluster (1 master, 2 agents as processes).

Two phases, one framework on the asyncio SDK driver:

1. throughput: N trivial ``true`` tasks launched as fast as offers allow (every task that fits an
   offer goes into one ACCEPT, leftovers are re-offered at once), counted to TASK_FINISHED;
2. latency: ``--latency-tasks`` tasks launched one at a time, each when the previous one is
   RUNNING, so ACCEPT -> TASK_RUNNING is measured without a queue in front of it.

With ``--api mesos`` the framework speaks the Mesos v1 scheduler HTTP API instead (JSON over
HTTP with a bearer token, every update acknowledged by its own call; see ``mesos_api_driver``),
so the same workload measures what that API costs over Agora's own protocol.

Prints one JSON line: tasks, seconds (first ACCEPT to last TASK_FINISHED), tasks_per_s, and the
ACCEPT -> TASK_RUNNING percentiles of phase 2 (``launch_to_running_*``) and of phase 1, where
thousands of tasks queue behind each other (``loaded_launch_to_running_*``). Updates are
at-least-once: each task's end is counted once, and ``duplicate_updates`` says how many terminal
updates came again (an agent re-sends one whose acknowledgement is late). Work dirs go on
/dev/shm when it exists: file creation on this VM's disks is slow and erratic.

    python tests/bench/throughput.py --tasks 5000 [--isolation posix] [--api mesos]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.cluster

from agora.sdk import (
    Filters,
    FrameworkInfo,
    Offer,
    Resources,
    Scheduler,
    SchedulerDriver,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from agora.sdk.logs import configure_logging
from agora.sdk.messages import is_terminal
from agora.sdk.transport import CurveClient, generate_keypair
from mesos_api_driver import MesosApiDriver
from support.cluster import LocalCluster

SHAPE = Resources.parse("cpus:0.01;mem:1")
NO_FILTER = Filters(refuse_seconds=0)
#: The bench framework's HTTP token with ``--api mesos``.
MESOS_TOKEN = "throughput-bench-token-0123456789"


class Bench(Scheduler):
    def __init__(self, throughput_tasks: int, latency_tasks: int) -> None:
        self.n1, self.n2 = throughput_tasks, latency_tasks
        self.launched = 0
        self.phase = 1
        self.waiting_for_running = False  # phase 2: one task in flight at a time
        self.held: list[Offer] = []
        self.launched_at: dict[str, float] = {}
        self.loaded: list[float] = []
        self.unloaded: list[float] = []
        self.ended = {1: 0, 2: 0}
        self.seen_ended: set[str] = set()
        self.duplicates = 0  # terminal updates seen again (a resend raced its acknowledgement)
        self.failed = 0
        self.first_launch = 0.0
        self.last_finish = 0.0
        self.done = asyncio.Event()

    # --- offers ---------------------------------------------------------------------------
    def offers(self, driver: SchedulerDriver, offers: list[Offer]) -> None:
        self.held.extend(offers)
        self._launch(driver)

    def offer_rescinded(self, driver: SchedulerDriver, offer_id: str) -> None:
        self.held = [o for o in self.held if o.offer_id != offer_id]

    def _launch(self, driver: SchedulerDriver) -> None:
        if self.phase == 2 and self.waiting_for_running:
            return
        while self.held:
            offer = self.held.pop(0)
            specs: list[TaskSpec] = []
            free = offer.resources
            room = self.n1 - self.launched if self.phase == 1 else 1
            if self.phase == 2 and self.launched >= self.n1 + self.n2:
                room = 0
            while len(specs) < room and free.fits(SHAPE):
                specs.append(TaskSpec(f"p{self.phase}-{self.launched}", "true", SHAPE))
                self.launched += 1
                free = free - SHAPE
            now = time.perf_counter()
            if specs and not self.first_launch:
                self.first_launch = now
            for spec in specs:
                self.launched_at[spec.name] = now
            if not specs:
                if free.fits(SHAPE) and self.launched < self.n1 + self.n2:
                    self.held.insert(0, offer)  # keep it for the next phase / next task
                    return
                # Nothing fits (e.g. only memory is left): hand it back, or the agent's freed
                # cpus could never be offered to us again (one offer per agent at a time).
                driver.decline(offer.offer_id, filters=NO_FILTER)
                continue
            driver.launch(offer, specs, filters=NO_FILTER)
            if self.phase == 2:
                self.waiting_for_running = True
                return

    # --- updates --------------------------------------------------------------------------
    def status_update(self, driver: SchedulerDriver, status: TaskStatus) -> None:
        now = time.perf_counter()
        tid = str(status.task_id)
        phase = 1 if tid.startswith("p1-") else 2
        if status.state is TaskState.RUNNING:
            started = self.launched_at.pop(tid, None)
            if started is not None:
                (self.loaded if phase == 1 else self.unloaded).append(now - started)
            if phase == 2:
                self.waiting_for_running = False
                self._launch(driver)
            return
        if not (is_terminal(status.state) or status.state is TaskState.LOST):
            return
        if tid in self.seen_ended:  # updates are at-least-once: count each task's end once
            self.duplicates += 1
            return
        self.seen_ended.add(tid)
        self.ended[phase] += 1
        if status.state is not TaskState.FINISHED:
            self.failed += 1
            print(f"task {tid} ended {status.state.name}: {status.message}", file=sys.stderr)
        if phase == 1 and self.ended[1] == self.n1:
            self.last_finish = now
            self.phase = 2
            self._launch(driver)
        if self.ended[1] == self.n1 and self.ended[2] == self.n2:
            self.done.set()


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a live process, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / tick, (cutime + cstime) / tick


def _cpu_by_role(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds spent so far by each kind of process of the cluster and by this framework."""
    out = {"framework": 0.0, "master": 0.0, "agents": 0.0, "executors": 0.0, "tasks": 0.0}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["framework"] = usage.ru_utime + usage.ru_stime
    if cluster.master is not None:
        out["master"] = _cpu_seconds(cluster.master.pid)[0]
    for proc in cluster.agent_procs:
        out["agents"] += _cpu_seconds(proc.pid)[0]
    for pid_file in cluster.work_dir.glob("agent-*/frameworks/*/executors/*/executor.pid"):
        own, children = _cpu_seconds(int(pid_file.read_text()))
        out["executors"] += own
        out["tasks"] += children
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0, 2)


async def _run(cluster: LocalCluster, bench: Bench, timeout: float, api: str) -> dict[str, float]:
    """Run the bench; returns CPU seconds per kind of process, measured before teardown."""
    driver: SchedulerDriver | MesosApiDriver
    if api == "mesos":
        url = (cluster.work_dir / "master.endpoint.http").read_text().strip()
        auth = {"Authorization": f"Bearer {MESOS_TOKEN}"}
        driver = MesosApiDriver(bench, url, "throughput-bench", auth)
    else:
        info = FrameworkInfo(name="throughput-bench")
        driver = SchedulerDriver(bench, info, cluster.endpoint, curve=cluster.client_curve)
    runner = asyncio.create_task(driver.run())
    before = _cpu_by_role(cluster)
    try:
        done = asyncio.create_task(bench.done.wait())
        await asyncio.wait([done, runner], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            done.cancel()
            if runner.done():
                runner.result()  # the driver failed: say why
            raise TimeoutError(
                f"the workload did not finish in {timeout} s: phase {bench.phase}, "
                f"{bench.launched} launched, {bench.ended} ended, {len(bench.held)} offers held"
            )
        after = _cpu_by_role(cluster)
    finally:
        driver.stop()
        await asyncio.wait_for(runner, 10)
    return {role: after[role] - before[role] for role in after}


def _with_curve(cluster: LocalCluster, keys: Path) -> None:
    """Keys for the master, the agents and the bench's framework; the master admits the other
    two (no ACL: the cost measured is the encryption and the handshake, not the rules)."""
    master_public, master_secret = generate_keypair(keys, "master")
    authorized = keys / "authorized"
    authorized.mkdir()
    for name in ("agent", "bench"):
        public, _ = generate_keypair(keys, name)
        (authorized / public.name).write_bytes(public.read_bytes())
    cluster.master_args = [
        *("--curve-secret-key", str(master_secret)),
        *("--curve-authorized-keys", str(authorized)),
    ]
    cluster.agent_args = [
        *("--curve-secret-key", str(keys / "agent.key_secret")),
        *("--curve-server-key", str(master_public)),
    ]
    cluster.client_curve = CurveClient(keys / "bench.key_secret", master_public)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--latency-tasks", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--agent-resources", default="cpus:64;mem:65536;disk:1024")
    parser.add_argument(
        "--curve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every link encrypted and authenticated with CURVE (the default), or not",
    )
    parser.add_argument(
        "--isolation",
        choices=("default", "posix"),
        default="default",
        help="the agents' isolation: 'default' is what an agent picks by itself (as root: cgroups "
        "and pid/mount namespaces), 'posix' is plain processes",
    )
    parser.add_argument(
        "--api",
        choices=("agora", "mesos"),
        default="agora",
        help="the framework's API: Agora's own protocol, or the Mesos v1 scheduler HTTP API",
    )
    args = parser.parse_args()
    configure_logging("console", "warning")
    bench = Bench(args.tasks, args.latency_tasks)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agora-bench-", dir=base) as tmp:
        cluster = LocalCluster(Path(tmp), agents=2, agent_resources=args.agent_resources)
        if args.curve:
            _with_curve(cluster, Path(tmp) / "keys")
        if args.isolation == "posix":
            cluster.agent_args = [*cluster.agent_args, "--isolation", "posix"]
        if args.api == "mesos":
            credentials = Path(tmp) / "http.toml"
            credentials.write_text(f'bench = "{MESOS_TOKEN}"\n')
            http = ("--http-port", "0", "--http-credentials", str(credentials))
            cluster.master_args = [*cluster.master_args, *http]
        with cluster:
            cpu = asyncio.run(_run(cluster, bench, args.timeout, args.api))
    seconds = bench.last_finish - bench.first_launch
    result = {
        "api": args.api,
        "curve": args.curve,
        "isolation": args.isolation,
        "tasks": args.tasks,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(args.tasks / seconds, 1) if seconds > 0 else None,
        "launch_to_running_p50_ms": _pct(bench.unloaded, 0.50),
        "launch_to_running_p99_ms": _pct(bench.unloaded, 0.99),
        "latency_tasks": args.latency_tasks,
        "loaded_launch_to_running_p50_ms": _pct(bench.loaded, 0.50),
        "loaded_launch_to_running_p99_ms": _pct(bench.loaded, 0.99),
        "failed": bench.failed,
        "duplicate_updates": bench.duplicates,
        # CPU per task of each kind of process, over both phases (executors' startup included).
        "cpu_ms_per_task": {
            role: round(1000 * secs / (args.tasks + args.latency_tasks), 3)
            for role, secs in cpu.items()
        },
    }
    print(json.dumps(result))
    return 0 if bench.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
