"""A new leader's first seconds: who is expected back, when to start offering, who is late.

A master core starts from the registry it was elected with. Agents admitted there are expected to
re-register; allocation waits until ``recovery_agent_share`` of them are back or
``recovery_hold_off`` has passed, so the first offers are not made from a half-known cluster.
Agents still missing after ``agent_reregister_timeout`` are recorded unreachable in the registry
(without status updates: frameworks learn by reconciling, as in Mesos). Frameworks of the registry
get a re-subscription window (``resubscribe_window``) and then their own ``failover_timeout``:
a framework's failover clock starts only when it disconnects from a leader it subscribed with,
so a scheduler that simply follows the leader change keeps its tasks whatever its timeout
(``agora run``'s is 0). Frameworks the registry does not know but re-registering agents run tasks
for get the same window.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from agora.master.core.state import MasterState
from agora.master.registry import MarkUnreachable
from agora.sdk.ids import FrameworkID

__all__ = ["activate", "allocation_allowed", "expect_frameworks", "expire_recovery"]


def activate(st: MasterState, now: float) -> None:
    """Seed the soft state from the registry (called once, when the core is made)."""
    reg = st.registry
    cfg = st.config
    st.removed_agents.update(reg.removed_agents)
    st.removed_frameworks.update(reg.removed_frameworks)
    for role, weight in reg.weights.items():
        st.allocator.set_weight(role, weight)
    for role, quota in reg.quotas.items():
        st.allocator.set_quota(role, quota.guarantee, quota.limit)
    st.recovering_agents = {entry.agent_id for entry in reg.admitted()}
    st.recovery_expected = len(st.recovering_agents)
    if st.recovering_agents:
        st.allocation_held_until = now + cfg.recovery_hold_off
        st.recovery_deadline = now + cfg.agent_reregister_timeout
    window = cfg.resubscribe_window
    st.absent_frameworks = {
        fid: now + window + max(entry.failover_timeout, 0.0)
        for fid, entry in sorted(reg.frameworks.items())
    }


def expect_frameworks(st: MasterState, framework_ids: Iterable[FrameworkID]) -> None:
    """Frameworks a re-registered agent runs tasks for that this leader has neither seen nor
    expects: they get the re-subscription window counted from activation (their failover timeout
    is unknown), then their tasks are killed like any absent framework's."""
    deadline = st.leader_since + st.config.resubscribe_window
    for framework_id in sorted(set(framework_ids)):
        if (
            framework_id not in st.frameworks
            and framework_id not in st.absent_frameworks
            and framework_id not in st.removed_frameworks
        ):
            st.absent_frameworks[framework_id] = deadline


def allocation_allowed(st: MasterState, now: float) -> bool:
    """False while the hold-off after activation lasts and too few agents are back."""
    held = st.allocation_held_until
    if held is None:
        return True
    expected = st.recovery_expected or 1
    back = expected - len(st.recovering_agents)
    if now >= held or back / expected >= st.config.recovery_agent_share:
        st.allocation_held_until = None
        st.full_allocation_due = True
        return True
    return False


def expire_recovery(st: MasterState, now: float) -> None:
    """Agents of the registry that never came back are unreachable, through a commit."""
    deadline = st.recovery_deadline
    if deadline is None or now < deadline:
        return
    st.recovery_deadline = None
    late, st.recovering_agents = sorted(st.recovering_agents), set()
    for agent_id in late:
        if agent_id in st.agents or agent_id in st.busy_agents:
            continue
        # Busy until committed: an agent re-registering meanwhile is refused (it retries) rather
        # than readmitted here while the registry is about to call it unreachable.
        st.busy_agents.add(agent_id)
        settle = functools.partial(st.busy_agents.discard, agent_id)
        st.propose(
            MarkUnreachable(agent_id=agent_id, time=now),
            functools.partial(_settled, settle),
            settle,
            now=now,
        )


def _settled(settle: Callable[[], object], _now: float) -> None:
    settle()
