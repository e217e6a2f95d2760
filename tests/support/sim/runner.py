"""Run one deterministic simulation of the real cores: master, agents, executors, schedulers.

``run(scenario, seed)`` builds a cluster of the real master core, hosts running the real agent
core and executor core (support/sim/host.py, executor.py) and frameworks on the real scheduler
driver core (driver.py), drives it for ``scenario.duration`` simulated seconds (partitions,
drops, agent crashes with restarts from their checkpoints, clock jumps), then stops new
launches, heals the network, restarts every crashed agent and lets the cluster quiesce before
the end-of-run checks. Everything random is drawn from one
``random.Random(seed)``, so a seed replays exactly; the network trace (every frame sent,
delivered or dropped, with its CRC) is returned so that can be checked.

Any failure is raised as ``SimulationFailure`` (an ``AssertionError``) naming the seed, the
command that replays it, and the last frames on the wire.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from agora.master.allocator import AllocatorConfig
from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core import Master, MasterConfig, Send
from agora.sdk.messages import Message, TaskState, is_terminal
from agora.sdk.resources import Resources

from support.sim.batch import BatchWorkload, SimBatch
from support.sim.clock import EventQueue, SimClock
from support.sim.framework import FrameworkSpec, SimFramework
from support.sim.host import HostConfig, SimHost
from support.sim.invariants import Invariants
from support.sim.masters import GroupConfig, MasterGroup
from support.sim.network import MASTER, NetConfig, SimNetwork, TraceEntry

__all__ = [
    "ClockJumps",
    "Crashes",
    "Partitions",
    "Scenario",
    "SimResult",
    "Simulation",
    "SimulationFailure",
    "replay_command",
    "run",
]

TEST_FILE = "tests/sim/test_simulation.py"


@dataclass(slots=True)
class Partitions:
    """``count`` partitions, each starting at a random time of the active phase and lasting a
    random time in ``length``; ``target`` names the framework to cut (default: a random one
    with a failover timeout; agents are always picked at random)."""

    count: int
    length: tuple[float, float]
    target: str | None = None


@dataclass(slots=True)
class Crashes:
    """``count`` agent crashes (SIGKILL of the agent process; its executors live on), each of a
    random agent at a random time of the active phase, restarted after a random ``downtime``."""

    count: int
    downtime: tuple[float, float]


@dataclass(slots=True)
class ClockJumps:
    """``count`` forward leaps of a random agent's clock, each of a random ``size``."""

    count: int
    size: tuple[float, float]


@dataclass(slots=True)
class Scenario:
    name: str
    frameworks: list[FrameworkSpec]
    agents: int = 6
    agent_resources: str = "cpus:8;mem:8192"
    net: NetConfig = field(default_factory=NetConfig)
    agent: HostConfig = field(default_factory=HostConfig)
    #: The master pings agents this often (and marks one unreachable after 5 missed pings).
    ping_interval: float = 15.0
    #: Active phase: frameworks launch, faults happen.
    duration: float = 300.0
    #: Partitions that each cut one random agent off the master.
    agent_partitions: list[Partitions] = field(default_factory=list)
    #: Partitions that each cut one scheduler off (the transport tells both ends).
    framework_partitions: list[Partitions] = field(default_factory=list)
    agent_crashes: list[Crashes] = field(default_factory=list)
    clock_jumps: list[ClockJumps] = field(default_factory=list)
    #: The batch service with its workload (None: not run).
    batch: BatchWorkload | None = None
    #: A group of masters electing their leader (None: one master, as ``agora local`` runs).
    masters: GroupConfig | None = None
    #: Crashes of masters (the acting one half the time), each back after its downtime.
    master_crashes: Crashes = field(default_factory=lambda: Crashes(0, (1.0, 1.0)))
    #: Masters cut off from the group and from every client (the acting one half the time).
    master_partitions: Partitions = field(default_factory=lambda: Partitions(0, (1.0, 1.0)))
    offer_timeout: float | None = None
    tick_interval: float = 0.5
    #: Give up waiting for quiescence after this many simulated seconds.
    quiesce_max: float = 1500.0
    #: Quota guarantees by role (text form), and how reclaim runs.
    quotas: dict[str, str] = field(default_factory=dict)
    reclaim: ReclaimConfig = field(default_factory=lambda: ReclaimConfig(min_runtime=2.0))
    #: Demand that the master tracks no executor at the end (EXITED_EXECUTOR is unreliable).
    check_executors: bool = True
    #: Tolerate stream updates arriving after a terminal state the master announced when the
    #: agent re-registered (see invariants.task_history_problem).


@dataclass(slots=True)
class SimResult:
    scenario: str
    seed: int
    trace: list[TraceEntry]
    stats: dict[str, int]
    end_time: float

    def digest(self) -> str:
        """A short fingerprint of the whole trace (every frame, its time and its CRC)."""
        return hashlib.sha256(repr(self.trace).encode()).hexdigest()[:32]


class SimulationFailure(AssertionError):
    pass


def replay_command(scenario: str, seed: int) -> str:
    return f"AGORA_SIM_SEED={seed} .venv/bin/pytest {TEST_FILE} -k '{scenario}'"


class Simulation:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.queue = EventQueue(self.clock)
        self.net = SimNetwork(self.queue, self.rng, replace(scenario.net))
        base = MasterConfig(
            offer_timeout=scenario.offer_timeout,
            agent_ping_interval=scenario.ping_interval,
            allocator=AllocatorConfig(seed=seed),
            quotas={role: (Resources.parse(g), None) for role, g in scenario.quotas.items()},
            reclaim=scenario.reclaim,
        )
        #: One master without election (``agora local``), or a group electing its leader.
        self.single: Master | None = None
        self.group: MasterGroup | None = None
        if scenario.masters is None:
            self.single = Master(base)
            self.net.attach(MASTER, self._to_master)
        else:
            self.group = MasterGroup(
                base, scenario.masters, self.queue, self.net, self.rng, observe=self._observe
            )
        self.agents = [
            SimHost(
                f"agent{i}",
                Resources.parse(scenario.agent_resources),
                self.queue,
                self.net,
                self.rng,
                scenario.agent,
            )
            for i in range(scenario.agents)
        ]
        self.frameworks: list[SimFramework | SimBatch] = [
            SimFramework(spec, self.queue, self.net, self.rng) for spec in scenario.frameworks
        ]
        #: The batch service, when the scenario runs one (it is one of ``frameworks``).
        self.batch: SimBatch | None = None
        if scenario.batch is not None:
            self.batch = SimBatch(scenario.batch, self.queue, self.net, self.rng)
            self.frameworks.append(self.batch)
        if self.group is not None:
            for host in self.agents:
                self.group.add_client(host.name, host.master_link_up, host.master_link_down)
            for fw in self.frameworks:
                self.group.add_client(fw.name, fw.link_up, fw.link_down)
        self.invariants = Invariants(
            lambda: self.master,
            self.agents,
            self.frameworks,
            check_executors=scenario.check_executors,
        )
        self.stats: Counter[str] = Counter()
        self._unreachable: set[tuple[str, float]] = set()

    # --- wiring ------------------------------------------------------------------------
    @property
    def master(self) -> Master | None:
        """The master core that acts now (None while a group has no leader)."""
        if self.single is not None:
            return self.single
        assert self.group is not None
        return self.group.acting_core()

    def _to_master(self, sender: str, message: Message, epoch: int) -> None:
        assert epoch == 0, f"{message.NAME} from {sender} claims a master epoch ({epoch})"
        assert self.single is not None
        self._dispatch(self.single.handle(sender, message, self.clock.now))

    def _tick(self) -> None:
        if self.single is not None:
            self._dispatch(self.single.tick(self.clock.now))
        master = self.master
        if master is not None:
            for agent in master.state.agents.values():
                if agent.unreachable_since is not None:
                    self._unreachable.add((agent.agent_id, agent.unreachable_since))
        self.queue.later(self.scenario.tick_interval, self._tick, "master tick")

    def _observe(self, core: Master, sends: list[Send]) -> None:
        self.invariants.on_sends(sends, core)
        self.invariants.check(self.clock.now)

    def _dispatch(self, sends: list[Send]) -> None:
        assert self.single is not None
        self._observe(self.single, sends)
        for send in sends:
            self.net.send(MASTER, send.to, send.message, send.epoch)

    # --- faults ------------------------------------------------------------------------
    def _cut(self, peer: str, length: float, framework: SimFramework | None) -> None:
        if peer in self.net.cut:
            return
        self.net.cut.add(peer)
        self.stats["partitions"] += 1
        if framework is not None:
            # The transport notices a scheduler's connection drop on both ends.
            if self.single is not None:
                self._dispatch(self.single.disconnected(peer, self.clock.now))
            elif self.group is not None:
                self.group.disconnected(peer)
            framework.connection_lost()
        self.queue.later(length, lambda: self.net.cut.discard(peer), f"heal {peer}")

    def _agent_partition(self, length: float) -> None:
        candidates = [a for a in self.agents if a.name not in self.net.cut]
        if candidates:
            self._cut(self.rng.choice(candidates).name, length, None)

    def _framework_partition(self, length: float, name: str | None) -> None:
        candidates = [
            f
            for f in self.frameworks
            if f.name not in self.net.cut
            and not f.removed
            and (f.name == name if name is not None else f.spec.failover_timeout > 0)
        ]
        if candidates:
            fw = self.rng.choice(candidates)
            self._cut(fw.name, length, fw)

    def _crash(self, downtime: float) -> None:
        candidates = [a for a in self.agents if a.up]
        if candidates:
            host = self.rng.choice(candidates)
            host.crash()
            self.stats["agent_crashes"] += 1
            self.queue.later(downtime, host.restart, f"{host.name} restart")

    def _master_crash(self, downtime: float) -> None:
        """A master dies (the acting one half the time) and comes back after ``downtime``."""
        group = self.group
        assert group is not None
        acting = group.acting_member()
        alive = [m for m in group.members.values() if m.raft is not None]
        if not alive:
            return
        victim = acting if acting is not None and self.rng.random() < 0.5 else None
        name = victim.name if victim is not None else self.rng.choice(alive).name
        group.crash(name)
        self.stats["master_crashes"] += 1
        self.queue.later(downtime, lambda: group.restart(name), f"{name} restart")

    def _master_partition(self, length: float) -> None:
        """A master is cut off from the others and from every client (the acting one half the
        time): it must step down within its lease, and another take over."""
        group = self.group
        assert group is not None
        acting = group.acting_member()
        names = [n for n in group.names if n not in self.net.cut]
        if not names:
            return
        take_acting = acting is not None and acting.name in names and self.rng.random() < 0.5
        name = acting.name if take_acting and acting is not None else self.rng.choice(names)
        self.net.cut.add(name)
        self.stats["master_partitions"] += 1
        self.queue.later(length, lambda: self.net.cut.discard(name), f"heal {name}")

    def _jump(self, size: float) -> None:
        host = self.rng.choice(self.agents)
        host.jump_clock(size)
        self.stats["clock_jumps"] += 1

    def _draw(self, plan: Partitions | Crashes) -> list[tuple[float, float]]:
        """Concrete (start, length) pairs; every partition heals (and every crashed agent is
        back) within the active phase."""
        out = []
        for _ in range(plan.count):
            length = self.rng.uniform(
                *(plan.length if isinstance(plan, Partitions) else plan.downtime)
            )
            start = self.rng.uniform(10.0, max(10.0, self.scenario.duration - length - 10.0))
            out.append((start, length))
        return out

    # --- phases ------------------------------------------------------------------------
    def _quiet(self) -> bool:
        if any(a.running() or a.unacknowledged() for a in self.agents):
            return False
        for fw in self.frameworks:
            if fw.removed:
                continue
            if not fw.subscribed or not fw.settled():
                return False
            for task in fw.tasks.values():
                if not task.states:
                    return False
                last = task.states[-1]
                if not (
                    is_terminal(last) or (last is TaskState.LOST and not fw.spec.partition_aware)
                ):
                    return False
        master = self.master
        return master is not None and not master.state.tasks

    def run(self) -> SimResult:
        sc = self.scenario
        q = self.queue
        for agent in self.agents:
            q.later(self.rng.uniform(0.0, 2.0), agent.start, f"{agent.name} start")
        for fw in self.frameworks:
            q.later(self.rng.uniform(0.5, 3.0), fw.start, f"{fw.name} start")
        q.later(0.0, self._tick, "master tick")
        if self.group is not None:
            self.group.start()
            for start, downtime in self._draw(sc.master_crashes):
                q.at(start, lambda downtime=downtime: self._master_crash(downtime), "master crash")
            for start, length in self._draw(sc.master_partitions):
                q.at(
                    start, lambda length=length: self._master_partition(length), "master partition"
                )
        for plan in sc.agent_partitions:
            for start, length in self._draw(plan):
                q.at(start, lambda length=length: self._agent_partition(length), "agent partition")
        for plan in sc.framework_partitions:
            for start, length in self._draw(plan):
                q.at(
                    start,
                    lambda length=length, name=plan.target: self._framework_partition(length, name),
                    "framework partition",
                )
        for crashes in sc.agent_crashes:
            for start, downtime in self._draw(crashes):
                q.at(start, lambda downtime=downtime: self._crash(downtime), "agent crash")
        for jumps in sc.clock_jumps:
            for _ in range(jumps.count):
                size = self.rng.uniform(*jumps.size)
                start = self.rng.uniform(10.0, sc.duration - 10.0)
                q.at(start, lambda size=size: self._jump(size), "clock jump")
        q.run_until(sc.duration)
        # Quiesce: no new launches, no more faults, a healed network.
        for fw in self.frameworks:
            fw.stop_launching()
        self.net.config.drop = 0.0
        self.net.cut.clear()
        for host in self.agents:
            host.restart()
        if self.group is not None:
            for name in self.group.names:
                self.group.restart(name)
        deadline = sc.duration + sc.quiesce_max
        while self.clock.now < deadline and not self._quiet():
            q.run_until(self.clock.now + 10.0)
        # A little longer, so that anything still in flight lands before the verdict.
        q.run_until(self.clock.now + 60.0)
        self.invariants.final()
        return SimResult(sc.name, self.seed, self.net.trace, self._stats(), self.clock.now)

    def _stats(self) -> dict[str, int]:
        stats = Counter(self.stats)
        stats["agents_marked_unreachable"] = len(self._unreachable)
        stats["frames_sent"] = self.net.sent
        stats["frames_dropped"] = self.net.dropped
        stats["invariant_checks"] = self.invariants.checks
        stats["reclaim_kills"] = self.invariants.reclaims
        stats["tasks_launched"] = sum(len(f.tasks) for f in self.frameworks)
        stats["run_task"] = sum(self.invariants.runs.values())
        stats["gangs_launched"] = sum(f.gangs_launched for f in self.frameworks)
        stats["agent_reregistrations"] = sum(a.reregistrations for a in self.agents)
        stats["subscriptions"] = sum(f.subscriptions for f in self.frameworks)
        stats["frameworks_removed"] = sum(f.removed for f in self.frameworks)
        stats["kills_sent"] = sum(len(f.kills) for f in self.frameworks)
        stats["gang_kills"] = sum(f.gang_kills for f in self.frameworks)
        stats["kills_swallowed"] = sum(a.kills_swallowed for a in self.agents)
        if self.group is not None:
            stats["leaders_activated"] = self.group.activations
            stats["leaders_stepped_down"] = self.group.step_downs
            stats["client_switches"] = self.group.client_switches
        if self.batch is not None:
            states = self.batch.store.load_job_states()
            for job_id in self.batch.submitted:
                stats[f"batch_{states[job_id].value}"] += 1
            stats["batch_crashes"] = self.batch.crashes
        for fw in self.frameworks:
            for task in fw.tasks.values():
                if task.states:
                    stats[f"final_{task.states[-1].name}"] += 1
                stats["heard_UNREACHABLE"] += TaskState.UNREACHABLE in task.states
                stats["heard_LOST"] += TaskState.LOST in task.states
        return dict(sorted(stats.items()))


def run(scenario: Scenario, seed: int) -> SimResult:
    """Run ``scenario`` with ``seed``; a failure names the seed and how to replay it."""
    sim = Simulation(scenario, seed)
    try:
        return sim.run()
    except Exception as exc:
        tail = "\n".join(
            f"  {t:10.4f} {what:4} {src:>10} -> {dst:<10} {name}"
            for t, what, src, dst, name, _crc in sim.net.trace[-25:]
        )
        raise SimulationFailure(
            f"simulation {scenario.name!r} failed with seed {seed} at t={sim.clock.now:.4f}:\n"
            f"{type(exc).__name__}: {exc}\n"
            f"replay: {replay_command(scenario.name, seed)}\n"
            f"last frames:\n{tail}"
        ) from exc
    finally:
        if sim.batch is not None:
            sim.batch.close()
