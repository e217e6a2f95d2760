"""The operator calls RESERVE_RESOURCES and UNRESERVE_RESOURCES in the master core: free
resources of an agent become reserved to a role (offered only to it, checkpointed by the
agent), dynamic reservations go back; bad input is an ERROR and changes nothing."""

from __future__ import annotations

import pytest
from agora.sdk.ids import AgentID
from agora.sdk.messages import (
    CheckpointResources,
    Error,
    Message,
    OperatorDone,
    Rescind,
    ReserveResources,
    RunTask,
    UnreserveResources,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to

R = Resources.parse


def _cluster() -> tuple[Harness, AgentID]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096;disk(db):10")
    return h, agent


def test_operator_reserve_is_offered_only_to_the_role_and_checkpointed() -> None:
    h, agent = _cluster()
    h.subscribe("other", roles=("*",))
    held = only(offers_in(h.tick(), "other"))  # an outstanding offer holds everything
    out = h.handle("op", ReserveResources(agent_id=agent, resources=R("cpus(db):2;mem(db):512")))
    assert only(of_type(sent_to(out, "op"), OperatorDone)).call == "RESERVE_RESOURCES"
    assert only(of_type(sent_to(out, "other"), Rescind)).offer_id == held.offer_id
    checkpoint = only(of_type(sent_to(out, "a1"), CheckpointResources))
    assert checkpoint.resources == R("cpus(db):2;mem(db):512")
    assert h.master.state.allocator.total(agent) == R(
        "cpus:2;mem:3584;cpus(db):2;mem(db):512;disk(db):10"
    )
    again = offers_in(out + h.tick(1.0), "other")
    assert [o.resources for o in again] == [R("cpus:2;mem:3584")]
    h.subscribe("db", roles=("db",))
    h.tick(1.0)
    assert [o.resources for o in offers_in(h.sent, "db")] == [
        R("cpus(db):2;mem(db):512;disk(db):10")
    ]


def test_operator_unreserve_gives_dynamic_reservations_back() -> None:
    h, agent = _cluster()
    h.handle("op", ReserveResources(agent_id=agent, resources=R("cpus(db):2")))
    out = h.handle("op", UnreserveResources(agent_id=agent, resources=R("cpus(db):1")))
    assert of_type(sent_to(out, "op"), OperatorDone)
    assert only(of_type(sent_to(out, "a1"), CheckpointResources)).resources == R("cpus(db):1")
    assert h.master.state.allocator.total(agent) == R("cpus:3;mem:4096;cpus(db):1;disk(db):10")


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (ReserveResources(agent_id=AgentID("nope"), resources=R("cpus(db):1")), "no active"),
        (ReserveResources(agent_id=AgentID("A"), resources=R("cpus:1")), "name a role"),
        (ReserveResources(agent_id=AgentID("A"), resources=R("cpus(a):1;mem(b):1")), "several"),
        (ReserveResources(agent_id=AgentID("A"), resources=R("cpus(db):5")), "not free"),
        (ReserveResources(agent_id=AgentID("A"), resources=Resources()), "no resources"),
        (UnreserveResources(agent_id=AgentID("A"), resources=R("disk(db):10")), "only dynamic"),
        (UnreserveResources(agent_id=AgentID("A"), resources=R("cpus(db):1")), "only dynamic"),
    ],
)
def test_bad_calls_are_refused_and_change_nothing(call: Message, words: str) -> None:
    h, agent = _cluster()
    if getattr(call, "agent_id", None) == "A":
        call = type(call)(agent_id=agent, resources=call.resources)  # type: ignore[attr-defined]
    before = h.master.state.allocator.total(agent)
    out = h.handle("op", call)
    error = only(of_type(sent_to(out, "op"), Error))
    assert words in error.message
    assert of_type(sent_to(out, "a1"), CheckpointResources) == []
    assert h.master.state.allocator.total(agent) == before


def test_resources_in_use_by_a_task_cannot_be_reserved() -> None:
    h, agent = _cluster()
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:3;mem:128", agent)], refuse_seconds=60.0)
    assert of_type(sent_to(out, "a1"), RunTask)
    out = h.handle("op", ReserveResources(agent_id=agent, resources=R("cpus(db):2")))
    assert "not free" in only(of_type(sent_to(out, "op"), Error)).message
    out = h.handle("op", ReserveResources(agent_id=agent, resources=R("cpus(db):1")))
    assert of_type(sent_to(out, "op"), OperatorDone)
    # The task keeps its allocation through the rebuild of the agent's total.
    assert h.unclaimed(agent) == R("mem:3968;cpus(db):1;disk(db):10")
