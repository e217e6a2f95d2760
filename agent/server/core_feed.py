"""Feeding the agent core durably: stimuli in, journal committed, then actions out.

Every stimulus (a frame, a tick, an executor's exit, a disk sample...) goes to the pure core; what
it changed in the core's durable state is saved to the journal at once, and the actions it caused
are held until the journal is committed. Inside a burst of frames (:meth:`CoreFeed.serve`) that is
one commit, one fsync, at the burst's end; outside one, after each stimulus. A core that raises is
logged and the stimulus dropped; a commit that fails drops the held actions (nothing resting on
lost changes may happen) and calls ``commit_failed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Final

import structlog
from agora.agent.core import Agent
from agora.agent.server.checkpointing import Checkpointer
from agora.agent.server.history import AgentHistory
from agora.agent.server.journal import JournalError
from agora.sdk.transport import MasterLink, Received, Server

__all__ = ["CoreFeed"]

log = structlog.get_logger(__name__)

_BURST: Final = 512  # frames handled per turn before yielding to the other tasks


class CoreFeed:
    """Feeds ``core()``, journals through ``checkpoint()`` and hands committed actions to
    ``perform`` (getters: the daemon replaces both as it starts)."""

    def __init__(
        self,
        core: Callable[[], Agent],
        checkpoint: Callable[[], Checkpointer],
        history: AgentHistory,
        *,
        perform: Callable[[list[object]], None],
        commit_failed: Callable[[], None],
    ) -> None:
        self._core = core
        self._checkpoint = checkpoint
        self._history = history
        self._perform = perform
        self._commit_failed = commit_failed
        #: Actions held while a burst of stimuli is fed to the core (performed after one commit).
        self._pending: list[object] = []
        self._in_burst = False

    def call(self, what: str, fn: Callable[..., Iterable[object]], *args: object) -> None:
        """Feed the core; a failure there is logged and dropped, never fatal. What the stimulus
        changed goes to the journal; its actions are performed once that is committed (at the
        end of the burst, when inside one)."""
        try:
            actions = fn(*args)
        except Exception:
            log.exception("core_failed", stimulus=what)
            return
        self._pending.extend(actions)
        core = self._core()
        if self._history.enabled:
            self._history.settled(core.tasks())
        self._checkpoint().save(core.checkpoint())
        if not self._in_burst:
            self.flush()

    def recovered(self, actions: Iterable[object]) -> None:
        """The core took its state back from the checkpoint: journal it, perform ``actions``."""
        self._pending.extend(actions)
        core = self._core()
        if self._history.enabled:
            self._history.recovered(core.tasks())  # launched before the restart
            self._history.settled(core.tasks())
        self._checkpoint().save(core.checkpoint())
        self.flush()

    def flush(self) -> None:
        """Commit the journal (one fsync), then perform the actions it covers."""
        try:
            self._checkpoint().commit()
        except (OSError, JournalError) as exc:
            # Without a durable checkpoint nothing may be acknowledged: stop, keep the tasks.
            log.error("checkpoint_commit_failed", error=str(exc))
            self._commit_failed()
            # Nothing that rests on the lost changes may happen: no launch, no acknowledgement.
            self._pending = []
        actions, self._pending = self._pending, []
        if actions:
            self._perform(actions)

    async def serve(self, link: MasterLink | Server, handle: Callable[[Received], None]) -> None:
        """Feed what arrives on ``link`` to ``handle``, a burst at a time: its actions are
        performed after one commit at the burst's end."""
        while True:
            received = await link.recv()
            self._in_burst = True
            try:
                handle(received)
                n = 1
                while n < _BURST:
                    more = link.recv_nowait()
                    if more is None:
                        break
                    handle(more)
                    n += 1
            finally:
                self._in_burst = False
                self.flush()
            await asyncio.sleep(0)
