"""Offer rules of the master core, each named after the Mesos rule it keeps."""

from __future__ import annotations

from agora.master.core import MasterConfig
from agora.sdk.ids import GangID, TaskID
from agora.sdk.messages import (
    Accept,
    Decline,
    Error,
    ErrorCode,
    Filters,
    GangExpired,
    GangRequest,
    Launch,
    Placement,
    Reason,
    Request,
    Rescind,
    Revive,
    RunTask,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Suppress,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info, updates_in


def _one_agent_one_framework(**kw: object) -> tuple[Harness, str, str]:
    h = Harness()
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", **kw)  # type: ignore[arg-type]
    return h, agent, fw


def test_offer_carries_agent_resources_and_epoch() -> None:
    h, agent, _ = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))
    assert offer.agent_id == agent
    assert offer.resources == Resources.parse("cpus:4;mem:4096")
    assert offer.offer_id.startswith(f"e{h.master.epoch}-")


def test_offers_rescinded_when_agent_lost() -> None:
    cfg = MasterConfig(agent_ping_interval=1.0, max_agent_ping_timeouts=2)
    h = Harness(cfg)
    h.register_agent("a1")
    h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    rescinds = []
    for _ in range(4):  # the agent never answers PING
        rescinds += of_type(sent_to(h.tick(1.0), "s1"), Rescind)
    assert [r.offer_id for r in rescinds] == [offer.offer_id]


def test_offers_rescinded_when_framework_disconnects() -> None:
    h, _, _ = _one_agent_one_framework(failover_timeout=60.0)
    first = only(offers_in(h.tick(), "s1"))
    h.subscribe("s2")
    assert offers_in(h.tick(2.0), "s2") == []  # s1 still holds everything
    out = h.disconnect("s1")
    out += h.tick(0.1)
    second = only(offers_in(out, "s2"))
    assert second.resources == first.resources
    assert sent_to(out, "s1") == []  # nothing is sent to a gone connection


def test_same_resources_never_in_two_outstanding_offers() -> None:
    h = Harness()
    h.register_agent("a1", "cpus:4;mem:4096")
    h.subscribe("s1")
    h.subscribe("s2")
    out = []
    for _ in range(5):
        out += h.tick(1.0)
    offers = offers_in(out, "s1") + offers_in(out, "s2")
    assert len(offers) == 1


def test_offer_id_usable_once() -> None:
    h, agent, fw = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))
    first = h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent)])
    assert len(of_type(sent_to(first, "a1"), RunTask)) == 1
    again = h.launch("s1", fw, [offer], [("t2", "cpus:1;mem:128", agent)])
    assert of_type(sent_to(again, "a1"), RunTask) == []
    status = only(updates_in(again, "s1"))
    assert (status.state, status.reason) == (TaskState.LOST, Reason.INVALID_OFFERS)


def _two_agents(partition_aware: bool) -> tuple[Harness, list[object], str]:
    h = Harness()
    h.register_agent("a1")
    h.register_agent("a2")
    fw = h.subscribe("s1", partition_aware=partition_aware)
    offers = offers_in(h.tick(), "s1")
    assert len(offers) == 2
    return h, offers, fw  # type: ignore[return-value]


def test_accept_across_agents_refused_with_task_lost() -> None:
    h, offers, fw = _two_agents(partition_aware=False)
    out = h.launch("s1", fw, offers, [("t1", "cpus:1;mem:128", offers[0].agent_id)])  # type: ignore[attr-defined]
    assert of_type(sent_to(out, "a1") + sent_to(out, "a2"), RunTask) == []
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (TaskState.LOST, Reason.INVALID_OFFERS)


def test_accept_across_agents_refused_with_task_dropped_when_partition_aware() -> None:
    h, offers, fw = _two_agents(partition_aware=True)
    out = h.launch("s1", fw, offers, [("t1", "cpus:1;mem:128", offers[0].agent_id)])  # type: ignore[attr-defined]
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (TaskState.DROPPED, Reason.INVALID_OFFERS)


def test_refused_accept_returns_offers_unfiltered() -> None:
    h, offers, fw = _two_agents(partition_aware=False)
    out = h.launch("s1", fw, offers, [("t1", "cpus:1;mem:128", offers[0].agent_id)])  # type: ignore[attr-defined]
    again = offers_in(out, "s1")  # offered again at once: no filter was installed
    assert sorted(o.agent_id for o in again) == sorted(o.agent_id for o in offers)  # type: ignore[attr-defined]


def test_unused_resources_declined_with_default_filter() -> None:
    h, agent, fw = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))
    h.handle(
        "s1",
        Accept(
            framework_id=fw,
            offer_ids=(offer.offer_id,),
            operations=(Launch(task_infos=(task_info("t1", "cpus:1;mem:1024", agent),)),),
        ),
    )
    assert offers_in(h.tick(1.0), "s1") == []  # inside the default 5 s refusal
    assert offers_in(h.tick(3.0), "s1") == []
    later = only(offers_in(h.tick(2.0), "s1"))  # 6 s after the accept
    assert later.resources == Resources.parse("cpus:3;mem:3072")


def test_filter_lasts_at_least_until_the_next_batch() -> None:
    h, _, fw = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))  # batch at t=0; the next is due at t=1
    decline = Decline(
        framework_id=fw, offer_ids=(offer.offer_id,), filters=Filters(refuse_seconds=0.25)
    )
    assert offers_in(h.handle("s1", decline), "s1") == []  # the event-triggered run respects it
    assert offers_in(h.tick(0.5), "s1") == []  # expired, but no batch has run since
    assert offers_in(h.tick(0.5), "s1") == []  # the next batch (t=1) still honours it
    assert len(offers_in(h.tick(1.0), "s1")) == 1  # the one after (t=2) offers again


def test_revive_clears_filters() -> None:
    h, _, fw = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))
    h.handle(
        "s1",
        Decline(framework_id=fw, offer_ids=(offer.offer_id,), filters=Filters(refuse_seconds=3600)),
    )
    assert offers_in(h.tick(1.0), "s1") == []
    revived = h.handle("s1", Revive(framework_id=fw))  # offered at once, not at the tick
    assert len(offers_in(revived + h.tick(0.01), "s1")) == 1


def test_suppressed_role_stays_suppressed_across_resubscription() -> None:
    h, _, fw = _one_agent_one_framework(failover_timeout=60.0)
    h.handle("s1", Suppress(framework_id=fw))
    assert offers_in(h.tick(1.0), "s1") == []
    h.disconnect("s1")
    assert h.subscribe("s1b", framework_id=fw, failover_timeout=60.0) == fw
    out = h.tick(1.0) + h.tick(1.0)
    assert offers_in(out, "s1b") == []
    revived = h.handle("s1b", Revive(framework_id=fw))  # offered at once, not at the tick
    assert len(offers_in(revived + h.tick(0.01), "s1b")) == 1


def test_offer_timeout_rescinds_and_reoffers() -> None:
    h = Harness(MasterConfig(offer_timeout=10.0))
    h.register_agent("a1")
    h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    out = h.tick(11.0)
    assert [r.offer_id for r in of_type(sent_to(out, "s1"), Rescind)] == [offer.offer_id]
    again = only(offers_in(out, "s1"))
    assert again.offer_id != offer.offer_id


def _gang(h: Harness, fw: str, count: int, shape: str, hold: float = 60.0) -> None:
    h.handle(
        "s1",
        Request(
            framework_id=fw,  # type: ignore[arg-type]
            gangs=(
                GangRequest(
                    gang_id=GangID("g1"),
                    role="*",
                    count=count,
                    shape=Resources.parse(shape),
                    placement=Placement.DISTINCT,
                    hold_timeout=hold,
                ),
            ),
        ),
    )


def _gang_cluster() -> tuple[Harness, str]:
    h = Harness()
    for i in range(3):
        h.register_agent(f"a{i}", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    h.handle("s1", Suppress(framework_id=fw))  # only the gang is wanted
    return h, fw


def test_gang_offer_spans_agents_and_is_accepted_whole() -> None:
    h, fw = _gang_cluster()
    _gang(h, fw, 3, "cpus:2;mem:1024")
    bundle = offers_in(h.tick(0.1), "s1")
    assert len(bundle) == 3 and len({o.agent_id for o in bundle}) == 3
    assert {o.gang_id for o in bundle} == {GangID("g1")}
    assert all(o.resources == Resources.parse("cpus:2;mem:1024") for o in bundle)
    tasks = [(f"r{i}", "cpus:2;mem:1024", o.agent_id) for i, o in enumerate(bundle)]
    out = h.launch("s1", fw, bundle, tasks)
    runs = [m for a in out for m in [a.message] if isinstance(m, RunTask)]
    assert len(runs) == 3


def test_gang_offer_is_all_or_nothing() -> None:
    h, fw = _gang_cluster()
    _gang(h, fw, 3, "cpus:2;mem:1024")
    bundle = offers_in(h.tick(0.1), "s1")
    out = h.launch("s1", fw, bundle[:2], [("r0", "cpus:2;mem:1024", bundle[0].agent_id)])
    assert not any(isinstance(a.message, RunTask) for a in out)
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (TaskState.LOST, Reason.INVALID_OFFERS)
    # The whole bundle is gone: none of its ids can be used any more.
    late = h.launch("s1", fw, bundle[2:], [("r2", "cpus:2;mem:1024", bundle[2].agent_id)])
    assert not any(isinstance(a.message, RunTask) for a in late)


def test_declining_part_of_a_gang_declines_it_whole() -> None:
    h, fw = _gang_cluster()
    _gang(h, fw, 2, "cpus:4;mem:4096")
    bundle = offers_in(h.tick(0.1), "s1")
    assert len(bundle) == 2
    h.handle("s1", Decline(framework_id=fw, offer_ids=(bundle[0].offer_id,)))
    for agent_id in {o.agent_id for o in bundle}:
        assert h.unclaimed(agent_id) == Resources.parse("cpus:4;mem:4096")


def test_gang_hold_timeout_tells_the_framework() -> None:
    h, fw = _gang_cluster()
    _gang(h, fw, 4, "cpus:4;mem:4096", hold=30.0)  # four whole agents; there are three
    assert offers_in(h.tick(1.0), "s1") == []
    out = []
    for _ in range(31):
        out += h.tick(1.0)
    expired = only(of_type(sent_to(out, "s1"), GangExpired))
    assert expired.gang_id == GangID("g1")
    assert offers_in(out, "s1") == []


def test_gang_request_for_a_role_the_framework_lacks_is_refused() -> None:
    h, fw = _gang_cluster()
    gang = GangRequest(gang_id=GangID("g2"), role="other", count=1, shape=Resources.parse("cpus:1"))
    out = h.handle("s1", Request(framework_id=fw, gangs=(gang,)))  # type: ignore[arg-type]
    assert only(of_type(sent_to(out, "s1"), Error)).code is ErrorCode.BAD_REQUEST
    assert offers_in(h.tick(1.0), "s1") == []


def test_quota_limit_from_the_master_config_caps_a_role() -> None:
    limit = Resources.parse("cpus:2;mem:2048")
    h = Harness(MasterConfig(quotas={"batch": (Resources(), limit)}))
    h.register_agent("a1", "cpus:4;mem:4096")
    h.register_agent("a2", "cpus:4;mem:4096")
    h.subscribe("s1", roles=("batch",))
    offered = Resources()
    for offer in offers_in(h.tick(), "s1"):
        offered = offered + offer.resources
    assert offered == limit


def test_deferred_allocation_offers_a_burst_of_freed_resources_once() -> None:
    """A core fed in bursts (the daemon's) offers what a burst freed once, from end_burst."""
    h = Harness(MasterConfig(bursts=True))
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    h.launch(
        "s1", fw, [offer], [(f"t{i}", "cpus:1;mem:1024", agent) for i in range(4)], refuse_seconds=0
    )
    for i in range(4):
        _, uuid = h.agent_update("a1", fw, f"t{i}", TaskState.RUNNING)
        h.ack("s1", fw, agent, f"t{i}", uuid)
    for i in range(4):
        status = TaskStatus(
            task_id=TaskID(f"t{i}"),
            state=TaskState.FINISHED,
            source=StatusSource.EXECUTOR,
            uuid=bytes([i + 1]) * 16,
        )
        message = StatusUpdateMessage(update=StatusUpdate(framework_id=fw, status=status))
        out = h.master.handle("a1", message, h.now)
        assert not offers_in(out, "s1"), "no offer while the burst is being handled"
    offered = offers_in(h.master.end_burst(h.now), "s1")
    assert len(offered) == 1
    assert offered[0].resources.scalar("cpus") == 4.0
    assert not h.master.end_burst(h.now), "nothing is left to allocate"


def test_a_scheduler_declining_everything_with_refuse_zero_cannot_spin_the_master() -> None:
    """The refusal floor: a DECLINE with refuse_seconds=0 keeps the resources away for
    ``min_refuse_seconds`` and through the next batch, so 2 s of declining in a loop gets a
    couple of offers, not one per round trip."""
    h, _, fw = _one_agent_one_framework()
    offers = offers_in(h.tick(), "s1")
    seen = len(offers)
    for _ in range(200):  # 2 s of a scheduler that declines at once, every 10 ms
        out: list[object] = []
        for offer in offers:
            out += h.handle(
                "s1",
                Decline(
                    framework_id=fw, offer_ids=(offer.offer_id,), filters=Filters(refuse_seconds=0)
                ),
            )
        offers = offers_in(out, "s1") + offers_in(h.tick(0.01), "s1")  # type: ignore[arg-type]
        seen += len(offers)
    assert 2 <= seen <= 3  # the first offer, then one each second batch at most


def test_without_a_floor_a_decline_with_refuse_zero_is_offered_again_at_once() -> None:
    h = Harness(MasterConfig(min_refuse_seconds=0.0))
    h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    decline = Decline(
        framework_id=fw, offer_ids=(offer.offer_id,), filters=Filters(refuse_seconds=0)
    )
    assert len(offers_in(h.handle("s1", decline), "s1")) == 1


def test_the_rest_of_an_offer_a_task_was_launched_from_comes_back_as_asked() -> None:
    """The floor is for declines: launching is progress, so the unused part of an accepted
    offer is offered again at once with refuse_seconds=0."""
    h, agent, fw = _one_agent_one_framework()
    offer = only(offers_in(h.tick(), "s1"))
    out = h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent)], refuse_seconds=0)
    rest = only(offers_in(out, "s1"))
    assert rest.resources == Resources.parse("cpus:3;mem:3968")
