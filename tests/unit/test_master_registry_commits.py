"""Registry changes take effect only once committed; a new leader starts from the registry.

With ``MasterConfig(replicated=True)`` the core asks its daemon to replicate each registry change
(``Propose``) and acts on it only when told it committed (``Master.committed``).
"""

from __future__ import annotations

from dataclasses import replace

from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Action, Propose, Send
from agora.master.registry import (
    AdmitAgent,
    AgentEntry,
    FrameworkEntry,
    MarkUnreachable,
    ReadmitAgent,
    Registry,
    RemoveAgent,
    RemoveFramework,
    UpsertFramework,
)
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    AgentReregistered,
    AgentTask,
    FrameworkInfo,
    KillTask,
    Offers,
    RegisterAgent,
    ReregisterAgent,
    ShutdownAgent,
    Subscribe,
    Subscribed,
    TaskInfo,
    TaskState,
    Teardown,
)
from agora.sdk.resources import Resources

REPLICATED = MasterConfig(replicated=True, epoch=2, recovery_hold_off=2.0)
INFO = AgentInfo(hostname="h1", resources=Resources.parse("cpus:4;mem:1024"))


class Committer:
    """Plays the daemon: applies committed operations to the registry, then tells the core."""

    def __init__(self, master: Master, registry: Registry) -> None:
        self.master, self.registry = master, registry

    def commit_all(self, actions: list[Action], now: float) -> list[Action]:
        out: list[Action] = []
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, Propose):
                self.registry.apply(action.op)
                queue.extend(self.master.committed(action.seq, now))
            else:
                out.append(action)
        return out


def proposals(actions: list[Action]) -> list[Propose]:
    return [a for a in actions if isinstance(a, Propose)]


def messages(actions: list[Action], kind: type) -> list[object]:
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, kind)]


def test_an_agent_is_admitted_only_after_its_admission_commits() -> None:
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    actions = master.handle("a1", RegisterAgent(agent_info=INFO), 1.0)
    [proposal] = proposals(actions)
    assert isinstance(proposal.op, AdmitAgent) and proposal.op.agent.hostname == "h1"
    assert messages(actions, AgentRegistered) == []
    assert master.state.agents == {}
    # A retry while it commits is not a second admission.
    assert master.handle("a1", RegisterAgent(agent_info=INFO), 1.1) == []
    registry.apply(proposal.op)
    done = master.committed(proposal.seq, 1.2)
    [registered] = messages(done, AgentRegistered)
    assert registered.agent_id == proposal.op.agent.agent_id  # type: ignore[attr-defined]
    assert registered.agent_id in master.state.agents  # type: ignore[attr-defined]


def test_an_abandoned_admission_leaves_no_agent_and_a_retry_proposes_again() -> None:
    master = Master(REPLICATED, registry=Registry())
    [first] = proposals(master.handle("a1", RegisterAgent(agent_info=INFO), 1.0))
    assert master.abandoned(first.seq, 1.5) == []
    assert master.state.agents == {}
    [second] = proposals(master.handle("a1", RegisterAgent(agent_info=INFO), 2.0))
    assert second.seq != first.seq


def test_new_leader_waits_for_registry_agents_before_offering() -> None:
    registry = Registry()
    for n in (1, 2):
        registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID(f"e1-A{n}"), hostname=f"h{n}")))
    master = Master(REPLICATED, registry=registry, now=100.0)
    sub = master.handle("fw", Subscribe(framework_info=FrameworkInfo(name="f")), 100.0)
    assert not messages(sub, Offers)
    c = Committer(master, registry)
    out = c.commit_all(sub, 100.0)
    assert messages(out, Subscribed)
    back = master.handle("a1", ReregisterAgent(agent_id=AgentID("e1-A1"), agent_info=INFO), 100.5)
    assert not proposals(back), "an agent admitted in the registry needs no commit to return"
    assert messages(back, AgentReregistered)
    assert not messages(back + master.tick(100.6), Offers), "1 of 2 agents is below 80%"
    assert messages(master.tick(102.1), Offers), "the hold-off is over"


def test_allocation_starts_as_soon_as_enough_agents_are_back() -> None:
    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("e1-A1"), hostname="h1")))
    master = Master(REPLICATED, registry=registry, now=0.0)
    c = Committer(master, registry)
    c.commit_all(master.handle("fw", Subscribe(framework_info=FrameworkInfo(name="f")), 0.0), 0.0)
    out = master.handle("a1", ReregisterAgent(agent_id=AgentID("e1-A1"), agent_info=INFO), 0.1)
    out += master.tick(0.2)
    assert messages(out, Offers), "every registry agent is back: no need to wait 2 s"


def test_agents_missing_past_the_reregister_timeout_are_marked_unreachable() -> None:
    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("e1-A9"), hostname="h9")))
    cfg = MasterConfig(replicated=True, epoch=2, agent_reregister_timeout=30.0)
    master = Master(cfg, registry=registry, now=0.0)
    assert not proposals(master.tick(29.0))
    [mark] = proposals(master.tick(30.0))
    assert mark.op == MarkUnreachable(agent_id=AgentID("e1-A9"), time=30.0)
    assert not proposals(master.tick(31.0)), "proposed once"


def test_a_removed_agent_is_told_to_shut_down() -> None:
    registry = Registry()
    registry.apply(RemoveAgent(agent_id=AgentID("e1-A1")))
    master = Master(REPLICATED, registry=registry)
    out = master.handle("a1", ReregisterAgent(agent_id=AgentID("e1-A1"), agent_info=INFO), 1.0)
    assert messages(out, ShutdownAgent) and not proposals(out)


def test_an_unknown_agent_reregistering_is_admitted_through_the_registry() -> None:
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    msg = ReregisterAgent(agent_id=AgentID("e1-A7"), agent_info=INFO)
    out = master.handle("a7", msg, 1.0)
    [p] = proposals(out)
    assert isinstance(p.op, AdmitAgent) and not messages(out, AgentReregistered)
    assert master.handle("a7", msg, 1.1) == [], "a retry while committing changes nothing"
    registry.apply(p.op)
    assert messages(master.committed(p.seq, 1.2), AgentReregistered)


def test_a_framework_is_registered_with_its_failover_timeout_before_subscribed() -> None:
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    info = FrameworkInfo(name="batch", failover_timeout=3600.0)
    out = master.handle("fw", Subscribe(framework_info=info), 1.0)
    [p] = proposals(out)
    assert isinstance(p.op, UpsertFramework) and p.op.framework.failover_timeout == 3600.0
    assert not messages(out, Subscribed)
    registry.apply(p.op)
    [subscribed] = messages(master.committed(p.seq, 1.1), Subscribed)
    assert subscribed.framework_id == p.op.framework.framework_id  # type: ignore[attr-defined]


def test_teardown_takes_effect_when_committed() -> None:
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    c = Committer(master, registry)
    out = c.commit_all(
        master.handle("fw", Subscribe(framework_info=FrameworkInfo(name="f")), 1.0), 1
    )
    [sub] = messages(out, Subscribed)
    fid = sub.framework_id  # type: ignore[attr-defined]
    [p] = proposals(master.handle("fw", Teardown(framework_id=fid), 2.0))
    assert p.op == RemoveFramework(framework_id=fid)
    assert fid in master.state.frameworks, "not removed before the commit"
    registry.apply(p.op)
    master.committed(p.seq, 2.1)
    assert fid not in master.state.frameworks and fid in master.state.removed_frameworks


def test_a_framework_that_never_comes_back_after_failover_loses_its_tasks() -> None:
    registry = Registry()
    fid = FrameworkID("e1-F1")
    registry.apply(UpsertFramework(framework=FrameworkEntry(framework_id=fid, failover_timeout=60)))
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("e1-A1"), hostname="h1")))
    cfg = replace(REPLICATED, framework_reregister_timeout=30.0)
    master = Master(cfg, registry=registry, now=0.0)
    task = TaskInfo(
        name="t1", task_id="t1", resources=Resources.parse("cpus:1;mem:64"), agent_id="e1-A1"
    )
    running = AgentTask(framework_id=fid, task=task, state=TaskState.RUNNING, role="*")
    msg = ReregisterAgent(agent_id=AgentID("e1-A1"), agent_info=INFO, tasks=(running,))
    master.handle("a1", msg, 1.0)
    # The re-subscription window (30 s) first, then its own failover timeout (60 s).
    assert not proposals(master.tick(89.0))
    [p] = proposals(master.tick(90.0))
    assert p.op == RemoveFramework(framework_id=fid)
    registry.apply(p.op)
    out = master.committed(p.seq, 90.1)
    assert [m.task_id for m in messages(out, KillTask)] == ["t1"]  # type: ignore[attr-defined]
    assert fid in master.state.removed_frameworks
    assert master.state.allocator.available(AgentID("e1-A1")) == INFO.resources
    assert not master.state.tasks and not master.state.unclaimed_tasks


def test_a_framework_back_after_failover_takes_the_tasks_its_agents_reported() -> None:
    registry = Registry()
    back, away = FrameworkID("e1-F1"), FrameworkID("e1-F2")
    for fid in (back, away):
        entry = FrameworkEntry(framework_id=fid, name="fw", roles=("*",))
        registry.apply(UpsertFramework(framework=entry))
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("e1-A1"), hostname="h1")))
    master = Master(REPLICATED, registry=registry, now=0.0)

    def running(fid: FrameworkID, task_id: str) -> AgentTask:
        task = TaskInfo(
            name=task_id,
            task_id=task_id,
            resources=Resources.parse("cpus:1;mem:64"),
            agent_id="e1-A1",
        )
        return AgentTask(framework_id=fid, task=task, state=TaskState.RUNNING, role="*")

    tasks = (running(back, "t1"), running(away, "t2"), running(back, "t3"))
    master.handle("a1", ReregisterAgent(agent_id=AgentID("e1-A1"), agent_info=INFO, tasks=tasks), 1)
    st = master.state
    assert st.unclaimed_tasks == {back: {(back, "t1"), (back, "t3")}, away: {(away, "t2")}}
    info = FrameworkInfo(name="fw", framework_id=back)
    out = master.handle("fw", Subscribe(framework_info=info), 2.0)
    assert not proposals(out) and messages(out, Subscribed)  # back unchanged: no commit
    assert st.frameworks[back].tasks == {(back, "t1"), (back, "t3")}
    assert st.unclaimed_tasks == {away: {(away, "t2")}}


def test_an_agent_back_while_its_unreachable_mark_commits_waits_for_it() -> None:
    registry = Registry()
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AgentID("e1-A9"), hostname="h9")))
    cfg = MasterConfig(replicated=True, epoch=2, agent_reregister_timeout=30.0)
    master = Master(cfg, registry=registry, now=0.0)
    [mark] = proposals(master.tick(30.0))
    late = ReregisterAgent(agent_id=AgentID("e1-A9"), agent_info=INFO)
    assert master.handle("a9", late, 30.1) == [], "refused (it retries) while the mark commits"
    registry.apply(mark.op)
    master.committed(mark.seq, 30.2)
    # Now unreachable in the registry: coming back is a readmission, itself committed first.
    [readmit] = proposals(master.handle("a9", late, 31.0))
    assert readmit.op == ReadmitAgent(agent_id=AgentID("e1-A9"))


def test_a_scheduler_gone_while_its_registration_commits_starts_its_failover_clock() -> None:
    registry = Registry()
    master = Master(REPLICATED, registry=registry)
    info = FrameworkInfo(name="batch", failover_timeout=60.0)
    [p] = proposals(master.handle("fw", Subscribe(framework_info=info), 1.0))
    master.disconnected("fw", 1.5)
    registry.apply(p.op)
    master.committed(p.seq, 2.0)
    fid = p.op.framework.framework_id  # type: ignore[union-attr]
    fw = master.state.frameworks[fid]
    assert not fw.connected and fw.disconnected_at == 2.0
    [removal] = proposals(master.tick(62.0))
    assert removal.op == RemoveFramework(framework_id=fid), "removed after its failover timeout"
