"""What reaches the agent: frames from the master and from executors, fed to the core.

Frames that decoded are counted and go to the core (a batch from the master taken apart, its parts
in order); the master's ERRORs and KILL_TASKs are logged on the way, and its (re)registration
answers say whether it reads batched status updates (see :mod:`agora.agent.server.outbox`). A
frame that did not decode is counted and logged, a few a second per peer (the master or an
executor); the rest are summarised on the tick, with the per-peer counts /metrics shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import structlog
from agora.agent.core import Agent
from agora.agent.server.history import AgentHistory
from agora.agent.server.outbox import AgentOutbox
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.messages import AgentRegistered, AgentReregistered, Error, KillTask
from agora.sdk.messages.batching import BATCHES, unbatch
from agora.sdk.transport import Received

__all__ = ["Feed", "Intake"]

log = structlog.get_logger(__name__)

_MASTER_PEER: Final = "master"  # the bad-frame limiter's key for frames from the master
_BAD_FRAME_TOP_PEERS: Final = 10  # how many peers /metrics names in the per-peer bad frames

#: The daemon's way into the core: ``feed(stimulus name, core method, *its arguments)``.
Feed = Callable[..., None]


class Intake:
    """Feeds received frames and the master link's comings and goings to ``core()`` through
    ``feed``; counts what arrived."""

    def __init__(
        self,
        core: Callable[[], Agent],
        feed: Feed,
        *,
        history: AgentHistory,
        outbox: AgentOutbox,
        master: str,
    ) -> None:
        self._core = core
        self._feed = feed
        self._history = history
        self._outbox = outbox
        self._master = master
        #: Frames from the master and executors that decoded, and that did not.
        self.messages_received = 0
        self.bad_frames_received = 0
        #: Bad-frame warnings per peer ("master" or an executor's): a few a second, the rest
        #: counted and summarised; also the per-peer counts /metrics shows.
        self._bad_frame_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)

    def bad_frames_by_peer(self) -> list[tuple[str, int]]:
        """(peer, bad frames) of the few peers with the most, among the recent."""
        return self._bad_frame_log.counts(_BAD_FRAME_TOP_PEERS)

    def summarise(self, now: float) -> None:
        """Log how many bad-frame warnings were held back (``now``: monotonic seconds)."""
        suppressed = self._bad_frame_log.summary(now)
        if suppressed is not None:
            log.warning("bad_frames_suppressed", **suppressed.log_fields())

    def from_master(self, received: Received) -> None:
        message = received.message
        if message is None:
            self.bad_frames_received += 1
            if self._bad_frame_log.allow(_MASTER_PEER, time.monotonic()):
                log.warning("bad_frame_from_master", error=str(received.error))
            return
        self.messages_received += 1
        core = self._core()
        if isinstance(message, Error):
            log.warning("master_error", code=message.code.value, message=message.message)
        elif isinstance(message, KillTask):
            task = core.task(message.framework_id, message.task_id)
            log.info(
                "kill_received",
                framework_id=message.framework_id,
                task_id=message.task_id,
                kill_id=message.kill_id,
                task_state=task.state.value if task is not None else None,
                launched=task.launched if task is not None else None,
            )
        elif isinstance(message, AgentRegistered | AgentReregistered):
            self._outbox.master_reads_batches = BATCHES in message.master_info.features
        for part in unbatch(message):
            if self._history.enabled:
                self._history.from_master(part, received.epoch, core.master_epoch)
            self._feed("from_master", core.from_master, part, received.epoch, time.time())

    def from_executor(self, received: Received) -> None:
        message = received.message
        if message is None:
            self.bad_frames_received += 1
            if self._bad_frame_log.allow(received.peer, time.monotonic()):
                log.warning(
                    "bad_frame_from_executor", peer=received.peer, error=str(received.error)
                )
            return
        self.messages_received += 1
        core = self._core()
        self._feed("from_executor", core.from_executor, received.peer, message, time.time())

    def master_connected(self) -> None:
        log.info("master_connected", master=self._master)
        core = self._core()
        self._feed("connected", core.connected, time.time())

    def master_disconnected(self) -> None:
        self._outbox.master_reads_batches = False  # until the next master says it does
        log.warning("master_disconnected", master=self._master)
        core = self._core()
        self._feed("disconnected", core.disconnected, time.time())
