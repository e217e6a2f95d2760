"""The master core's settings, with Mesos's defaults unless noted."""

from __future__ import annotations

from dataclasses import dataclass, field

from agora.master.allocator import AllocatorConfig
from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core.run_as import RunAsPolicy
from agora.sdk.resources import Resources

__all__ = ["MasterConfig"]


@dataclass(frozen=True, slots=True)
class MasterConfig:
    master_id: str = "master"
    #: The cluster's name, shown to operators (``agora top``, ``/state``).
    cluster: str = "agora"
    address: str = ""
    #: Election term of this master; stamped on every message it sends and embedded in the
    #: ids it mints. Fixed for the life of a core (a new term means a new core).
    epoch: int = 1
    allocation_interval: float = 1.0
    #: The least time a framework's decline keeps the declined resources from it (a DECLINE, or
    #: an ACCEPT without operations): a smaller ``refuse_seconds``, 0 included,
    #: counts as this. The filter also lasts through the next batch allocation (see the
    #: allocator), so a scheduler that declines everything cannot make the master offer the
    #: same resources in a tight loop. What is left of an offer an ACCEPT did something with
    #: comes back as the framework asked (launching is progress, not a spin).
    min_refuse_seconds: float = 0.1
    #: Outstanding offers are rescinded after this long; ``None`` keeps them (Mesos default).
    offer_timeout: float | None = None
    heartbeat_interval: float = 15.0
    agent_ping_interval: float = 15.0
    max_agent_ping_timeouts: int = 5
    #: Unreachable agents are forgotten after this long (Mesos: 2 weeks) ...
    unreachable_gc_age: float = 14 * 24 * 3600.0
    #: ... or, oldest first, once there are more of them than this (Mesos: 102,400).
    max_unreachable_agents: int = 102_400
    #: The ACL's ``[run_as]`` rule, checked on every launch; None: any task runs as any user.
    run_as: RunAsPolicy | None = None
    #: Roles frameworks may subscribe with; empty admits any valid role name.
    roles: frozenset[str] = frozenset()
    weights: dict[str, float] = field(default_factory=dict)
    #: Per-role quota on scalars: role -> (guarantee, limit or None).
    quotas: dict[str, tuple[Resources, Resources | None]] = field(default_factory=dict)
    #: Terminal tasks remembered per framework after their last update was acknowledged.
    max_completed_tasks_per_framework: int = 1000
    #: Removed frameworks remembered (with their completed tasks) for operators (Mesos: 50).
    max_completed_frameworks: int = 50
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    #: Taking back what roles below their guarantee are owed (see master/core/reclaim.py).
    reclaim: ReclaimConfig = field(default_factory=ReclaimConfig)
    #: Registry changes (agents admitted, unreachable or gone; frameworks added or removed) wait
    #: for the daemon to commit them (``Propose`` actions) before they take effect. Off, the core
    #: applies them to its own registry at once (one master, tests, simulations).
    replicated: bool = False
    #: The shell drains messages in bursts and calls ``Master.end_burst`` after each: ``handle``
    #: then leaves the event-triggered allocation of what a message freed to the end of its
    #: burst. Off, every ``handle`` allocates at once (tests, simulations).
    bursts: bool = False
    #: After a failover, agents of the registry that have not re-registered this long after the
    #: new leader's activation are marked unreachable (Mesos: ``agent_reregister_timeout``).
    agent_reregister_timeout: float = 600.0
    #: After a failover, every framework the registry or a re-registered agent knows gets this
    #: long to re-subscribe with the new leader before its own ``failover_timeout`` starts to
    #: count (None: as long as ``agent_reregister_timeout``). A framework cannot have
    #: disconnected from a leader it never subscribed with.
    framework_reregister_timeout: float | None = None
    #: Allocation waits after activation until this share of the registry's agents is back ...
    recovery_agent_share: float = 0.8
    #: ... or this many seconds have passed, whichever comes first.
    recovery_hold_off: float = 2.0
    #: The daemon runs without CURVE (``--insecure``): operators see it in the state (``agora
    #: top``), since anyone who reaches the master may then act as anyone.
    insecure: bool = False

    @property
    def resubscribe_window(self) -> float:
        """How long frameworks have to re-subscribe after a leader change (see above)."""
        window = self.framework_reregister_timeout
        return self.agent_reregister_timeout if window is None else window
