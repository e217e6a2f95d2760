"""The allocator's mutable records of agents, frameworks and roles (private to the package)."""

from __future__ import annotations

from agora.master.allocator.amounts import EMPTY
from agora.master.allocator.sorter import Sorter
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.resources import UNRESERVED, Resources

__all__ = ["AgentState", "FrameworkState", "RoleState", "lent_slot"]


def lent_slot(role: str) -> str:
    """The slot name of a revocable offer in ``role``: a framework may hold one beside its
    ordinary offer on the same agent and role."""
    return role + "\x00lent"


class AgentState:
    """One agent: its total, what is free (not offered, not used), and who holds the rest.

    ``free`` includes ``earmark`` (what is set aside for the head gang); ordinary offers
    see ``free - earmark``. ``*_milli`` mirror the scalars of the Resources beside them.
    """

    __slots__ = (
        "active",
        "allocs",
        "busy",
        "earmark",
        "earmark_milli",
        "free",
        "free_milli",
        "id",
        "order",
        "reserved",
        "role_totals",
        "slots",
        "total",
        "total_milli",
    )

    def __init__(self, agent_id: AgentID, total: Resources, order: int) -> None:
        self.id = agent_id
        self.order = order
        self.total = total
        self.total_milli = total.scalar_totals_milli()
        # Whether anything on the agent is reserved; if not, every role sees all of it.
        self.reserved = total.roles() - {UNRESERVED} != frozenset()
        self.free = total
        self.free_milli = dict(self.total_milli)
        self.active = True
        self.allocs: dict[tuple[FrameworkID, str], Resources] = {}
        self.slots: set[tuple[FrameworkID, str]] = set()  # outstanding offers
        self.earmark: Resources = EMPTY
        self.earmark_milli: dict[str, int] = {}
        self.role_totals: dict[str, dict[str, int]] = {}
        #: The largest share of any of its scalars that frameworks hold, in whole percent
        #: rounded up (its place in ``Ledger.by_busy``).
        self.busy = 0

    def total_for(self, role: str) -> dict[str, int]:
        """Scalars of the total a framework of ``role`` could use (cached)."""
        if not self.reserved:
            return self.total_milli
        got = self.role_totals.get(role)
        if got is None:
            got = self.role_totals[role] = self.total.allocatable_to(role).scalar_totals_milli()
        return got


class FrameworkState:
    __slots__ = ("active", "id", "revocable", "roles", "suppressed")

    def __init__(
        self,
        framework_id: FrameworkID,
        roles: frozenset[str],
        suppressed: frozenset[str],
        revocable: bool = False,
    ) -> None:
        self.id = framework_id
        self.roles = roles
        self.suppressed = set(suppressed)
        self.active = True
        #: It takes revocable offers (lent from unmet guarantees).
        self.revocable = revocable


class RoleState:
    """A role in the role sorter: its frameworks' sorter and its allocation (thousandths)."""

    __slots__ = ("alloc", "name", "sorter", "subscribers")

    def __init__(self, name: str, sorter: Sorter[FrameworkID]) -> None:
        self.name = name
        self.sorter = sorter  # frameworks subscribed to the role or holding resources in it
        self.alloc: dict[str, int] = {}
        self.subscribers = 0
