"""A master core fed arbitrary well-formed messages, from any peer, never fails or leaks.

Decoding rejects malformed frames (see test_codec_props); this is the next layer:
frames that decode fine but make no sense (unknown ids, wrong senders, calls out
of order, impossible tasks). The core must answer or ignore them, never raise,
and keep its resource accounting exact.
"""

from __future__ import annotations

from typing import Any

import msgspec
from agora.sdk.messages import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.master_kit import Harness
from support.strategies import ANY_MESSAGE

_PEERS = ("a1", "a2", "s1", "s2", "stranger")


def _cluster() -> Harness:
    h = Harness()
    h.register_agent("a1", "cpus:4;mem:4096")
    h.register_agent("a2", "cpus:4;mem:4096")
    h.subscribe("s1", partition_aware=True, failover_timeout=60)
    h.subscribe("s2")
    h.tick()
    return h


def _aim(h: Harness, msg: Message, pick: int) -> Message:
    """Point some of a random message's ids at things that exist, so it reaches deep code."""
    st = h.master.state
    real: dict[str, Any] = {}
    frameworks = sorted(st.frameworks)
    agents = sorted(st.agents)
    offers = sorted(st.offers)
    names = {f.name for f in msgspec.structs.fields(msg)}
    if "framework_id" in names and frameworks:
        real["framework_id"] = frameworks[pick % len(frameworks)]
    if "agent_id" in names and agents:
        real["agent_id"] = agents[pick % len(agents)]
    if "offer_ids" in names and offers:
        real["offer_ids"] = tuple(offers[pick % len(offers) :][:2])
    return msgspec.structs.replace(msg, **real) if pick % 3 else msg


def _check_accounting(h: Harness) -> None:
    st = h.master.state
    for agent_id, agent in st.agents.items():
        if agent.status.value != "ACTIVE":
            continue
        claimed = h.unclaimed(agent_id)
        for key in agent.tasks:
            task = st.tasks[key]
            if not task.released:
                claimed = claimed + task.resources
        for info, _role in agent.executors.values():
            claimed = claimed + info.resources
        assert agent.info.resources.contains(claimed), (agent_id, claimed)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(_PEERS), ANY_MESSAGE, st.integers(0, 30), st.floats(0, 5)),
        min_size=1,
        max_size=25,
    )
)
def test_arbitrary_messages_never_break_the_master(
    steps: list[tuple[str, Message, int, float]],
) -> None:
    h = _cluster()
    for peer, msg, pick, dt in steps:
        h.handle(peer, _aim(h, msg, pick))
        h.tick(dt)
        _check_accounting(h)
    # Still serving: a newcomer is offered everything nobody holds (above the minimum size).
    h.subscribe("newcomer")
    h.tick(1.0)
    minimum = h.config.allocator.min_allocatable
    registry = h.master.state.registry
    for agent_id, agent in h.master.state.agents.items():
        drained = agent_id in registry.agents and registry.agents[agent_id].draining
        if agent.status.value == "ACTIVE" and not drained:  # (a peer may drain it: DRAIN_AGENT)
            left = h.master.state.allocator.available(agent_id).unreserved()
            assert not any(left.contains(m) for m in minimum), (agent_id, left)
