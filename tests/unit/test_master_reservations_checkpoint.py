"""Dynamic reservations outlive the master's memory: after every RESERVE/UNRESERVE the master
sends the agent all its dynamic reservations (CHECKPOINT_RESOURCES), and it admits an agent
that reports them (REGISTER_AGENT / REREGISTER_AGENT ``checkpointed_resources``) with them
applied, also a new master after a failover, which then offers them only to their role."""

from __future__ import annotations

from agora.master.core import Master, MasterConfig, Send
from agora.master.registry import AdmitAgent, AgentEntry, Registry
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    Accept,
    AgentInfo,
    AgentReregistered,
    AgentTask,
    CheckpointResources,
    Filters,
    FrameworkInfo,
    Offer,
    Offers,
    Operation,
    RegisterAgent,
    ReregisterAgent,
    Reserve,
    Subscribe,
    TaskState,
    Unreserve,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info

R = Resources.parse
AGENT = AgentID("e1-A1")
INFO = AgentInfo(hostname="h1", resources=R("cpus:4;mem:4096;disk(gold):100"))
RESERVED = R("cpus(gold):2;mem(gold):1024")


def _accept(h: Harness, fw: FrameworkID, offer: Offer, *ops: Operation) -> list[Send]:
    return h.handle(
        "s1",
        Accept(
            framework_id=fw,
            offer_ids=(offer.offer_id,),
            operations=ops,
            filters=Filters(refuse_seconds=0.0),
        ),
    )


def _checkpoints(out: list[Send], peer: str = "a1") -> list[Resources]:
    return [m.resources for m in of_type(sent_to(out, peer), CheckpointResources)]


def test_every_reserve_and_unreserve_sends_the_agent_all_its_dynamic_reservations() -> None:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096;disk(gold):100")
    fw = h.subscribe("s1", roles=("gold",))
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer, Reserve(resources=R("cpus(gold):1")))
    # The static reservation (disk) is the agent's own and never in the message.
    assert _checkpoints(out) == [R("cpus(gold):1")]
    offer = only(offers_in(out + h.tick(1.0), "s1"))
    out = _accept(h, fw, offer, Reserve(resources=R("cpus(gold):1;mem(gold):1024")))
    assert _checkpoints(out) == [RESERVED], "the whole set, not the change"
    offer = only(offers_in(out + h.tick(1.0), "s1"))
    out = _accept(h, fw, offer, Unreserve(resources=R("mem(gold):1024")))
    assert _checkpoints(out) == [R("cpus(gold):2")]
    assert h.master.state.allocator.total(agent) == R("cpus:2;cpus(gold):2;mem:4096;disk(gold):100")


def test_an_invalid_reserve_sends_nothing() -> None:
    h = Harness()
    h.register_agent("a1")
    fw = h.subscribe("s1", roles=("gold",))
    offer = only(offers_in(h.tick(), "s1"))
    out = _accept(h, fw, offer, Reserve(resources=R("cpus(gold):64")))
    assert _checkpoints(out) == []


def _failed_over_master() -> Master:
    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AGENT, hostname="h1")))
    return Master(MasterConfig(agent_reregister_timeout=30.0), registry=registry, now=0.0)


def _offers(out: list[Send], peer: str) -> list[Offer]:
    return [o for m in of_type(sent_to(out, peer), Offers) for o in m.offers]


def _subscribe(master: Master, peer: str, role: str, now: float) -> list[Send]:
    info = FrameworkInfo(name=peer, roles=(role,))
    return master.handle(peer, Subscribe(framework_info=info), now)


def test_after_a_failover_reserved_resources_are_offered_only_to_their_role() -> None:
    master = _failed_over_master()
    running = AgentTask(
        framework_id=FrameworkID("e0-F1"),
        task=task_info("t1", "cpus(gold):1;mem(gold):512", AGENT),
        state=TaskState.RUNNING,
        role="gold",
    )
    out = master.handle(
        "a1",
        ReregisterAgent(
            agent_id=AGENT, agent_info=INFO, tasks=(running,), checkpointed_resources=RESERVED
        ),
        0.5,
    )
    assert of_type(sent_to(out, "a1"), AgentReregistered)
    assert _checkpoints(out) == [], "the agent's checkpoint already agrees"
    assert master.state.allocator.total(AGENT) == R(
        "cpus:2;mem:3072;cpus(gold):2;mem(gold):1024;disk(gold):100"
    )
    out = _subscribe(master, "other", "*", 1.0) + master.tick(2.0)
    assert [o.resources for o in _offers(out, "other")] == [R("cpus:2;mem:3072")]
    out = _subscribe(master, "gold", "gold", 3.0) + master.tick(4.0)
    gold = only(_offers(out, "gold"))
    assert gold.resources == R("cpus(gold):1;mem(gold):512;disk(gold):100")


def test_reservations_that_no_longer_fit_are_dropped_and_the_agent_told() -> None:
    master = _failed_over_master()
    small = AgentInfo(hostname="h1", resources=R("cpus:1;mem:4096"))
    out = master.handle(
        "a1",
        ReregisterAgent(agent_id=AGENT, agent_info=small, checkpointed_resources=RESERVED),
        0.5,
    )
    assert master.state.allocator.total(AGENT) == R("cpus:1;mem:4096")
    assert _checkpoints(out) == [Resources()]
    assert "checkpointed_resources_dropped" in [n.event for n in master.notices()]


def test_a_registering_agent_with_checkpointed_reservations_is_admitted_with_them() -> None:
    h = Harness()
    info = AgentInfo(hostname="h2", resources=R("cpus:4;mem:4096"))
    out = h.handle("a2", RegisterAgent(agent_info=info, checkpointed_resources=RESERVED))
    agent = only(sent_to(out, "a2")).agent_id
    assert h.master.state.allocator.total(agent) == R("cpus:2;mem:3072") + RESERVED
    fw = h.subscribe("s1", roles=("*",))
    assert fw
    assert [o.resources for o in offers_in(h.tick(1.0), "s1")] == [R("cpus:2;mem:3072")]


def test_a_lost_checkpoint_message_is_repaired_when_the_agent_reregisters() -> None:
    h = Harness()
    agent = h.register_agent("a1")
    fw = h.subscribe("s1", roles=("gold",))
    offer = only(offers_in(h.tick(), "s1"))
    _accept(h, fw, offer, Reserve(resources=RESERVED))
    out = h.handle("a1", ReregisterAgent(agent_id=agent, agent_info=INFO))  # it never got it
    assert _checkpoints(out) == [RESERVED]
