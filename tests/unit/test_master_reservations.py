"""Dynamic reservations in the master core: RESERVE and UNRESERVE inside ACCEPT.

Named after the rules of Mesos's reservation documentation (and master_validation /
reservation tests): reserved resources are offered only to their role, an invalid
operation is dropped alone with an ERROR, and nothing changes for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    Accept,
    Error,
    ErrorCode,
    Filters,
    Launch,
    Offer,
    Operation,
    Reserve,
    RunTask,
    Unreserve,
)
from agora.sdk.resources import Resources
from support.master_kit import (
    Harness,
    Send,
    of_type,
    offers_in,
    only,
    sent_to,
    task_info,
    updates_in,
)

R = Resources.parse
AGENT = "cpus:4;mem:4096"


def accept(
    h: Harness,
    peer: str,
    fw: FrameworkID,
    offer: Offer,
    *ops: Operation,
    refuse_seconds: float = 0.0,
) -> list[Send]:
    return h.handle(
        peer,
        Accept(
            framework_id=fw,
            offer_ids=(offer.offer_id,),
            operations=ops,
            filters=Filters(refuse_seconds=refuse_seconds),
        ),
    )


def launch(task_id: str, resources: str, agent_id: AgentID) -> Launch:
    return Launch(task_infos=(task_info(task_id, resources, agent_id),))


def gold_offer(resources: str = AGENT) -> tuple[Harness, AgentID, FrameworkID, Offer]:
    h = Harness()
    agent = h.register_agent("a1", resources)
    fw = h.subscribe("s1", roles=("gold",))
    offer = only(offers_in(h.tick(), "s1"))
    assert offer.role == "gold"
    return h, agent, fw, offer


def total(h: Harness, agent: AgentID) -> Resources:
    return h.master.state.allocator.total(agent)


def next_offer(h: Harness, out: list[Send], peer: str = "s1") -> Offer:
    """The one offer ``peer`` got in ``out`` (the ACCEPT re-offers at once) or at the next tick."""
    return only(offers_in(out + h.tick(1.0), peer))


def errors(out: Sequence[Send], peer: str) -> list[Error]:
    return of_type(sent_to(out, peer), Error)


def test_reserve_then_launch_in_the_same_accept() -> None:
    h, agent, fw, offer = gold_offer()
    out = accept(
        h,
        "s1",
        fw,
        offer,
        Reserve(resources=R("cpus(gold):2;mem(gold):1024")),
        launch("t1", "cpus(gold):1;mem(gold):512", agent),
    )
    assert errors(out, "s1") == []
    run = only(of_type(sent_to(out, "a1"), RunTask))
    assert run.task.resources == R("cpus(gold):1;mem(gold):512")
    assert total(h, agent) == R("cpus:2;mem:3072;cpus(gold):2;mem(gold):1024")
    # The rest of the offer came back with its new roles: re-offered to s1 as reserved.
    again = next_offer(h, out)
    assert again.resources == R("cpus:2;mem:3072;cpus(gold):1;mem(gold):512")
    assert h.unclaimed(agent) + R("cpus(gold):1;mem(gold):512") == total(h, agent)


def test_launch_cannot_use_reserved_resources_before_the_reserve() -> None:
    h, agent, fw, offer = gold_offer()
    out = accept(
        h,
        "s1",
        fw,
        offer,
        launch("t1", "cpus(gold):1", agent),
        Reserve(resources=R("cpus(gold):1")),
    )
    assert of_type(sent_to(out, "a1"), RunTask) == []
    assert only(updates_in(out, "s1")).task_id == "t1"
    assert errors(out, "s1") == []
    assert total(h, agent) == R("cpus:3;mem:4096;cpus(gold):1")


def test_reserved_leftovers_are_offered_only_to_their_role() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    gold = h.subscribe("s1", roles=("gold",))
    offer = only(offers_in(h.tick(), "s1"))
    h.subscribe("s2", roles=("silver",))
    # s1 reserves half of the agent and declines everything for a long while.
    out = accept(
        h, "s1", gold, offer, Reserve(resources=R("cpus(gold):2;mem(gold):2048")), refuse_seconds=60
    )
    assert errors(out, "s1") == []
    seen_by_silver = [o.resources for o in offers_in(out + h.tick(1.0), "s2")]
    assert seen_by_silver == [R("cpus:2;mem:2048")]
    for _ in range(5):  # the reserved half stays unoffered: only gold may take it
        assert offers_in(h.tick(1.0), "s2") == []
    assert h.master.state.allocator.available(agent) == R("cpus(gold):2;mem(gold):2048")
    mark = len(h.sent)
    h.subscribe("s3", roles=("gold",))  # offered at subscription, not at the tick
    third = only(offers_in(h.sent[mark:] + h.tick(1.0), "s3"))
    assert third.resources == R("cpus(gold):2;mem(gold):2048")
    assert all("gold" not in o.resources.roles() for o in offers_in(h.sent, "s2"))


def test_unreserve_returns_resources_to_everyone() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    gold = h.subscribe("s1", roles=("gold",))
    first = only(offers_in(h.tick(), "s1"))
    out = accept(h, "s1", gold, first, Reserve(resources=R("cpus(gold):4")))
    assert errors(out, "s1") == []
    second = next_offer(h, out)
    assert second.resources == R("cpus(gold):4;mem:4096")
    out = accept(h, "s1", gold, second, Unreserve(resources=R("cpus(gold):4")), refuse_seconds=60)
    assert errors(out, "s1") == []
    assert total(h, agent) == R(AGENT)
    mark = len(h.sent)
    h.subscribe("s2", roles=("silver",))
    assert only(offers_in(h.sent[mark:] + h.tick(1.0), "s2")).resources == R(AGENT)


def test_unreserve_part_then_launch_on_unreserved() -> None:
    h, agent, fw, offer = gold_offer("cpus:2;cpus(gold):2;mem:1024")
    out = accept(
        h,
        "s1",
        fw,
        offer,
        Reserve(resources=R("cpus(gold):1")),
        Unreserve(resources=R("cpus(gold):1")),
        launch("t1", "cpus:2;mem:128", agent),
    )
    assert errors(out, "s1") == []
    assert only(of_type(sent_to(out, "a1"), RunTask)).task.task_id == "t1"
    assert total(h, agent) == R("cpus:2;cpus(gold):2;mem:1024")


@pytest.mark.parametrize(
    ("operation", "problem"),
    [
        (Reserve(resources=R("cpus(silver):1")), "not in role 'silver'"),
        (Reserve(resources=R("cpus(gold):8")), "exceeds what remains"),
        (Reserve(resources=R("cpus:1")), "must be reserved to a role"),
        (Reserve(resources=R("cpus(gold):1;mem:1")), "must be reserved to a role"),
        (Reserve(resources=R("")), "no resources"),
        (Reserve(resources=R("cpus(gold):1;mem(other):1")), "several roles"),
        (Unreserve(resources=R("cpus(gold):1")), "exceeds what remains"),
        (Unreserve(resources=R("cpus:1")), "must be reserved to a role"),
    ],
)
def test_invalid_operation_is_an_error_and_changes_nothing(
    operation: Operation, problem: str
) -> None:
    h, agent, fw, offer = gold_offer()
    out = accept(h, "s1", fw, offer, operation, launch("t1", "cpus:1;mem:128", agent))
    error = only(errors(out, "s1"))
    assert error.code is ErrorCode.BAD_REQUEST
    assert problem in error.message
    assert error.message.startswith(type(operation).__name__.upper())
    # Later operations still run; the invalid one changed nothing.
    assert only(of_type(sent_to(out, "a1"), RunTask)).task.task_id == "t1"
    assert total(h, agent) == R(AGENT)
    assert next_offer(h, out).resources == R("cpus:3;mem:3968")


def test_reserve_for_a_role_other_than_the_offers_is_refused() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    fw = h.subscribe("s1", roles=("gold", "silver"))
    offer = only(offers_in(h.tick(), "s1"))
    other = "silver" if offer.role == "gold" else "gold"
    out = accept(h, "s1", fw, offer, Reserve(resources=R(f"cpus({other}):1")))
    assert "does not match the offers' role" in only(errors(out, "s1")).message
    assert total(h, agent) == R(AGENT)


def test_static_reservations_cannot_be_unreserved() -> None:
    h, agent, fw, offer = gold_offer("cpus:2;cpus(gold):2;mem:1024")
    out = accept(h, "s1", fw, offer, Unreserve(resources=R("cpus(gold):1")))
    assert "only dynamically reserved" in only(errors(out, "s1")).message
    assert total(h, agent) == R("cpus:2;cpus(gold):2;mem:1024")
    # a dynamic reservation beside the static one can be unreserved
    out = accept(h, "s1", fw, next_offer(h, out), Reserve(resources=R("cpus(gold):1")))
    assert total(h, agent) == R("cpus:1;cpus(gold):3;mem:1024")
    out = accept(h, "s1", fw, next_offer(h, out), Unreserve(resources=R("cpus(gold):1")))
    assert errors(out, "s1") == []
    out = accept(h, "s1", fw, next_offer(h, out), Unreserve(resources=R("cpus(gold):1")))
    assert "only dynamically reserved" in only(errors(out, "s1")).message
    assert total(h, agent) == R("cpus:2;cpus(gold):2;mem:1024")
