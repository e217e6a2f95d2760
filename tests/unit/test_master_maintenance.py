"""Maintenance on the master core: windows, inverse offers and the frameworks' answers, the drain
at a window's start, drain deadlines (kills with AGENT_DRAINING), DRAINED, cancel, bad input and
authorization. Time is the harness's clock (the core's ``now``)."""

from __future__ import annotations

from dataclasses import replace

from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Propose, Send
from agora.master.core.maintenance import CHECK_INTERVAL
from agora.master.core.view import StateView
from agora.master.registry import Registry
from agora.master.server.access import authorize
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AcceptInverseOffers,
    AgentInfo,
    AgentSummary,
    AgentTask,
    CancelMaintenance,
    Decline,
    DeclineInverseOffers,
    DrainAgent,
    Error,
    ErrorCode,
    Filters,
    GetState,
    InverseOffer,
    InverseOffers,
    KillTask,
    MaintenanceSummary,
    OperatorDone,
    ReactivateAgent,
    Reason,
    RegisterAgent,
    ReregisterAgent,
    Rescind,
    RescindInverseOffer,
    ScheduleMaintenance,
    StateReply,
    TaskState,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import Acl
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info

AGENT = "cpus:4;mem:4096"
T0 = 1_000_000.0  # the harness's wall clock starts here


def _done(out: list) -> OperatorDone:  # type: ignore[type-arg]
    return only(of_type(sent_to(out, "ops"), OperatorDone))


def _refused(out: list, code: ErrorCode) -> Error:  # type: ignore[type-arg]
    assert not of_type(sent_to(out, "ops"), OperatorDone)
    error = only(of_type(sent_to(out, "ops"), Error))
    assert error.code is code, error
    return error


def _state(h: Harness) -> StateReply:
    return only(of_type(sent_to(h.handle("ops", GetState()), "ops"), StateReply))


def _agent(h: Harness, agent_id: AgentID) -> AgentSummary:
    return only([a for a in _state(h).agents if a.agent_id == agent_id])


def _window(h: Harness) -> MaintenanceSummary:
    return only(list(_state(h).maintenance))


def _inverse(out: list, peer: str) -> list[InverseOffer]:  # type: ignore[type-arg]
    return [io for m in of_type(sent_to(out, peer), InverseOffers) for io in m.inverse_offers]


def _cluster() -> tuple[Harness, AgentID, AgentID, FrameworkID, FrameworkID]:
    """Agents a1, a2; framework s1 runs t1 on a1, s2 runs t2 on a2; both RUNNING. s1 filters
    both agents for an hour; the rest of both is offered to s2."""
    h = Harness(now=T0)
    a1 = h.register_agent("a1", AGENT)
    a2 = h.register_agent("a2", AGENT)
    f1 = h.subscribe("s1", failover_timeout=3600.0)
    h.tick()
    by_agent = {o.agent_id: o for o in offers_in(h.sent, "s1")}
    h.launch("s1", f1, [by_agent[a1]], [("t1", "cpus:1;mem:128", a1)], refuse_seconds=3600)
    h.handle(
        "s1",
        Decline(
            framework_id=f1,
            offer_ids=(by_agent[a2].offer_id,),
            filters=Filters(refuse_seconds=3600),
        ),
    )
    h.agent_update("a1", f1, "t1", TaskState.RUNNING)
    f2 = h.subscribe("s2", failover_timeout=3600.0)
    h.tick()
    offer = only([o for o in offers_in(h.sent, "s2") if o.agent_id == a2])
    h.launch("s2", f2, [offer], [("t2", "cpus:1;mem:128", a2)], refuse_seconds=0)
    h.agent_update("a2", f2, "t2", TaskState.RUNNING)
    return h, a1, a2, f1, f2


def _schedule(h: Harness, *agents: AgentID, start: float, duration: float) -> list:  # type: ignore[type-arg]
    return h.handle("ops", ScheduleMaintenance(agent_ids=agents, start=start, duration=duration))


# --- schedule and inverse offers ------------------------------------------------------------
def test_schedule_sends_inverse_offers_to_the_frameworks_with_tasks_there_only() -> None:
    h, a1, _a2, f1, _f2 = _cluster()
    out = _schedule(h, a1, start=T0 + 600, duration=3600)
    assert "a1" in _done(out).message
    [io] = _inverse(out, "s1")
    assert (io.framework_id, io.agent_id, io.hostname) == (f1, a1, "a1")
    assert (io.start, io.duration) == (T0 + 600, 3600)
    assert not _inverse(out, "s2"), "s2 has nothing on a1"
    assert h.master.state.registry.maintenance["a1"].duration == 3600
    window = _window(h)
    assert window.status == "SCHEDULED" and window.agent_ids == (a1,)
    assert [(a.framework_id, a.answer) for a in window.answers] == [(f1, "PENDING")]
    assert not _inverse(h.tick(CHECK_INTERVAL), "s1"), "sent once per subscription"


def test_answers_are_recorded_and_shown_and_others_ids_are_ignored() -> None:
    h, a1, a2, f1, f2 = _cluster()
    out = _schedule(h, a1, a2, start=T0 + 600, duration=60)
    [io1], [io2] = _inverse(out, "s1"), _inverse(out, "s2")
    h.handle("s1", AcceptInverseOffers(framework_id=f1, inverse_offer_ids=(io1.inverse_offer_id,)))
    # s2 cannot answer for s1's inverse offer; it declines its own
    h.handle("s2", DeclineInverseOffers(framework_id=f2, inverse_offer_ids=(io1.inverse_offer_id,)))
    h.handle("s2", DeclineInverseOffers(framework_id=f2, inverse_offer_ids=(io2.inverse_offer_id,)))
    answers = {a.framework_id: a.answer for w in _state(h).maintenance for a in w.answers}
    assert answers == {f1: "ACCEPTED", f2: "DECLINED"}


def test_inverse_offers_are_sent_again_after_a_resubscription() -> None:
    h, a1, _a2, f1, _f2 = _cluster()
    [io] = _inverse(_schedule(h, a1, start=T0 + 600, duration=60), "s1")
    h.disconnect("s1")
    h.tick(CHECK_INTERVAL)
    h.subscribe("s1b", framework_id=f1)  # its scheduler fails over to a new connection
    [again] = _inverse(h.tick(CHECK_INTERVAL), "s1b")
    assert again.inverse_offer_id == io.inverse_offer_id


# --- the window's start, deadlines, DRAINED ---------------------------------------------------
def test_window_start_drains_and_rescinds_and_its_end_kills_then_drained() -> None:
    h, a1, _a2, f1, _f2 = _cluster()
    _schedule(h, a1, start=T0 + 10, duration=20)
    offers_on_a1 = [o.offer_id for o in h.master.state.offers.values() if o.agent_id == a1]
    assert offers_on_a1, "the rest of a1 is offered"
    assert not _agent(h, a1).draining
    out = h.tick(10.0)
    rescinded = {m.offer_id for a in out for m in of_type([a.message], Rescind)}
    assert rescinded >= set(offers_on_a1)
    summary = _agent(h, a1)
    assert summary.draining and not summary.drained and summary.drain_deadline == T0 + 30
    assert _window(h).status == "DRAINING"
    assert not of_type(sent_to(out, "a1"), KillTask), "tasks run on until the deadline"
    assert not [o for o in offers_in(h.tick(5.0), "s2") if o.agent_id == a1]
    out = h.tick(15.0)  # the window's end: the drain's deadline
    kill = only(of_type(sent_to(out, "a1"), KillTask))
    assert (kill.framework_id, kill.task_id, kill.reason) == (f1, "t1", Reason.AGENT_DRAINING)
    assert not of_type(sent_to(h.tick(CHECK_INTERVAL), "a1"), KillTask), "killed once"
    h.agent_update("a1", f1, "t1", TaskState.KILLED)
    assert _agent(h, a1).drained
    assert _window(h).status == "DRAINED"
    assert h.master.view().counts().agents["DRAINED"] == 1


def test_drain_with_a_deadline_kills_what_runs_then_and_reactivate_clears_it() -> None:
    h, a1, a2, f1, f2 = _cluster()
    _done(h.handle("ops", DrainAgent(agent_id=a2, deadline=T0 + 30)))
    assert _agent(h, a2).drain_deadline == T0 + 30
    assert not of_type(sent_to(h.tick(29.0), "a2"), KillTask)
    kill = only(of_type(sent_to(h.tick(1.0), "a2"), KillTask))
    assert (kill.task_id, kill.reason) == ("t2", Reason.AGENT_DRAINING)
    h.agent_update("a2", f2, "t2", TaskState.KILLED)
    assert _agent(h, a2).drained and not _agent(h, a1).drained
    out = h.handle("ops", ReactivateAgent(agent_id=a2))
    _done(out)
    summary = _agent(h, a2)
    assert not summary.draining and not summary.drained and summary.drain_deadline is None
    again = offers_in(out + h.tick(1.0), "s2")
    assert [o for o in again if o.agent_id == a2], "offered again"
    assert f1  # s1 untouched


def test_a_drain_without_deadline_kills_nothing() -> None:
    h, _a1, a2, _f1, _f2 = _cluster()
    _done(h.handle("ops", DrainAgent(agent_id=a2)))
    assert not of_type(sent_to(h.tick(3600.0), "a2"), KillTask)
    assert not _agent(h, a2).drained


def test_cancel_rescinds_inverse_offers_and_reactivates_a_started_window() -> None:
    h, a1, _a2, _f1, _f2 = _cluster()
    [io] = _inverse(_schedule(h, a1, start=T0 + 10, duration=600), "s1")
    h.tick(10.0)
    assert _agent(h, a1).draining
    out = h.handle("ops", CancelMaintenance(agent_ids=(a1,)))
    assert "cancelled" in _done(out).message
    assert [m.inverse_offer_id for m in of_type(sent_to(out, "s1"), RescindInverseOffer)] == [
        io.inverse_offer_id
    ]
    assert not _agent(h, a1).draining
    assert not _state(h).maintenance and not h.master.state.registry.maintenance
    assert not of_type(sent_to(h.tick(700.0), "a1"), KillTask), "no deadline left"


def test_windows_and_drain_deadlines_survive_a_failover_and_inverse_offers_are_sent_again() -> None:
    h, a1, a2, f1, _f2 = _cluster()
    [io] = _inverse(_schedule(h, a1, start=T0 + 600, duration=60), "s1")
    _done(h.handle("ops", DrainAgent(agent_id=a2, deadline=T0 + 900)))
    cfg = replace(h.config, epoch=h.config.epoch + 1)
    new = Harness(cfg, now=h.now + 1.0)
    new.master = Master(
        cfg, registry=Registry.from_snapshot(h.master.state.registry.snapshot()), now=new.now
    )
    assert new.master.state.registry.maintenance["a1"].start == T0 + 600
    for peer, agent, fw, task in (("a1", a1, f1, "t1"), ("a2", a2, _f2, "t2")):
        info = AgentInfo(hostname=peer, resources=Resources.parse(AGENT))
        running = AgentTask(
            task=task_info(task, "cpus:1;mem:128", agent), framework_id=fw, state=TaskState.RUNNING
        )
        new.handle(peer, ReregisterAgent(agent_id=agent, agent_info=info, tasks=(running,)))
    new.subscribe("s1", framework_id=f1, failover_timeout=3600.0)
    [again] = _inverse(new.tick(CHECK_INTERVAL), "s1")
    assert (again.agent_id, again.start) == (a1, T0 + 600)
    assert again.inverse_offer_id != io.inverse_offer_id, "a new leader's own id"
    assert _agent(new, a2).drain_deadline == T0 + 900
    new.now = T0 + 900
    kill = only(of_type(sent_to(new.tick(), "a2"), KillTask))
    assert kill.reason is Reason.AGENT_DRAINING


# --- bad input and authorization ------------------------------------------------------------
def test_bad_input_is_refused_and_changes_nothing() -> None:
    h, a1, _a2, _f1, _f2 = _cluster()
    unknown = AgentID("nope")
    _refused(_schedule(h, a1, unknown, start=T0 + 60, duration=60), ErrorCode.UNKNOWN_AGENT)
    assert (
        "duration"
        in _refused(_schedule(h, a1, start=T0 + 60, duration=0), ErrorCode.BAD_REQUEST).message
    )
    assert (
        "over" in _refused(_schedule(h, a1, start=1.0, duration=60), ErrorCode.BAD_REQUEST).message
    )
    _refused(_schedule(h, start=T0 + 60, duration=60), ErrorCode.BAD_REQUEST)
    _refused(h.handle("ops", CancelMaintenance(agent_ids=(unknown,))), ErrorCode.UNKNOWN_AGENT)
    _refused(h.handle("ops", DrainAgent(agent_id=unknown, deadline=T0)), ErrorCode.UNKNOWN_AGENT)
    assert not h.master.state.registry.maintenance
    assert not _inverse(h.sent, "s1")
    assert not StateView(h.master.state).maintenance()


def test_maintenance_calls_need_an_operator() -> None:
    acl = Acl(operators=frozenset({"ops"}))
    call = ScheduleMaintenance(agent_ids=(AgentID("a"),), start=T0, duration=60)
    for msg in (call, CancelMaintenance(agent_ids=(AgentID("a"),))):
        assert authorize(msg, "ops", acl=acl, authenticated=True) is msg
        assert authorize(msg, "mallory", acl=acl, authenticated=True) == (
            "may not make operator calls"
        )


def test_replicated_schedule_takes_effect_only_once_committed_and_abandon_is_not_leader() -> None:
    registry = Registry()
    master = Master(MasterConfig(replicated=True, epoch=2), registry=registry)
    info = AgentInfo(hostname="h1", resources=Resources.parse(AGENT))
    out = master.handle("a1", RegisterAgent(agent_info=info), T0)
    for action in out:
        if isinstance(action, Propose):
            registry.apply(action.op)
            master.committed(action.seq, T0)
    [agent_id] = master.state.agents
    call = ScheduleMaintenance(agent_ids=(agent_id,), start=T0 + 60, duration=60)
    [proposal] = [a for a in master.handle("ops", call, T0) if isinstance(a, Propose)]
    assert not registry.maintenance, "nothing before the commit"
    abandoned = master.abandoned(proposal.seq, T0)
    [error] = [a.message for a in abandoned if isinstance(a, Send) and a.to == "ops"]
    assert isinstance(error, Error) and error.code is ErrorCode.NOT_LEADER
    [proposal] = [a for a in master.handle("ops", call, T0) if isinstance(a, Propose)]
    registry.apply(proposal.op)
    done = master.committed(proposal.seq, T0)
    assert [type(a.message) for a in done if isinstance(a, Send) and a.to == "ops"] == [
        OperatorDone
    ]
    assert registry.maintenance["h1"].start == T0 + 60
