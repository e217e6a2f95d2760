"""The allocator: pure DRF, quota, filters and gang offers; time is an argument.

``Allocator`` takes agents, frameworks and returning resources, and ``allocate(now)`` hands
back the offers to make (``Allocation``) and gang bundles (``GangAllocation``). The sorters
that order roles and frameworks are public so they can be tested and reused on their own.
"""

from agora.master.allocator.allocator import Allocator
from agora.master.allocator.sorter import DRFSorter, RandomSorter, Sorter
from agora.master.allocator.types import (
    Allocation,
    AllocatorConfig,
    AllocatorError,
    GangAllocation,
    GangExpired,
)

__all__ = [
    "Allocation",
    "Allocator",
    "AllocatorConfig",
    "AllocatorError",
    "DRFSorter",
    "GangAllocation",
    "GangExpired",
    "RandomSorter",
    "Sorter",
]
