"""Maintenance: operator calls that plan downtime of agents, and the inverse offers that tell
frameworks about it (Mesos's maintenance primitives).

An operator schedules a **window** (agents, a start time, a duration). Every framework with tasks
on one of those agents gets an **inverse offer** for it: "this agent will be unavailable from
``start`` for ``duration`` seconds". The framework answers with ACCEPT_INVERSE_OFFERS (it will
vacate the agent in time) or DECLINE_INVERSE_OFFERS (it will not, or cannot); the master records
the answer and shows it to operators. At the window's start the agent drains; what still runs at
the window's end is killed (reason ``AGENT_DRAINING``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages._record import MaxItems, Message, Record, Seconds, ShortStr, Timestamp

__all__ = [
    "MESSAGES",
    "AcceptInverseOffers",
    "CancelMaintenance",
    "DeclineInverseOffers",
    "InverseOffer",
    "InverseOfferAnswer",
    "InverseOffers",
    "MaintenanceSummary",
    "RescindInverseOffer",
    "ScheduleMaintenance",
]

_IDS = 1024
_MANY = 1_000_000


class InverseOffer(Record, frozen=True, kw_only=True):
    """The master asks a framework to vacate an agent: it is unavailable from ``start`` (seconds
    since the epoch) for ``duration`` seconds."""

    inverse_offer_id: ShortStr
    framework_id: FrameworkID
    agent_id: AgentID
    hostname: ShortStr = ""
    start: Timestamp = 0.0
    duration: Seconds = 0.0


class InverseOfferAnswer(Record, frozen=True, kw_only=True):
    """A framework's answer to one inverse offer: PENDING (none yet), ACCEPTED or DECLINED."""

    inverse_offer_id: ShortStr
    framework_id: FrameworkID
    agent_id: AgentID
    answer: ShortStr = "PENDING"


class MaintenanceSummary(Record, frozen=True, kw_only=True):
    """One host's maintenance window as the master shows it."""

    hostname: ShortStr
    #: The agents on the host that the master knows.
    agent_ids: Annotated[tuple[AgentID, ...], MaxItems(_IDS)] = ()
    start: Timestamp = 0.0
    duration: Seconds = 0.0
    #: SCHEDULED (before its start), DRAINING (started, tasks left) or DRAINED (started, empty).
    status: ShortStr = "SCHEDULED"
    answers: Annotated[tuple[InverseOfferAnswer, ...], MaxItems(_MANY)] = ()


# ---- scheduler <-> master -------------------------------------------------------------------


class InverseOffers(Message, frozen=True, kw_only=True):
    """Master -> scheduler: agents where the framework has tasks will be unavailable."""

    NAME: ClassVar[str] = "INVERSE_OFFERS"
    inverse_offers: Annotated[tuple[InverseOffer, ...], MaxItems(_MANY)] = ()


class RescindInverseOffer(Message, frozen=True, kw_only=True):
    """Master -> scheduler: the maintenance behind the inverse offer was cancelled."""

    NAME: ClassVar[str] = "RESCIND_INVERSE_OFFER"
    inverse_offer_id: ShortStr


class AcceptInverseOffers(Message, frozen=True, kw_only=True):
    """Scheduler -> master: the framework will vacate those agents before their windows."""

    NAME: ClassVar[str] = "ACCEPT_INVERSE_OFFERS"
    framework_id: FrameworkID
    inverse_offer_ids: Annotated[tuple[ShortStr, ...], MaxItems(_IDS)] = ()


class DeclineInverseOffers(Message, frozen=True, kw_only=True):
    """Scheduler -> master: the framework will not vacate those agents in time."""

    NAME: ClassVar[str] = "DECLINE_INVERSE_OFFERS"
    framework_id: FrameworkID
    inverse_offer_ids: Annotated[tuple[ShortStr, ...], MaxItems(_IDS)] = ()


# ---- operator calls -------------------------------------------------------------------------


class ScheduleMaintenance(Message, frozen=True, kw_only=True):
    """Plan a maintenance window for the hosts of ``agent_ids``: from ``start`` (seconds since
    the epoch) for ``duration`` seconds (> 0). Replaces a window the hosts had."""

    NAME: ClassVar[str] = "SCHEDULE_MAINTENANCE"
    agent_ids: Annotated[tuple[AgentID, ...], MaxItems(_IDS)] = ()
    start: Timestamp = 0.0
    duration: Seconds = 0.0


class CancelMaintenance(Message, frozen=True, kw_only=True):
    """Remove the windows of the hosts of ``agent_ids``; their agents drained by a window are
    reactivated and their inverse offers rescinded."""

    NAME: ClassVar[str] = "CANCEL_MAINTENANCE"
    agent_ids: Annotated[tuple[AgentID, ...], MaxItems(_IDS)] = ()


MESSAGES: tuple[type[Message], ...] = (
    InverseOffers,
    RescindInverseOffer,
    AcceptInverseOffers,
    DeclineInverseOffers,
    ScheduleMaintenance,
    CancelMaintenance,
)
