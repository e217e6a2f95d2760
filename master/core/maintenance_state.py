"""What the master remembers of maintenance between stimuli (soft state: a new leader rebuilds
it from the registry's windows, sending fresh inverse offers; the frameworks answer again).

Kept apart from :mod:`maintenance` (the logic) so that :mod:`state` can hold it without an
import cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from agora.master.core.actions import Peer
from agora.sdk.ids import AgentID, FrameworkID

__all__ = ["ACCEPTED", "DECLINED", "PENDING", "InverseOfferState", "MaintenanceState"]

PENDING = "PENDING"
ACCEPTED = "ACCEPTED"
DECLINED = "DECLINED"


@dataclass(slots=True)
class InverseOfferState:
    """One inverse offer: a framework asked to vacate an agent for a host's window."""

    inverse_offer_id: str
    framework_id: FrameworkID
    agent_id: AgentID
    hostname: str
    start: float
    duration: float
    answer: str = PENDING
    #: The connection it was last sent on (None: not since the framework's last subscription);
    #: sent again when the framework subscribes anew.
    sent_to: Peer | None = None


@dataclass(slots=True)
class MaintenanceState:
    #: Inverse offers by id, and by (agent, framework).
    inverse_offers: dict[str, InverseOfferState] = field(default_factory=dict)
    by_agent: dict[tuple[AgentID, FrameworkID], str] = field(default_factory=dict)
    #: (hostname, start, agent) of windows whose start drained the agent under this leader.
    started: set[tuple[str, float, AgentID]] = field(default_factory=set)
    #: The next time deadlines and windows are looked at (they are checked once a second).
    next_check_at: float = 0.0
    #: When they were last looked at (what readers' SCHEDULED/DRAINING is relative to).
    checked_at: float = 0.0
