"""Prompt allocation: new demand is offered at once, not at the next batch tick.

A framework that subscribes (or re-subscribes after a failover), revives, requests a gang, or an
operator change that owes a full pass, sets ``full_allocation_due``. Waiting for the periodic
tick (``allocation_interval``) would make a new scheduler's first offer take up to a whole
interval; Mesos's allocator likewise allocates for a newly added framework at once. The pass
runs at the end of the handling that caused it (in the daemon: once per drained burst of
messages), and at most once per ``allocation_interval * PROMPT_GAP_FRACTION``: a storm of
subscriptions leaves the rest to the tick instead of making one full pass per message.
"""

from __future__ import annotations

from agora.master.core import offers, recovery
from agora.master.core.state import MasterState

#: The shortest spacing of prompt full passes, as a fraction of ``allocation_interval``.
PROMPT_GAP_FRACTION = 0.1


def prompt_allocation(st: MasterState, now: float) -> bool:
    """Make the owed full allocation pass now if allowed; True when one was made."""
    if not st.full_allocation_due or now < st.next_prompt_at:
        return False
    if not recovery.allocation_allowed(st, now):
        return False  # after a failover: wait for the agents to come back (see recovery)
    st.full_allocation_due = False
    st.next_prompt_at = now + st.config.allocation_interval * PROMPT_GAP_FRACTION
    st.dirty_agents.clear()
    offers.allocate(st, now, None)
    return True
