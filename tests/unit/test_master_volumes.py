"""Persistent volumes in the master core: CREATE and DESTROY inside ACCEPT on disk reserved to
the offer's role; a volume is ``volumes(role):{id}`` in offers and tasks, offered only to its
role (also after a failover, from the agent's report), and the agent is sent every change."""

from __future__ import annotations

from agora.master.core import Master, MasterConfig, Send
from agora.master.registry import AdmitAgent, AgentEntry, Registry
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    Accept,
    AgentInfo,
    CheckpointResources,
    Create,
    Destroy,
    Error,
    Filters,
    FrameworkInfo,
    Launch,
    Offer,
    Offers,
    Operation,
    PersistentVolume,
    ReregisterAgent,
    RunTask,
    Subscribe,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info

R = Resources.parse
DATA = PersistentVolume(volume_id="data1", role="gold", disk=100)
AGENT = AgentID("e1-A1")


def _accept(h: Harness, fw: FrameworkID, offer: Offer, *ops: Operation) -> list[Send]:
    filters = Filters(refuse_seconds=0.0)
    return h.handle(
        "s1", Accept(framework_id=fw, offer_ids=(offer.offer_id,), operations=ops, filters=filters)
    )


def _gold() -> tuple[Harness, AgentID, FrameworkID, Offer]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096;disk:1000;disk(gold):200")
    fw = h.subscribe("s1", roles=("gold",))
    return h, agent, fw, only(offers_in(h.tick(), "s1"))


def test_create_then_launch_with_the_volume_in_one_accept() -> None:
    h, agent, fw, offer = _gold()
    out = _accept(
        h,
        fw,
        offer,
        Create(volumes=(DATA,)),
        Launch(task_infos=(task_info("t1", "cpus:1;volumes(gold):{data1}", agent),)),
    )
    assert of_type(sent_to(out, "s1"), Error) == []
    assert only(of_type(sent_to(out, "a1"), RunTask)).task.resources == R(
        "cpus:1;volumes(gold):{data1}"
    )
    checkpoint = only(of_type(sent_to(out, "a1"), CheckpointResources))
    assert checkpoint.volumes == (DATA,)
    assert checkpoint.resources == Resources(), "the volume's disk was statically reserved"
    assert h.master.state.allocator.total(agent) == R(
        "cpus:4;mem:4096;disk:1000;disk(gold):100;volumes(gold):{data1}"
    )


def test_a_released_volume_is_offered_back_only_to_its_role() -> None:
    h, _agent, fw, offer = _gold()
    out = _accept(h, fw, offer, Create(volumes=(DATA,)))
    again = only(offers_in(out + h.tick(1.0), "s1"))
    assert again.resources.contains(R("volumes(gold):{data1}"))
    h.subscribe("other", roles=("*",))
    h.tick(2.0)
    assert all(not o.resources.named("volumes") for o in offers_in(h.sent, "other"))


def test_destroy_gives_the_disk_back_and_tells_the_agent() -> None:
    h, agent, fw, offer = _gold()
    out = _accept(h, fw, offer, Create(volumes=(DATA,)))
    offer = only(offers_in(out + h.tick(1.0), "s1"))
    out = _accept(
        h, fw, offer, Destroy(volumes=(PersistentVolume(volume_id="data1", role="gold", disk=1),))
    )
    assert of_type(sent_to(out, "s1"), Error) == []
    assert only(of_type(sent_to(out, "a1"), CheckpointResources)).volumes == ()
    assert h.master.state.allocator.total(agent) == R("cpus:4;mem:4096;disk:1000;disk(gold):200")


def test_invalid_volume_operations_are_errors_and_change_nothing() -> None:
    h, agent, fw, offer = _gold()
    before = h.master.state.allocator.total(agent)
    cases = [
        Create(volumes=(PersistentVolume(volume_id="big", role="gold", disk=500),)),
        Create(volumes=(PersistentVolume(volume_id="x", role="*", disk=1),)),
        Create(volumes=(PersistentVolume(volume_id="../x", role="gold", disk=1),)),
        Create(volumes=(PersistentVolume(volume_id="x", role="silver", disk=1),)),
        Destroy(volumes=(DATA,)),
    ]
    out = _accept(h, fw, offer, *cases)
    assert len(of_type(sent_to(out, "s1"), Error)) == len(cases)
    assert of_type(sent_to(out, "a1"), CheckpointResources) == []
    assert h.master.state.allocator.total(agent) == before


def test_a_volume_in_use_cannot_be_destroyed_or_created_twice() -> None:
    h, agent, fw, offer = _gold()
    launch = Launch(task_infos=(task_info("t1", "cpus:1;volumes(gold):{data1}", agent),))
    out = _accept(h, fw, offer, Create(volumes=(DATA,)), launch)
    offer = only(offers_in(out + h.tick(1.0), "s1"))
    out = _accept(h, fw, offer, Destroy(volumes=(DATA,)), Create(volumes=(DATA,)))
    errors = [e.message for e in of_type(sent_to(out, "s1"), Error)]
    assert len(errors) == 2 and "in use" in errors[0] and "exist already" in errors[1]


def test_after_a_failover_the_reported_volume_is_offered_only_to_its_role() -> None:
    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AGENT, hostname="h1")))
    master = Master(MasterConfig(agent_reregister_timeout=30.0), registry=registry, now=0.0)
    info = AgentInfo(hostname="h1", resources=R("cpus:2;mem:1024;disk:300"))
    msg = ReregisterAgent(
        agent_id=AGENT,
        agent_info=info,
        checkpointed_resources=R("disk(gold):100"),
        checkpointed_volumes=(DATA,),
    )
    out = master.handle("a1", msg, 0.5)
    assert of_type([a.message for a in out if isinstance(a, Send)], CheckpointResources) == []
    total = R("cpus:2;mem:1024;disk:200;volumes(gold):{data1}")
    assert master.state.allocator.total(AGENT) == total
    other = FrameworkInfo(name="o", roles=("other",))
    out = master.handle("o", Subscribe(framework_info=other), 1.0) + master.tick(2.0)
    offered = [o.resources for a in out if isinstance(a.message, Offers) for o in a.message.offers]
    # "other" is offered all it may have: never the volume, which stays for gold.
    assert offered == [R("cpus:2;mem:1024;disk:200")]
    assert master.state.allocator.available(AGENT) == R("volumes(gold):{data1}")
