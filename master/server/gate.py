"""The socket's gate: which client calls reach the master core, and whose election traffic counts.

Client calls go through :func:`agora.master.server.access.authorize` (CURVE principals and the
ACL); a refused call is logged and answered with an ERROR FORBIDDEN (made here, sent by the
daemon). Frames that came through a relay are checked first (:meth:`Gate.refuse_relayed`).
Under CURVE only the electors' principals (the ACL's ``masters`` unless named) take part in the
election; refused election traffic is logged a few times a second per peer and the rest
summarised, so one forger cannot fill the log.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import structlog
from agora.master.core import Send
from agora.master.server.access import authorize
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.messages import DetectLeader, Error, ErrorCode, Heartbeat, Message, agent
from agora.sdk.transport import Acl, Received
from agora.sdk.transport.base import RELAY_SEP

__all__ = ["RELAYABLE", "Gate", "error_to"]

log = structlog.get_logger(__name__)

#: What may come through a relay: what agents send (and their liveness and leader probes).
RELAYABLE: Final = frozenset((*agent.MESSAGES, Heartbeat, DetectLeader))


def error_to(peer: str, code: ErrorCode, text: str, epoch: int) -> Send:
    """The ERROR ``code`` the master answers ``peer`` with."""
    return Send(to=peer, message=Error(message=text, code=code), epoch=epoch)


class Gate:
    """The socket's checks: :meth:`authorize` for client calls, :meth:`admits_election` for
    election traffic."""

    def __init__(
        self, acl: Acl | None, *, authenticated: bool, electors: Collection[str] | None
    ) -> None:
        """``electors``: the principals whose election traffic counts under CURVE (None: the
        ACL's ``masters``)."""
        self._acl = acl
        self._authenticated = authenticated
        self._electors = frozenset(electors) if electors is not None else None
        #: False when there is nothing to check (no CURVE, no ACL): calls go to the core as sent.
        self._checked = authenticated or acl is not None
        #: Refused election traffic per peer: a few a second (one forger must not fill the log).
        self._refusal_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)

    def authorize(
        self, peer: str, message: Message, principal: str | None, epoch: int
    ) -> Message | Send:
        """The message to hand the core (a SUBSCRIBE may gain its principal), or the ERROR
        FORBIDDEN (of ``epoch``) to answer instead."""
        if not self._checked:
            return message
        checked = authorize(message, principal, acl=self._acl, authenticated=self._authenticated)
        if isinstance(checked, str):
            log.warning(
                "forbidden", peer=peer, principal=principal, message=message.NAME, reason=checked
            )
            return error_to(
                peer, ErrorCode.FORBIDDEN, f"{message.NAME} forbidden: {checked}", epoch
            )
        return checked

    def refuse_relayed(self, received: Received, now: float, epoch: int) -> Send | None:
        """The ERROR FORBIDDEN (of ``epoch``) that answers a frame which came through a relay
        and must not reach the core, or None when it may.

        A relay carries agents only: any other message is refused, and so is all of it when
        CURVE is on and the relay's principal is not one of the ACL's ``relays`` (the relay
        vouches for its agents' principals), or when it names no principal for its agent."""
        message = received.message
        if message is not None and type(message) not in RELAYABLE:
            why = f"{message.NAME} is not an agent's message: a relay carries agents only"
        elif not self._authenticated:
            return None
        elif self._acl is None or not self._acl.may_relay(received.relay):
            why = f"principal {received.relay!r} may not relay (the ACL's relays)"
        elif received.principal is None and message is not None:
            why = "the relay named no principal for its agent"
        else:
            return None
        if self._refusal_log.allow(received.peer.partition(RELAY_SEP)[0], now):
            log.warning(
                "relayed_frame_refused",
                peer=received.peer,
                relay=received.relay,
                message=message.NAME if message is not None else None,
                reason=why,
            )
        name = message.NAME if message is not None else "frame"
        return error_to(received.peer, ErrorCode.FORBIDDEN, f"{name} forbidden: {why}", epoch)

    def admits_election(
        self, peer: str, message: Message, principal: str | None, now: float
    ) -> bool:
        """Whether election traffic from ``peer`` counts; refusals are logged (rate-limited by
        ``now``, monotonic seconds)."""
        if not self._authenticated or self.may_elect(principal):
            return True
        if self._refusal_log.allow(peer, now):
            log.warning(
                "election_traffic_refused", peer=peer, principal=principal, kind=message.NAME
            )
        return False

    def may_elect(self, principal: str | None) -> bool:
        """Whether ``principal`` is one of the electors (under CURVE)."""
        if principal is None:
            return False
        if self._electors is not None:
            return principal in self._electors
        return self._acl is None or self._acl.may_elect(principal)

    def summarise_refusals(self, now: float) -> None:
        """Log how much refused election traffic went unlogged lately, if any."""
        refused = self._refusal_log.summary(now)
        if refused is not None:
            log.warning("election_traffic_refusals_suppressed", **refused.log_fields())
