"""The daemon's queue of registry changes the election group decided: they take effect in the
order decided, only while the master may act, a budget at a time, and never in a core that is no
longer this master's."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, cast

from agora.master.core import Master
from agora.master.core.actions import Propose
from agora.master.server.commits import Commits, Decided

DEADLINE = 5.0


class Rig:
    """A Commits worker over stand-in cores: records what took effect and each burst's end."""

    def __init__(self, budget: float = 1.0, effect_seconds: float = 0.0) -> None:
        self.core: Any = object()
        self.acting = True
        self.effects: list[tuple[object, int, bool]] = []
        self.bursts: list[int] = []  # how many changes had taken effect at each burst's end
        self.acting_calls = 0
        self.effect_seconds = effect_seconds
        self.commits = Commits(
            current=lambda: cast(Master, self.core),
            acting=self._acting,
            take_effect=self._take_effect,
            burst_done=self._burst_done,
            budget=budget,
        )

    def _acting(self) -> Master | None:
        self.acting_calls += 1
        return cast(Master, self.core) if self.acting else None

    async def _take_effect(self, decided: Decided) -> None:
        if self.effect_seconds:
            await asyncio.sleep(self.effect_seconds)
        self.effects.append((decided.core, decided.action.seq, decided.committed))

    async def _burst_done(self) -> None:
        self.bursts.append(len(self.effects))

    def decide(self, seq: int, committed: bool = True, core: object | None = None) -> None:
        change = Propose(seq=seq, op=cast(Any, None))
        self.commits.decided(Decided(cast(Master, core or self.core), change, committed))


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A coroutine test run to its end on a loop of its own."""

    @functools.wraps(test)
    def wrapper() -> None:
        asyncio.run(test())

    return wrapper


async def until(predicate: Any) -> None:
    async with asyncio.timeout(DEADLINE):
        while not predicate():
            await asyncio.sleep(0.001)


@run
async def test_decided_changes_take_effect_in_order_then_one_burst_end() -> None:
    rig = Rig()
    worker = asyncio.create_task(rig.commits.run())
    try:
        for seq in range(5):
            rig.decide(seq, committed=seq != 3)
        await until(lambda: len(rig.effects) == 5)
        assert [(s, c) for _, s, c in rig.effects] == [
            (0, True),
            (1, True),
            (2, True),
            (3, False),
            (4, True),
        ]
        await until(lambda: rig.bursts)
        assert rig.bursts == [5]  # one allocation covers the whole run
        assert len(rig.commits) == 0
    finally:
        worker.cancel()


@run
async def test_nothing_takes_effect_while_the_lease_has_lapsed_and_no_one_polls() -> None:
    rig = Rig()
    rig.acting = False
    worker = asyncio.create_task(rig.commits.run())
    try:
        for seq in range(1000):
            rig.decide(seq)
        await asyncio.sleep(0.05)
        assert rig.effects == []
        calls = rig.acting_calls
        await asyncio.sleep(0.05)
        assert rig.acting_calls == calls, "the worker polled while the lease had lapsed"
        rig.acting = True
        rig.commits.poke()  # the daemon's tick
        await until(lambda: len(rig.effects) == 1000)
        assert [s for _, s, _ in rig.effects] == list(range(1000))
    finally:
        worker.cancel()


@run
async def test_changes_of_a_lost_term_are_dropped() -> None:
    rig = Rig()
    old = rig.core
    rig.acting = False
    worker = asyncio.create_task(rig.commits.run())
    try:
        rig.decide(1)
        rig.decide(2)
        await asyncio.sleep(0.01)
        rig.core = object()  # a new term's core (or None: standing by)
        rig.acting = True
        rig.decide(3)  # decided for the new core
        await until(lambda: rig.effects)
        await asyncio.sleep(0.01)
        assert [(c is old, s) for c, s, _ in rig.effects] == [(False, 3)]
    finally:
        worker.cancel()


@run
async def test_a_long_run_yields_the_loop_between_budgets() -> None:
    rig = Rig(budget=0.005)
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    rig.effect_seconds = 0  # effects are instant, but 20,000 of them take well over 5 ms
    other = asyncio.create_task(other_work())
    worker = asyncio.create_task(rig.commits.run())
    try:
        for seq in range(20_000):
            rig.decide(seq)
        await until(lambda: len(rig.effects) == 20_000)
        assert len(rig.bursts) > 1, "20,000 changes in one turn: the loop was never yielded"
        assert ticks > len(rig.bursts) // 2
    finally:
        worker.cancel()
        other.cancel()
