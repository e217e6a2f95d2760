"""The fault suite's nemesis: a seeded plan of faults (pure) and an executor that applies it.

:func:`schedule` / :func:`plan` turn a seed and the fault kinds a test allows into steps
``(fault, duration, heal)``: hold ``fault`` for ``duration`` seconds, undo it, then let the
cluster settle ``heal`` seconds. Faults name roles (the leader, a side of a split), not masters:
the executor resolves them when it applies the fault, from :meth:`Cluster.leader`, and picks any
other masters with the fault's own seeded ``pick``, so one seed gives one schedule.

Kinds (:data:`KINDS`):

======== =================================================================================
kill     SIGKILL the leader; heal restarts it on the same data dir
killall  SIGKILL every master (the whole group); heal restarts them all on their data dirs
pause    SIGSTOP the leader (for longer than 2 T: ``pause_min``); heal sends SIGCONT
isolate  cut the leader's host from every other host
split    partition the masters into a minority and a majority; the leader goes to
         ``Fault.side``; other hosts (agents, frameworks) stay with the majority
bridge   two sides that cannot talk but both talk to one bridge master; the leader is on a
         side or is the bridge (``Fault.side``)
loss     drop ``Fault.percent`` % of packets both ways on every link of the leader
cut      drop the link between the leader and one other master, both ways or only one way
======== =================================================================================

The executor (:class:`Nemesis`) records ``fault`` and ``healed`` events (``what``, ``fault``,
``masters``) in the history, and always heals what it applied, even when interrupted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from agora.sdk.daemon.history import History

log = structlog.get_logger(__name__)

KINDS: tuple[str, ...] = ("kill", "killall", "pause", "isolate", "split", "bridge", "loss", "cut")
#: Kinds that need at least three masters.
_NEED_THREE = frozenset({"split", "bridge"})


@dataclass(frozen=True)
class Fault:
    kind: str
    side: str = ""  # split: "minority" | "majority"; bridge: "side" | "bridge"
    percent: int = 0  # loss
    both: bool = True  # cut: both directions or leader -> other only
    pick: int = 0  # seeds the executor's choice of other masters


@dataclass(frozen=True)
class Step:
    fault: Fault
    duration: float  # seconds the fault is held
    heal: float  # seconds to settle after healing, before the next step


def schedule(
    seed: int,
    kinds: Sequence[str],
    *,
    steps: int | None = None,
    masters: int = 3,
    duration: tuple[float, float] = (3.0, 5.0),
    heal: tuple[float, float] = (5.0, 5.0),
    pause_min: float = 2.5,
    loss_percent: tuple[int, int] = (20, 60),
) -> Iterator[Step]:
    """Yield ``steps`` steps (forever when None) drawn from ``kinds`` with ``Random(seed)``.

    Durations are uniform in ``duration`` (a pause lasts at least ``pause_min``: set it above
    2 T), settle times uniform in ``heal``. Raises ValueError on unknown kinds, bad bounds, or
    split/bridge with fewer than three masters.
    """
    chosen = _validate(kinds, masters, duration, heal, pause_min, loss_percent)
    rng = random.Random(seed)
    n = 0
    while steps is None or n < steps:
        kind = rng.choice(chosen)
        lo, hi = duration
        if kind == "pause":
            lo, hi = max(lo, pause_min), max(hi, pause_min)
        fault = Fault(
            kind=kind,
            side=(
                rng.choice(("minority", "majority"))
                if kind == "split"
                else rng.choice(("side", "bridge"))
                if kind == "bridge"
                else ""
            ),
            percent=rng.randint(*loss_percent) if kind == "loss" else 0,
            both=rng.random() < 0.5 if kind == "cut" else True,
            pick=rng.randrange(2**32),
        )
        yield Step(fault, round(rng.uniform(lo, hi), 3), round(rng.uniform(*heal), 3))
        n += 1


def plan(
    seed: int,
    kinds: Sequence[str],
    *,
    steps: int,
    masters: int = 3,
    duration: tuple[float, float] = (3.0, 5.0),
    heal: tuple[float, float] = (5.0, 5.0),
    pause_min: float = 2.5,
    loss_percent: tuple[int, int] = (20, 60),
) -> list[Step]:
    """The first ``steps`` steps of :func:`schedule`, as a list."""
    return list(
        schedule(
            seed,
            kinds,
            steps=steps,
            masters=masters,
            duration=duration,
            heal=heal,
            pause_min=pause_min,
            loss_percent=loss_percent,
        )
    )


def _validate(
    kinds: Sequence[str],
    masters: int,
    duration: tuple[float, float],
    heal: tuple[float, float],
    pause_min: float,
    loss_percent: tuple[int, int],
) -> list[str]:
    chosen = list(dict.fromkeys(kinds))
    if not chosen:
        raise ValueError("no fault kinds given")
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {list(KINDS)}")
    if masters < 1:
        raise ValueError("masters must be at least 1")
    small = [k for k in chosen if k in _NEED_THREE] if masters < 3 else []
    if small:
        raise ValueError(f"{small} need at least 3 masters, not {masters}")
    if masters < 2 and "cut" in chosen:
        raise ValueError("cut needs at least 2 masters")
    for name, (lo, hi) in (("duration", duration), ("heal", heal)):
        if not 0 <= lo <= hi:
            raise ValueError(f"{name} must be (lo, hi) with 0 <= lo <= hi, not {(lo, hi)}")
    if pause_min < 0:
        raise ValueError("pause_min must not be negative")
    if not 0 <= loss_percent[0] <= loss_percent[1] <= 100:
        raise ValueError(f"loss_percent must be within 0..100, not {loss_percent}")
    return chosen


# --------------------------------------------------------------------------- executor


class Cluster(Protocol):
    """The masters, by index 0..n-1, as the fault test runs them."""

    def leader(self) -> int | None: ...
    def kill(self, i: int) -> None: ...
    def restart(self, i: int) -> None: ...
    def pause(self, i: int) -> None: ...
    def resume(self, i: int) -> None: ...


class Net(Protocol):
    """The part of ``deploy/rig.py``'s ``Rig`` the nemesis uses (hosts by rig index)."""

    def cut(self, a: int, b: int, *, both: bool = True) -> None: ...
    def isolate(self, a: int) -> None: ...
    def partition(self, *groups: Sequence[int]) -> None: ...
    def loss(self, a: int, b: int, percent: int) -> None: ...
    def heal(self) -> None: ...


@dataclass
class Applied:
    """A fault in force: what to record and how to undo it."""

    step: Step
    what: str
    masters: list[int]
    undo: Callable[[], None]
    started: float = field(default_factory=time.monotonic)


class Nemesis:
    """Applies steps to ``cluster`` and ``net``; master ``i`` lives on rig host
    ``master_hosts[i]`` (default ``i``); ``others`` are the rig hosts of agents and frameworks."""

    def __init__(
        self,
        cluster: Cluster,
        net: Net | None,
        history: History,
        *,
        masters: int,
        master_hosts: Sequence[int] | None = None,
        others: Sequence[int] = (),
        leader_timeout: float = 10.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.cluster, self.net, self.history = cluster, net, history
        self.masters = masters
        self.hosts = list(master_hosts) if master_hosts is not None else list(range(masters))
        if len(self.hosts) != masters:
            raise ValueError("master_hosts must name one rig host per master")
        self.others = list(others)
        self.leader_timeout = leader_timeout
        self.stop = stop if stop is not None else threading.Event()

    def run(
        self,
        steps: Sequence[Step] | Iterator[Step],
        after_apply: Callable[[Applied], object] | None = None,
    ) -> list[Applied]:
        """Apply, hold, heal and settle each step until done or ``stop`` is set;
        ``after_apply`` runs as each fault takes hold."""
        done: list[Applied] = []
        for step in steps:
            if self.stop.is_set():
                break
            applied = self.apply(step)
            if after_apply is not None:
                after_apply(applied)
            try:
                self.stop.wait(step.duration)
            finally:
                self.heal(applied)
            done.append(applied)
            self.stop.wait(step.heal)
        return done

    def apply(self, step: Step) -> Applied:
        fault = step.fault
        rng = random.Random(fault.pick)
        leader = self._leader(rng)
        others = [i for i in range(self.masters) if i != leader]
        rng.shuffle(others)
        applied = getattr(self, f"_{fault.kind}")(step, leader, others)
        assert isinstance(applied, Applied)
        self.history.record(
            "fault",
            what=applied.what,
            fault=fault.kind,
            masters=applied.masters,
            duration=step.duration,
        )
        log.info("nemesis_fault", what=applied.what, duration=step.duration)
        return applied

    def heal(self, applied: Applied) -> None:
        try:
            applied.undo()
        finally:
            held = round(time.monotonic() - applied.started, 3)
            self.history.record(
                "healed",
                what=applied.what,
                fault=applied.step.fault.kind,
                masters=applied.masters,
                held=held,
            )
            log.info("nemesis_healed", what=applied.what, held=held)

    def _leader(self, rng: random.Random) -> int:
        """The current leader, waited for up to ``leader_timeout``; else a seeded pick."""
        deadline = time.monotonic() + self.leader_timeout
        delay = 0.02
        while True:
            leader = self.cluster.leader()
            if leader is not None:
                return leader
            if time.monotonic() >= deadline or self.stop.wait(delay):
                return rng.randrange(self.masters)
            delay = min(delay * 2, 0.25)

    def _need_net(self) -> Net:
        if self.net is None:
            raise RuntimeError("this fault needs a rig (net) and the nemesis has none")
        return self.net

    # one method per kind: (step, leader, other masters shuffled) -> Applied

    def _kill(self, step: Step, leader: int, others: list[int]) -> Applied:
        self.cluster.kill(leader)
        return Applied(
            step, f"kill master {leader}", [leader], lambda: self.cluster.restart(leader)
        )

    def _killall(self, step: Step, leader: int, others: list[int]) -> Applied:
        """The whole group at once (a power cut): every master SIGKILLed, all restarted."""
        everyone = sorted([leader, *others])
        for i in everyone:
            self.cluster.kill(i)

        def restart_all() -> None:
            for i in everyone:
                self.cluster.restart(i)

        return Applied(step, "kill every master", everyone, restart_all)

    def _pause(self, step: Step, leader: int, others: list[int]) -> Applied:
        self.cluster.pause(leader)
        return Applied(
            step, f"pause master {leader}", [leader], lambda: self.cluster.resume(leader)
        )

    def _isolate(self, step: Step, leader: int, others: list[int]) -> Applied:
        net = self._need_net()
        net.isolate(self.hosts[leader])
        return Applied(step, f"isolate master {leader}", [leader], net.heal)

    def _split(self, step: Step, leader: int, others: list[int]) -> Applied:
        net = self._need_net()
        small = (self.masters - 1) // 2  # a minority: at most n//2 - (1 if n even)
        if step.fault.side == "minority":
            minority, majority = [leader, *others[: small - 1]], others[small - 1 :]
        else:
            minority, majority = others[:small], [leader, *others[small:]]
        net.partition(
            [self.hosts[i] for i in minority], [*(self.hosts[i] for i in majority), *self.others]
        )
        what = f"split minority {sorted(minority)} / majority {sorted(majority)}"
        return Applied(step, what, sorted(minority), net.heal)

    def _bridge(self, step: Step, leader: int, others: list[int]) -> Applied:
        net = self._need_net()
        if step.fault.side == "bridge":
            bridge, rest = leader, others
        else:
            bridge, rest = others[0], [leader, *others[1:]]
        half = (len(rest) + 1) // 2
        a, c = rest[:half], rest[half:]
        for x in a:
            for y in c:
                net.cut(self.hosts[x], self.hosts[y], both=True)
        what = f"bridge {sorted(a)} - {bridge} - {sorted(c)}"
        return Applied(step, what, [bridge], net.heal)

    def _loss(self, step: Step, leader: int, others: list[int]) -> Applied:
        net = self._need_net()
        p = step.fault.percent
        for j in others:
            net.loss(self.hosts[leader], self.hosts[j], p)
            net.loss(self.hosts[j], self.hosts[leader], p)
        return Applied(step, f"loss {p}% on the links of master {leader}", [leader], net.heal)

    def _cut(self, step: Step, leader: int, others: list[int]) -> Applied:
        net = self._need_net()
        peer, both = others[0], step.fault.both
        net.cut(self.hosts[leader], self.hosts[peer], both=both)
        arrow = "<->" if both else "->"
        return Applied(step, f"cut master {leader} {arrow} {peer}", [leader, peer], net.heal)
