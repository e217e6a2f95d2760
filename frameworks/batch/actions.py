"""What the scheduling core asks the service to do; the service does it after the job store has
committed every record the core changed (so nothing is launched or acknowledged that a crash
could forget)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from agora.sdk.ids import OfferID
from agora.sdk.messages import GangRequest, TaskInfo

__all__ = [
    "Action",
    "Decline",
    "Kill",
    "Launch",
    "Reconcile",
    "RequestGang",
    "Revive",
    "Suppress",
]


@dataclass(frozen=True, slots=True)
class Launch:
    """ACCEPT ``offer_ids`` (one agent's offer, or a whole gang bundle) launching ``tasks``; what
    is left of the offers is declined for ``refuse_seconds``."""

    offer_ids: tuple[OfferID, ...]
    tasks: tuple[TaskInfo, ...]
    refuse_seconds: float = 1.0


@dataclass(frozen=True, slots=True)
class Decline:
    offer_ids: tuple[OfferID, ...]
    refuse_seconds: float


@dataclass(frozen=True, slots=True)
class Kill:
    task_id: str
    agent_id: str


@dataclass(frozen=True, slots=True)
class RequestGang:
    request: GangRequest


@dataclass(frozen=True, slots=True)
class Reconcile:
    """Ask the master for the latest state of these (task id, agent id) pairs."""

    tasks: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Revive:
    """There is work again: offers are wanted."""


@dataclass(frozen=True, slots=True)
class Suppress:
    """Nothing to launch: no offers until the next Revive."""


Action: TypeAlias = Launch | Decline | Kill | RequestGang | Reconcile | Revive | Suppress
