"""The allocator's public records: its configuration, what it hands out, and its errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.resources import Resources

__all__ = [
    "Allocation",
    "AllocatorConfig",
    "AllocatorError",
    "GangAllocation",
    "GangExpired",
]


class AllocatorError(ValueError):
    """A call with bad arguments: unknown framework for a gang, duplicate id, bad weight, ..."""


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """How the allocator shapes offers.

    ``min_allocatable``: an offer must contain at least ONE of these (by quantity, roles
    ignored), else it is not made; ``()`` means any non-empty offer will do.
    ``sorter``: the order used at both levels (roles, then frameworks within a role).
    ``seed``: the agent visiting order of full cycles and the random sorter derive from it.
    """

    min_allocatable: tuple[Resources, ...] = (
        Resources.parse("cpus:0.01"),
        Resources.parse("mem:32"),
    )
    sorter: Literal["drf", "random"] = "drf"
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """One offer-to-be: the resources of one agent, for one framework, in one role."""

    framework_id: FrameworkID
    agent_id: AgentID
    role: str
    resources: Resources
    #: Lent from an unmet guarantee: the owner may take it back (see reclaim.py).
    revocable: bool = False


@dataclass(frozen=True, slots=True)
class GangAllocation:
    """An all-or-nothing bundle across agents: every part is exactly ``slots x shape``."""

    framework_id: FrameworkID
    gang_id: GangID
    role: str
    parts: tuple[Allocation, ...]


@dataclass(frozen=True, slots=True)
class GangExpired:
    """A gang request that passed its hold timeout without being offered."""

    framework_id: FrameworkID
    gang_id: GangID
    reason: str
