"""Containers on one agent: N long tasks launched at once, each in its own container.

Per isolation mode (a fresh local cluster each: 1 master, 1 agent started with ``--isolation``),
one framework on the asyncio SDK driver launches ``--containers`` N ``sleep 300`` tasks of
cpus:0.001;mem:1 as fast as offers allow (every task that fits an offer goes into one ACCEPT), so
all N are alive at once; then ``--latency-tasks`` more, one at a time, each when the previous one
is RUNNING (ACCEPT -> TASK_RUNNING without a queue in front, with N containers alive). Then every
task is killed through the framework, the cluster stopped, and the bench checks nothing is left:
no process that names the work dir, no cgroup of the agent.

Modes: ``posix``; ``cgroups`` (cpu, mem, pids); ``cgroups+pid+mount`` (plus pid and mount
namespaces); ``rootfs`` (plus filesystem/rootfs, every task naming a busybox image). Prints one
JSON line per mode: ``seconds`` is the first ACCEPT to the N-th TASK_RUNNING, the percentiles are
each bulk task's ACCEPT -> TASK_RUNNING. Modes other than posix need root; without it they print
``{"mode": ..., "skipped": "needs root"}``. Work dirs go on /dev/shm when it exists.

    .venv/bin/python tests/bench/containers.py --containers 1000 --modes posix,cgroups
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.cluster

from agora.agent.server.isolation import agent_cgroups_root
from agora.sdk.logs import configure_logging
from agora.sdk.messages import (
    ContainerInfo,
    Filters,
    FrameworkInfo,
    Offer,
    TaskState,
    TaskStatus,
    is_terminal,
)
from agora.sdk.resources import Resources
from agora.sdk.scheduler import Scheduler, SchedulerDriver, TaskSpec
from support.cluster import LocalCluster

DEFAULT_SHAPE = "cpus:0.001;mem:1"
NO_FILTER = Filters(refuse_seconds=0)
LONG_FILTER = Filters(refuse_seconds=3600)
IMAGE = "busybox"
CGROUPS = "cgroups/cpu,cgroups/mem,cgroups/pids"
MODES: dict[str, str] = {
    "posix": "posix",
    "cgroups": CGROUPS,
    "cgroups+pid+mount": f"{CGROUPS},namespaces/pid,namespaces/mount",
    "rootfs": f"{CGROUPS},namespaces/pid,namespaces/mount,filesystem/rootfs",
}


@dataclass
class Bench(Scheduler):
    """Phase 1: ``bulk`` tasks in as few ACCEPTs as offers allow; phase 2: ``single`` tasks one
    at a time; phase 3: kill them all."""

    bulk: int
    single: int
    shape: Resources
    image: str | None = None
    sleep: int = 300
    launched: int = 0
    held: list[Offer] = field(default_factory=list)
    launched_at: dict[str, float] = field(default_factory=dict)
    bulk_latency: list[float] = field(default_factory=list)
    single_latency: list[float] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    in_flight: bool = False
    failed: int = 0
    first_accept: float = 0.0
    first_running: float = 0.0
    bulk_done_at: float = 0.0
    killing: bool = False
    ended: int = 0
    launched_all: asyncio.Event = field(default_factory=asyncio.Event)
    killed_all: asyncio.Event = field(default_factory=asyncio.Event)

    # --- offers ---------------------------------------------------------------------------
    def offers(self, driver: SchedulerDriver, offers: list[Offer]) -> None:
        self.held.extend(offers)
        self._launch(driver)

    def offer_rescinded(self, driver: SchedulerDriver, offer_id: str) -> None:
        self.held = [o for o in self.held if o.offer_id != offer_id]

    def _room(self) -> int:
        if self.killing:
            return 0
        if self.launched < self.bulk:
            return self.bulk - self.launched
        if self.bulk_done_at and not self.in_flight:
            return min(1, self.bulk + self.single - self.launched)
        return 0

    def _launch(self, driver: SchedulerDriver) -> None:
        while self.held:
            room = self._room()
            offer = self.held.pop(0)
            specs: list[TaskSpec] = []
            free = offer.resources
            while len(specs) < room and free.fits(self.shape):
                specs.append(self._spec(f"t{self.launched}"))
                self.launched += 1
                free = free - self.shape
            if not specs:
                wanted = self.launched < self.bulk + self.single and not self.killing
                if wanted and free.fits(self.shape):
                    self.held.insert(0, offer)  # keep it for the next single task
                    return
                # Nothing fits, or nothing is left to launch: then a 0 s filter would have the
                # master offer it again at once, over and over.
                driver.decline(offer.offer_id, filters=NO_FILTER if wanted else LONG_FILTER)
                continue
            now = time.perf_counter()
            self.first_accept = self.first_accept or now
            for spec in specs:
                self.launched_at[spec.name] = now
            driver.launch(offer, specs, filters=NO_FILTER)
            if self.launched > self.bulk:
                self.in_flight = True
                return

    def _spec(self, name: str) -> TaskSpec:
        container = ContainerInfo(image=self.image) if self.image else None
        return TaskSpec(name, f"sleep {self.sleep}", self.shape, container=container)

    # --- updates --------------------------------------------------------------------------
    def status_update(self, driver: SchedulerDriver, status: TaskStatus) -> None:
        now = time.perf_counter()
        tid = str(status.task_id)
        if status.state is TaskState.RUNNING:
            started = self.launched_at.pop(tid, None)
            if started is None:
                return
            self.running.add(tid)
            self.first_running = self.first_running or now
            bulk = int(tid[1:]) < self.bulk
            (self.bulk_latency if bulk else self.single_latency).append(now - started)
            if bulk and len(self.bulk_latency) == self.bulk:
                self.bulk_done_at = now
            if not bulk:
                self.in_flight = False
            self._check_launched(driver)
            return
        if not (is_terminal(status.state) or status.state is TaskState.LOST):
            return
        self.ended += 1
        was_running = tid in self.running
        self.running.discard(tid)
        if not self.killing:
            self.failed += 1
            self.launched_at.pop(tid, None)
            print(f"task {tid} ended {status.state.name}: {status.message}", file=sys.stderr)
            self.in_flight = False
            if int(tid[1:]) < self.bulk and not was_running:
                self.bulk_latency.append(float("nan"))  # counts towards the bulk, not timed
                if len(self.bulk_latency) == self.bulk:
                    self.bulk_done_at = now
            self._check_launched(driver)
        if self.killing and self.ended >= self.launched:
            self.killed_all.set()

    def _check_launched(self, driver: SchedulerDriver) -> None:
        if self.launched >= self.bulk + self.single and not self.launched_at:
            self.launched_all.set()
        else:
            self._launch(driver)

    def kill_all(self, driver: SchedulerDriver) -> None:
        self.killing = True
        for tid in sorted(self.running):
            driver.kill(tid)
        if self.ended >= self.launched:
            self.killed_all.set()


def _pct(values: list[float], q: float) -> float | None:
    timed = sorted(v for v in values if v == v)  # NaN: a task that failed
    if not timed:
        return None
    return round(timed[min(len(timed) - 1, int(q * len(timed)))] * 1000.0, 2)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_role(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of the framework (this process), the master, the agent, the executor."""
    usage = os.times()
    out = {"framework": usage.user + usage.system, "master": 0.0, "agent": 0.0, "executor": 0.0}
    if cluster.master is not None:
        out["master"] = _cpu_seconds(cluster.master.pid)
    out["agent"] = sum(_cpu_seconds(p.pid) for p in cluster.agent_procs)
    for pid_file in cluster.work_dir.glob("agent-*/frameworks/*/executors/*/executor.pid"):
        out["executor"] += _cpu_seconds(int(pid_file.read_text()))
    return out


async def _run(cluster: LocalCluster, bench: Bench, timeout: float) -> dict[str, float]:
    """Launch, measure, kill; returns CPU seconds per role over the launch and the kill time."""
    driver = SchedulerDriver(bench, FrameworkInfo(name="containers-bench"), cluster.endpoint)
    runner = asyncio.create_task(driver.run())
    before = _cpu_by_role(cluster)
    try:
        await asyncio.wait_for(bench.launched_all.wait(), timeout)
        after = _cpu_by_role(cluster)
        kill_start = time.perf_counter()
        bench.kill_all(driver)
        await asyncio.wait_for(bench.killed_all.wait(), timeout)
        kill_seconds = time.perf_counter() - kill_start
    finally:
        driver.stop()
        await asyncio.wait_for(runner, 10)
    cpu = {f"cpu_s_{role}": round(after[role] - before[role], 2) for role in after}
    return {**cpu, "kill_seconds": round(kill_seconds, 3)}


# --- leftovers ---------------------------------------------------------------------------------
def _cgroup_dirs(agent_dir: Path) -> list[str]:
    """The agent's cgroup root under each hierarchy this process is in (v1 and v2)."""
    root = agent_cgroups_root("agora", str(agent_dir))
    own = set()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        own.add(line.split(":", 2)[2].rstrip("/"))
    base = Path("/sys/fs/cgroup")
    found = []
    for hierarchy in base.iterdir():
        for path in own:
            candidate = f"{hierarchy}{path}/{root}"
            if os.path.isdir(candidate):
                found.append(candidate)
    return found


def _processes_naming(text: str) -> list[int]:
    """Pids of processes whose command line or environment mention ``text``."""
    needle = text.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{entry}/{name}").read_bytes()
            except OSError:
                continue
            if needle in data:
                pids.append(int(entry))
                break
    return pids


def _leftovers(work_dir: Path, timeout: float = 10.0) -> dict[str, list[str]]:
    """Wait (up to ``timeout``) for every process and cgroup of the cluster to be gone."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        pids = _processes_naming(str(work_dir))
        cgroups = [d for a in work_dir.glob("agent-*") for d in _cgroup_dirs(a)]
        if not pids and not cgroups:
            return {}
        if time.monotonic() > deadline:
            for pid in pids:  # descendants of the cluster this bench started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return {"processes": [str(p) for p in pids], "cgroups": cgroups}
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


# --- one mode ----------------------------------------------------------------------------------
def run_mode(mode: str, args: argparse.Namespace) -> dict[str, object]:
    if mode != "posix" and os.geteuid() != 0:
        return {"mode": mode, "skipped": "needs root"}
    if args.work_dir:  # kept afterwards, logs and all, for a look at where the time went
        work = Path(args.work_dir).resolve() / mode.replace("+", "-")
        work.mkdir(parents=True)
        return _run_mode_in(mode, args, work)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agora-bench-containers-", dir=base) as tmp:
        return _run_mode_in(mode, args, Path(tmp))


def _run_mode_in(mode: str, args: argparse.Namespace, work: Path) -> dict[str, object]:
    agent_args = ["--isolation", MODES[mode]]
    image = None
    if mode == "rootfs":
        from agora.sdk.daemon.images import ImageStore
        from support.busybox import busybox_rootfs

        if not os.path.exists("/bin/busybox"):
            return {"mode": mode, "skipped": "needs /bin/busybox (busybox-static)"}
        ImageStore(str(work / "images")).import_image(IMAGE, str(busybox_rootfs(work / "bb")))
        agent_args += ["--image-store", str(work / "images")]
        image = IMAGE
    cluster = LocalCluster(
        work / "cluster",
        agents=1,
        agent_resources=args.agent_resources,
        agent_args=agent_args,
    )
    shape = Resources.parse(args.task_resources)
    bench = Bench(args.containers, args.latency_tasks, shape, image=image, sleep=args.sleep)
    try:
        with cluster:
            extra = asyncio.run(_run(cluster, bench, args.timeout))
            stop_start = time.perf_counter()
        extra["stop_seconds"] = round(time.perf_counter() - stop_start, 3)
    finally:
        leftovers = _leftovers(cluster.work_dir)
    seconds = bench.bulk_done_at - bench.first_accept
    n = args.containers
    return {
        "mode": mode,
        "isolation": MODES[mode],
        "containers": n,
        "seconds": round(seconds, 3),
        "launches_per_s": round(n / seconds, 1) if seconds > 0 else None,
        "accept_to_running_p50_ms": _pct(bench.bulk_latency, 0.50),
        "p90_ms": _pct(bench.bulk_latency, 0.90),
        "p99_ms": _pct(bench.bulk_latency, 0.99),
        "python": sys.version.split()[0],
        "first_running_ms": round((bench.first_running - bench.first_accept) * 1000, 1),
        "single_p50_ms": _pct(bench.single_latency, 0.50),
        "single_p99_ms": _pct(bench.single_latency, 0.99),
        "latency_tasks": args.latency_tasks,
        "task_resources": args.task_resources,
        "failed": bench.failed,
        **extra,
        "leftovers": leftovers,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--latency-tasks", type=int, default=50)
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--work-dir", help="keep each mode's cluster dir under this (logs)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--task-resources", default=DEFAULT_SHAPE)
    parser.add_argument(
        "--sleep", type=int, default=300, help="task length: longer than the launch takes"
    )
    parser.add_argument("--agent-resources", default="cpus:64;mem:262144;disk:4096")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}: pick from {', '.join(MODES)}")
    configure_logging("console", "warning")
    ok = True
    for mode in modes:
        result = run_mode(mode, args)
        print(json.dumps(result), flush=True)
        ok = ok and not result.get("failed") and not result.get("leftovers")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
