"""Operator calls that change the cluster, on the master core: weights, quota, drain, reactivate,
mark gone, teardown, kill; each answered OPERATOR_DONE once in effect, or ERROR with no change.

Most tests drive a non-replicated core (registry changes apply at once); the replicated ones play
the daemon by hand (``Propose`` -> ``Master.committed`` / ``Master.abandoned``). A failover is a
new core made from (a copy of) the old core's registry.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Action, Propose, Send
from agora.master.registry import Registry
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentTask,
    Decline,
    DrainAgent,
    Error,
    ErrorCode,
    FrameworkInfo,
    GetState,
    KillTask,
    MarkAgentGone,
    Message,
    OperatorDone,
    OperatorKill,
    ReactivateAgent,
    Reason,
    RegisterAgent,
    ReregisterAgent,
    Rescind,
    RoleSummary,
    RoleWeight,
    ShutdownAgent,
    StateReply,
    Subscribe,
    TaskState,
    TeardownFramework,
    UpdateQuota,
    UpdateWeights,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info, updates_in

ROLES = frozenset({"a", "b"})
AGENT = "cpus:4;mem:4096"


# --- helpers ---------------------------------------------------------------------------------
def _state(h: Harness) -> StateReply:
    return only(of_type(sent_to(h.handle("ops", GetState()), "ops"), StateReply))


def _role(h: Harness, name: str) -> RoleSummary:
    return only([r for r in _state(h).roles if r.name == name])


def _done(out: list[Send]) -> OperatorDone:
    return only(of_type(sent_to(out, "ops"), OperatorDone))


def _refused(out: list[Send], code: ErrorCode) -> Error:
    assert not of_type(sent_to(out, "ops"), OperatorDone)
    error = only(of_type(sent_to(out, "ops"), Error))
    assert error.code is code, error
    return error


def _weights(**weights: float) -> UpdateWeights:
    return UpdateWeights(weights=tuple(RoleWeight(role=r, weight=w) for r, w in weights.items()))


def _running(h: Harness, *, partition_aware: bool = False) -> tuple[AgentID, FrameworkID]:
    """Agent a1 (cpus:4) with framework s1's task t1 (cpus:1) RUNNING on it; the rest of the
    agent is offered to s1 again (refuse_seconds 0)."""
    agent = h.register_agent("a1", AGENT)
    fw = h.subscribe("s1", partition_aware=partition_aware)
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:1;mem:128", agent)], refuse_seconds=0)
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    h.ack("s1", fw, agent, "t1", uuid)
    return agent, fw


def _failover(h: Harness) -> Harness:
    """A new leader (next epoch, same config) made from a replica of ``h``'s registry."""
    cfg = replace(h.config, epoch=h.config.epoch + 1)
    registry = Registry.from_snapshot(h.master.state.registry.snapshot())
    new = Harness(cfg, now=h.now + 1.0)
    new.master = Master(cfg, registry=registry, now=new.now)
    return new


def _reregister(h: Harness, peer: str, agent_id: AgentID, *tasks: AgentTask) -> list[Send]:
    info = AgentInfo(hostname=peer, resources=Resources.parse(AGENT))
    return h.handle(peer, ReregisterAgent(agent_id=agent_id, agent_info=info, tasks=tasks))


# --- UpdateWeights ---------------------------------------------------------------------------
def test_update_weights_is_done_and_divides_the_roles_share() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    h.register_agent("a1", AGENT)
    h.subscribe("s1", ("a",))
    assert offers_in(h.tick(), "s1")
    assert _role(h, "a").share == 1.0, "its framework holds the whole agent (offered)"
    done = _done(h.handle("ops", _weights(a=2.0, b=0.5)))
    assert done.call == "UPDATE_WEIGHTS" and "a=2" in done.message
    assert _role(h, "a").share == 0.5
    assert [(r.name, r.weight) for r in _state(h).roles] == [("a", 2.0), ("b", 0.5)]


@pytest.mark.parametrize(("heavy", "peer"), [("a", "s1"), ("b", "s2")])
def test_the_heavier_role_gets_a_new_agent_first(heavy: str, peer: str) -> None:
    h = Harness()
    h.subscribe("s1", ("a",))
    h.subscribe("s2", ("b",))
    for agent in ("a1", "a2"):
        h.register_agent(agent, "cpus:1;mem:1024")
    h.tick()
    assert len(offers_in(h.sent, "s1")) == len(offers_in(h.sent, "s2")) == 1, "one agent each"
    _done(h.handle("ops", _weights(**{heavy: 4.0})))
    h.register_agent("a3", "cpus:1;mem:1024")
    h.tick()  # whichever way the new agent was offered: at once or in the batch
    offered = [p for p in ("s1", "s2") for o in offers_in(h.sent, p) if o.hostname == "a3"]
    assert offered == [peer], "the role with the smaller weighted share comes first"


def test_bad_weight_calls_are_refused_and_change_nothing() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    h.handle("ops", _weights(a=3.0))
    for call in (
        _weights(**{"no/slash": 2.0}),
        UpdateWeights(weights=(RoleWeight(role="a", weight=2.0), RoleWeight(role="a", weight=5.0))),
        _weights(a=2.0, c=2.0),
        UpdateWeights(weights=()),
    ):
        _refused(h.handle("ops", call), ErrorCode.BAD_REQUEST)
        assert _role(h, "a").weight == 3.0
        assert h.master.state.registry.weights == {"a": 3.0}


# --- replicated: in effect (and answered) only once committed ---------------------------------
REPLICATED = MasterConfig(replicated=True, epoch=2, roles=ROLES)


def _sent(actions: list[Action], to: str) -> list[Message]:
    return [a.message for a in actions if isinstance(a, Send) and a.to == to]


def _commit_all(master: Master, registry: Registry, actions: list[Action], now: float) -> None:
    """Play the daemon: apply every proposal to the registry and report it committed."""
    queue = list(actions)
    while queue:
        action = queue.pop(0)
        if isinstance(action, Propose):
            registry.apply(action.op)
            queue.extend(master.committed(action.seq, now))


def _replicated_with_offer() -> tuple[Master, Registry]:
    """A replicated core whose role "a" framework holds an offer of the whole agent."""
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    info = AgentInfo(hostname="h1", resources=Resources.parse(AGENT))
    _commit_all(master, registry, master.handle("a1", RegisterAgent(agent_info=info), 1.0), 1.0)
    sub = Subscribe(framework_info=FrameworkInfo(name="f", roles=("a",)))
    _commit_all(master, registry, master.handle("fw", sub, 1.0), 1.0)
    master.tick(1.5)
    assert master.state.allocator.role_share("a") == 1.0
    return master, registry


def _calls(master: Master) -> dict[str, Message]:
    [agent_id] = master.state.agents
    [framework_id] = master.state.frameworks
    return {
        "weights": _weights(a=2.0),
        "quota": UpdateQuota(role="a", limit=Resources.parse("cpus:1")),
        "drain": DrainAgent(agent_id=agent_id),
        "gone": MarkAgentGone(agent_id=agent_id),
        "teardown": TeardownFramework(framework_id=framework_id),
    }


def _snapshot(master: Master, now: float) -> StateReply:
    reply = only(_sent(master.handle("ops", GetState(), now), "ops"))
    assert isinstance(reply, StateReply)
    return reply


@pytest.mark.parametrize("call", ["weights", "quota", "drain", "gone", "teardown"])
def test_replicated_calls_change_nothing_until_committed(call: str) -> None:
    master, registry = _replicated_with_offer()
    before, digest = _snapshot(master, 2.0), registry.digest()
    msg = _calls(master)[call]
    out = master.handle("ops", msg, 2.0)
    [proposal] = [a for a in out if isinstance(a, Propose)]
    assert not _sent(out, "ops") and not _sent(out, "fw") and not _sent(out, "a1")
    assert _snapshot(master, 2.0) == before
    registry.apply(proposal.op)
    done = master.committed(proposal.seq, 2.1)
    assert [type(m) for m in _sent(done, "ops")] == [OperatorDone]
    assert registry.digest() != digest and _snapshot(master, 2.2) != before
    if call in ("drain", "gone"):  # the agent's offer goes only now
        assert Rescind in [type(m) for m in _sent(done, "fw")] and not master.state.offers
    if call == "weights":
        assert master.state.allocator.role_share("a") == 0.5


@pytest.mark.parametrize("call", ["weights", "quota", "drain", "gone", "teardown"])
def test_replicated_calls_abandoned_are_not_leader_and_change_nothing(call: str) -> None:
    master, registry = _replicated_with_offer()
    before, digest = _snapshot(master, 2.0), registry.digest()
    msg = _calls(master)[call]
    [proposal] = [a for a in master.handle("ops", msg, 2.0) if isinstance(a, Propose)]
    out = master.abandoned(proposal.seq, 2.1)
    error = only(_sent(out, "ops"))
    assert isinstance(error, Error) and error.code is ErrorCode.NOT_LEADER
    assert not _sent(out, "fw") and not _sent(out, "a1")
    assert _snapshot(master, 2.2) == before and registry.digest() == digest
    # Nothing is left half-done: the same call may be made again.
    assert [a for a in master.handle("ops", msg, 2.3) if isinstance(a, Propose)]


# --- failover: a new core from the registry keeps what operators set --------------------------
def test_a_new_leader_keeps_weights_and_quota_set_by_operators() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    _done(h.handle("ops", _weights(a=3.0)))
    quota = UpdateQuota(
        role="b", guarantee=Resources.parse("cpus:1"), limit=Resources.parse("cpus:2;mem:512")
    )
    _done(h.handle("ops", quota))
    new = _failover(h)
    a, b = _role(new, "a"), _role(new, "b")
    assert a.weight == 3.0 and (a.guarantee, a.limit) == (None, None)
    assert (b.weight, b.guarantee, b.limit) == (1.0, quota.guarantee, quota.limit)
    # The new core's allocator has the weight too, not only its snapshot.
    new.register_agent("a1", AGENT)
    new.subscribe("s1", ("a",))
    new.tick()
    assert _role(new, "a").share == 1.0 / 3.0


def test_a_drained_agent_back_after_failover_gets_offers_only_once_reactivated() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    _done(h.handle("ops", DrainAgent(agent_id=agent)))
    new = _failover(h)
    new.subscribe("s1")
    _reregister(new, "a1", agent)
    new.tick(5.0)
    assert not offers_in(new.sent, "s1")
    assert only(list(_state(new).agents)).draining
    _done(new.handle("ops", ReactivateAgent(agent_id=agent)))
    new.tick(1.0)
    assert [o.agent_id for o in offers_in(new.sent, "s1")] == [agent]
    assert not only(list(_state(new).agents)).draining


# --- UpdateQuota -----------------------------------------------------------------------------
def test_update_quota_sets_guarantee_and_limit() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    call = UpdateQuota(
        role="a", guarantee=Resources.parse("cpus:2"), limit=Resources.parse("cpus:3")
    )
    done = _done(h.handle("ops", call))
    assert done.call == "UPDATE_QUOTA" and "set" in done.message
    a = _role(h, "a")
    assert (a.guarantee, a.limit) == (call.guarantee, call.limit)


def test_the_quota_limit_binds_the_allocator() -> None:
    h = Harness()
    limit = Resources.parse("cpus:1;mem:1024")
    _done(h.handle("ops", UpdateQuota(role="a", limit=limit)))
    h.register_agent("a1", AGENT)
    h.subscribe("s1", ("a",))
    h.tick()
    [offer] = offers_in(h.sent, "s1")
    assert limit.contains(offer.resources), offer.resources


def test_bad_quota_calls_are_refused_and_change_nothing() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    two = Resources.parse("cpus:2")
    for call in (
        UpdateQuota(role="a", guarantee=Resources.parse("cpus:3"), limit=two),
        UpdateQuota(role="a", guarantee=Resources.parse("ports:[31000-31010]")),
        UpdateQuota(role="a", guarantee=two, limit=Resources.parse("cpus:4;ports:[1-2]")),
        UpdateQuota(role="*", guarantee=two),
        UpdateQuota(role="c", guarantee=two),
        UpdateQuota(role="..", guarantee=two),
    ):
        _refused(h.handle("ops", call), ErrorCode.BAD_REQUEST)
    assert h.master.state.registry.quotas == {}
    assert all(r.guarantee is None and r.limit is None for r in _state(h).roles)


def test_an_empty_quota_removes_it() -> None:
    h = Harness(MasterConfig(roles=ROLES))
    _done(h.handle("ops", UpdateQuota(role="a", guarantee=Resources.parse("cpus:2"))))
    done = _done(h.handle("ops", UpdateQuota(role="a")))
    assert "removed" in done.message
    a = _role(h, "a")
    assert (a.guarantee, a.limit) == (None, None)


def test_a_removed_quota_overrides_the_configured_one_after_failover() -> None:
    cfg = MasterConfig(quotas={"a": (Resources.parse("cpus:1"), Resources.parse("cpus:1"))})
    h = Harness(cfg)
    assert _role(h, "a").limit == Resources.parse("cpus:1")
    _done(h.handle("ops", UpdateQuota(role="a")))
    new = _failover(h)
    assert all(r.limit is None and r.guarantee is None for r in _state(new).roles)
    # ... and in the allocator: the configured limit of 1 cpu no longer binds.
    new.register_agent("a1", AGENT)
    new.subscribe("s1", ("a",))
    new.tick(5.0)
    assert only(offers_in(new.sent, "s1")).resources.scalar("cpus") == 4.0


# --- DrainAgent / ReactivateAgent -------------------------------------------------------------
def test_drain_rescinds_offers_keeps_tasks_and_offers_nothing_more() -> None:
    h = Harness()
    agent, fw = _running(h)
    [offer] = [o for o in offers_in(h.sent, "s1") if o.offer_id in h.master.state.offers]
    out = h.handle("ops", DrainAgent(agent_id=agent))
    assert [m.offer_id for m in of_type(sent_to(out, "s1"), Rescind)] == [offer.offer_id]
    assert not sent_to(out, "a1"), "no kill: its tasks run on"
    assert _done(out).call == "DRAIN_AGENT"
    state = _state(h)
    assert only(list(state.agents)).draining and only(list(state.frameworks)).offers == 0
    assert only(list(state.tasks)).state is TaskState.RUNNING
    before = len(offers_in(h.sent, "s1"))
    h.tick(5.0)
    h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    h.tick(5.0)
    assert len(offers_in(h.sent, "s1")) == before, "no offer on a drained agent"


def test_shares_stay_a_fraction_of_the_cluster_when_an_agent_drains() -> None:
    h = Harness()
    agent, _fw = _running(h)  # s1: task of 1 cpu and an offer of the other 3 on a1
    h.register_agent("a2", AGENT)  # ... and an offer of all of a2
    _done(h.handle("ops", DrainAgent(agent_id=agent)))  # a1's offer rescinded, its task runs on
    state = _state(h)
    assert only(list(state.frameworks)).share is not None
    assert only(list(state.frameworks)).share <= 1.0  # type: ignore[operator]
    assert all(r.share <= 1.0 for r in state.roles), state.roles


def test_draining_twice_is_done_already_and_unknown_agents_are_refused() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    _done(h.handle("ops", DrainAgent(agent_id=agent)))
    assert "already" in _done(h.handle("ops", DrainAgent(agent_id=agent))).message
    assert (
        "already"
        in _done(h.handle("ops", ReactivateAgent(agent_id=h.register_agent("a2")))).message
    )
    for call in (DrainAgent(agent_id=AgentID("nope")), ReactivateAgent(agent_id=AgentID("nope"))):
        _refused(h.handle("ops", call), ErrorCode.UNKNOWN_AGENT)


def test_a_reactivated_agent_is_offered_again() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    _done(h.handle("ops", DrainAgent(agent_id=agent)))
    h.subscribe("s1")
    h.tick(5.0)
    assert not offers_in(h.sent, "s1")
    out = h.handle("ops", ReactivateAgent(agent_id=agent))
    assert _done(out).call == "REACTIVATE_AGENT"
    h.tick(1.0)
    assert [o.agent_id for o in offers_in(h.sent, "s1")] == [agent]
    assert not only(list(_state(h).agents)).draining


# --- MarkAgentGone ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("partition_aware", "state"), [(True, TaskState.GONE_BY_OPERATOR), (False, TaskState.LOST)]
)
def test_mark_gone_ends_tasks_and_shuts_the_agent_down(
    partition_aware: bool, state: TaskState
) -> None:
    h = Harness()
    agent, _fw = _running(h, partition_aware=partition_aware)
    out = h.handle("ops", MarkAgentGone(agent_id=agent))
    status = only(updates_in(out, "s1"))
    assert (status.task_id, status.state) == (TaskID("t1"), state)
    assert status.reason is Reason.AGENT_REMOVED_BY_OPERATOR
    assert of_type(sent_to(out, "a1"), ShutdownAgent)
    assert _done(out).call == "MARK_AGENT_GONE"
    after = _state(h)
    assert after.agents == ()
    # The master keeps the task as completed, so operators still see how it ended.
    [task] = after.tasks
    assert (task.task_id, task.state, task.reason) == (
        TaskID("t1"),
        state,
        Reason.AGENT_REMOVED_BY_OPERATOR,
    )


def test_a_gone_agent_may_not_come_back_and_marking_it_again_is_done_already() -> None:
    h = Harness()
    agent = h.register_agent("a1", AGENT)
    _done(h.handle("ops", MarkAgentGone(agent_id=agent)))
    assert of_type(sent_to(_reregister(h, "a1", agent), "a1"), ShutdownAgent)
    assert "already gone" in _done(h.handle("ops", MarkAgentGone(agent_id=agent))).message
    _refused(h.handle("ops", MarkAgentGone(agent_id=AgentID("nope"))), ErrorCode.UNKNOWN_AGENT)
    _refused(h.handle("ops", DrainAgent(agent_id=agent)), ErrorCode.UNKNOWN_AGENT)


def test_an_unreachable_agent_can_be_marked_gone() -> None:
    h = Harness()
    agent, _fw = _running(h, partition_aware=True)
    for _ in range(10):  # pings unanswered: unreachable after max_agent_ping_timeouts rounds
        h.tick(h.config.agent_ping_interval)
        if only(list(_state(h).agents)).status == "UNREACHABLE":
            break
    assert only(list(_state(h).agents)).status == "UNREACHABLE"
    assert [s.state for s in updates_in(h.sent, "s1")][-1] is TaskState.UNREACHABLE
    out = h.handle("ops", MarkAgentGone(agent_id=agent))
    assert _done(out).call == "MARK_AGENT_GONE"
    assert not sent_to(out, "a1"), "an unreachable agent is not sent anything"
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (
        TaskState.GONE_BY_OPERATOR,
        Reason.AGENT_REMOVED_BY_OPERATOR,
    )
    assert _state(h).agents == ()
    assert of_type(sent_to(_reregister(h, "a1", agent), "a1"), ShutdownAgent)


# --- TeardownFramework -----------------------------------------------------------------------
def test_teardown_kills_tasks_and_leaves_the_framework_inactive() -> None:
    h = Harness()
    _agent, fw = _running(h)
    out = h.handle("ops", TeardownFramework(framework_id=fw))
    kill = only(of_type(sent_to(out, "a1"), KillTask))
    assert (kill.framework_id, kill.task_id) == (fw, TaskID("t1"))
    assert _done(out).call == "TEARDOWN_FRAMEWORK"
    # Its scheduler is told its subscription ended (the SDK driver stops on this error).
    told = only(of_type(sent_to(out, "s1"), Error))
    assert told.code is ErrorCode.FRAMEWORK_REMOVED and "operator" in told.message
    assert [(f.framework_id, f.active, f.offers) for f in _state(h).frameworks] == [(fw, False, 0)]
    assert "already" in _done(h.handle("ops", TeardownFramework(framework_id=fw))).message


def test_teardown_of_an_unknown_framework_is_refused() -> None:
    h = Harness()
    out = h.handle("ops", TeardownFramework(framework_id=FrameworkID("nope")))
    _refused(out, ErrorCode.UNKNOWN_FRAMEWORK)


def test_a_framework_absent_after_failover_can_be_torn_down() -> None:
    h = Harness()
    agent, fw = _running(h)
    assert fw in h.master.state.registry.frameworks
    new = _failover(h)
    task = task_info("t1", "cpus:1;mem:128", agent)
    _reregister(new, "a1", agent, AgentTask(task=task, framework_id=fw, state=TaskState.RUNNING))
    out = new.handle("ops", TeardownFramework(framework_id=fw))
    assert _done(out).call == "TEARDOWN_FRAMEWORK"
    kill = only(of_type(sent_to(out, "a1"), KillTask))
    assert (kill.framework_id, kill.task_id) == (fw, TaskID("t1"))
    again = Subscribe(framework_info=FrameworkInfo(name="s1", framework_id=fw))
    refusal = only(of_type(sent_to(new.handle("s1", again), "s1"), Error))
    assert refusal.code is ErrorCode.FRAMEWORK_REMOVED, "its id is retired"


# --- OperatorKill and the snapshot -----------------------------------------------------------
def test_operator_kill_is_answered_operator_done() -> None:
    h = Harness()
    _agent, fw = _running(h)
    out = h.handle("ops", OperatorKill(task_id=TaskID("t1"), framework_id=fw))
    assert of_type(sent_to(out, "a1"), KillTask)
    assert _done(out).call == "OPERATOR_KILL"


def test_snapshot_counts_offers_and_gives_active_frameworks_a_share() -> None:
    h = Harness()
    h.register_agent("a1", AGENT)
    fw = h.subscribe("s1")
    [offer] = offers_in(h.tick(), "s1")
    summary = only(list(_state(h).frameworks))
    assert summary.offers == 1 and summary.share == 1.0
    h.handle("s1", Decline(framework_id=fw, offer_ids=(offer.offer_id,)))
    summary = only(list(_state(h).frameworks))
    assert summary.offers == 0 and isinstance(summary.share, float) and summary.share == 0.0


def test_snapshot_names_the_cluster_and_when_this_leader_started() -> None:
    cfg = MasterConfig(cluster="prod-eu")
    master = Master(cfg, now=1234.5)
    [reply] = [a.message for a in master.handle("ops", GetState(), 1300.0) if isinstance(a, Send)]
    assert isinstance(reply, StateReply)
    assert (reply.cluster, reply.leader_since) == ("prod-eu", 1234.5)
