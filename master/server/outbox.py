"""Carrying out what the master core said: its ``Send`` actions leave through the server.

Messages leave in the order the core produced them, per peer. UPDATEs and STATUS_UPDATE_ACKs for
peers that read batches are held (see :mod:`agora.master.server.batches`) to the end of the
receive loop's burst, or of the call outside one, and leave merged. Answers to in-process calls
(see :mod:`agora.master.server.local_calls`) are handed to their caller instead of sent, and
what goes to an HTTP scheduler to its event stream (see :mod:`agora.master.server.streams`). A
``Propose`` (a registry change to replicate) goes to the daemon's callback. Sending never raises:
a message that cannot be encoded or delivered is counted as dropped and logged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog
import zmq
from agora.master.core import Master
from agora.master.core.actions import Action, Propose
from agora.master.server.batches import Batcher
from agora.master.server.event_log import log_event
from agora.master.server.leadership import Leadership
from agora.master.server.local_calls import LOCAL_PEER
from agora.master.server.stats import DaemonStats
from agora.master.server.streams import STREAM_PEER
from agora.sdk.daemon.history import History
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import (
    Error,
    ErrorCode,
    KillTask,
    Message,
    Offers,
    RunTask,
    RunTaskGroup,
    StateReply,
)
from agora.sdk.transport import Server
from msgspec.structs import replace

__all__ = ["Outbox"]

log = structlog.get_logger(__name__)


class Outbox:
    """Sends the actions of whichever core ``core()`` gives (the daemon's, which changes with the
    leadership ``leadership()`` gives, if any)."""

    def __init__(
        self,
        server: Server,
        *,
        core: Callable[[], Master | None],
        leadership: Callable[[], Leadership | None],
        propose: Callable[[Propose], None],
        answer_local: Callable[[str, Message], None],
        deliver_stream: Callable[[str, Message], bool],
        stats: DaemonStats,
        history: History,
        debug: bool,
    ) -> None:
        self._server = server
        self._core = core
        self._leadership = leadership
        self._propose = propose
        self._answer_local = answer_local
        self._deliver_stream = deliver_stream
        self._stats = stats
        self._history = history
        self._debug = debug
        #: Updates and acknowledgements held to the end of a burst, for peers that read batches.
        self.batcher = Batcher()
        #: True while the receive loop handles a burst: held messages wait for its end.
        self.in_burst = False

    async def perform(self, actions: Iterable[Action], *, release: bool = True) -> None:
        """Send what the core said, in order per peer. Updates and acknowledgements for peers
        that read batches are held to the end of the receive loop's burst (or of this call,
        outside one, unless ``release`` is false: then until :meth:`release_batches`) and leave
        merged."""
        history = self._history
        batcher = self.batcher
        core = self._core()
        leadership = self._leadership()
        if core is not None:
            for notice in core.notices():
                emit = log.warning if notice.level == "warning" else log.info
                emit(notice.event, **dict(notice.fields))
        for action in actions:
            if isinstance(action, Propose):
                self._propose(action)
                continue
            message = action.message
            if action.to.startswith(LOCAL_PEER):
                self._answer_local(action.to, message)
                continue
            if history.enabled and isinstance(message, Offers | RunTask | RunTaskGroup):
                assert leadership is not None
                history.record("acting", term=action.epoch, until=leadership.lease_until_ns())
            if isinstance(message, StateReply) and leadership is not None:
                message = replace(message, masters=leadership.members())
            log_event(core, action)
            if action.to.startswith(STREAM_PEER):
                if not self._deliver_stream(action.to, message):
                    self._stats.messages_dropped += 1
                continue
            if batcher.hold(action):
                continue
            if batcher.holding:
                for earlier, epoch in batcher.release_for(action.to):
                    await self.send(action.to, earlier, epoch)
            await self.send(action.to, message, action.epoch)
        if release and not self.in_burst:
            await self.release_batches()

    async def release_batches(self) -> None:
        """Send everything held for peers that read batches, merged."""
        for peer, message, epoch in self.batcher.release():
            await self.send(peer, message, epoch)

    async def send(self, peer: str, message: Message, epoch: int) -> None:
        """Send one message; failures are counted as dropped and logged, never raised."""
        try:
            delivered = await self._server.send(peer, message, epoch)
        except (ProtocolError, zmq.ZMQError) as exc:
            log.error("send_failed", peer=peer, message=message.NAME, error=str(exc))
            self._stats.messages_dropped += 1
            if isinstance(message, StateReply) and isinstance(exc, ProtocolError):
                # The whole state of a big cluster can outgrow one frame: say so, and how to
                # ask instead, rather than leave the caller to time out.
                await self.send(peer, _too_big(exc), epoch)
            return
        if not delivered:
            self._stats.messages_dropped += 1
            if isinstance(message, KillTask):
                log.warning(
                    "kill_undeliverable",
                    peer=peer,
                    task_id=message.task_id,
                    kill_id=message.kill_id,
                )
            if self._debug:
                log.debug("undeliverable", peer=peer, message=message.NAME)


def _too_big(exc: ProtocolError) -> Error:
    return Error(
        code=ErrorCode.BAD_REQUEST,
        message=(
            f"the state does not fit in one message ({exc}): ask for fewer rows "
            "(GET_STATE with agents_limit and tasks_limit, as agora top does) or read the "
            "whole state from the operator HTTP API (GET /state)"
        ),
    )
