"""Registry changes the election group has decided, taking effect in the master's core.

Each registry change (an agent admitted, a framework added, ...) is proposed to the group by a
task of its own. Once the group decides (committed, or given up), the change must take effect in
the core that asked for it, in the order decided, and only while this master may act (it leads
and its lease holds). In a registration storm thousands are decided in one election turn. Were
each waiting task to act on its own, thousands of continuations would run back to back, leaving
the socket loop no turn to take the group's own replies off the wire, and during a lapse of the
lease every one of them would poll for its end: the lease would lapse again, or the leader would
lose its quorum, under its own backlog.

So the decided changes queue here and one worker makes them take effect a few milliseconds at a
time, yielding in between; while the lease has lapsed it waits, without polling, for the next
:meth:`Commits.poke` (the daemon's tick). Changes decided for a core that is no longer this
master's (a term lost) are dropped: the next leader starts from the registry.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from agora.master.core import Master
    from agora.master.core.actions import Propose

__all__ = ["Commits", "Decided"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Decided:
    """One registry change the group decided on: ``committed``, or given up."""

    core: Master
    action: Propose
    committed: bool


class Commits:
    """The decided changes not yet in effect, and the worker (:meth:`run`) that applies them."""

    def __init__(
        self,
        *,
        current: Callable[[], Master | None],
        acting: Callable[[], Master | None],
        take_effect: Callable[[Decided], Awaitable[None]],
        burst_done: Callable[[], Awaitable[None]],
        budget: float,
    ) -> None:
        """``current``: this master's core now (None: it stands by). ``acting``: that core if it
        may act now. ``take_effect``: makes one decided change take effect in its core.
        ``burst_done``: called after each run of changes (one allocation covers them all).
        ``budget``: seconds of changes taken per turn before yielding the loop."""
        self._current = current
        self._acting = acting
        self._take_effect = take_effect
        self._burst_done = burst_done
        self._budget = budget
        self._queue: collections.deque[Decided] = collections.deque()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def decided(self, decided: Decided) -> None:
        """The group decided on a change: queue it behind those decided before."""
        self._queue.append(decided)
        self._wake.set()

    def poke(self) -> None:
        """Look again (the lease may hold again, or the core may have changed)."""
        if self._queue:
            self._wake.set()

    async def run(self) -> None:
        """Apply the decided changes until cancelled."""
        queue = self._queue
        clock = time.perf_counter
        while True:
            await self._wake.wait()
            self._wake.clear()
            while queue:
                current = self._current()
                while queue and queue[0].core is not current:
                    queue.popleft()  # that term's core is gone
                if not queue or self._acting() is not current:
                    break  # poked again once it may act
                give_way = clock() + self._budget
                while (
                    queue
                    and queue[0].core is current
                    and clock() < give_way
                    and self._acting() is current
                ):
                    decided = queue.popleft()
                    try:
                        await self._take_effect(decided)
                    except Exception:
                        log.exception("registry_change_effect_failed", seq=decided.action.seq)
                await self._burst_done()
                if queue:
                    await asyncio.sleep(0)  # the socket loop and the election get their turn
