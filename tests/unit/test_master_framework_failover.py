"""Framework failover across leader changes.

A framework's ``failover_timeout`` counts from the moment it disconnects from a leader it had
subscribed with. After a leader change nobody has disconnected from the new leader yet: every
framework the registry or a re-registered agent knows gets a re-subscription window first, so
``agora run`` (failover timeout 0) keeps its task through a failover. Every removal is logged with
its reason (``Master.notices``).
"""

from __future__ import annotations

from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Action, Send
from agora.master.registry import AdmitAgent, AgentEntry, FrameworkEntry, Registry, UpsertFramework
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AgentInfo,
    AgentTask,
    FrameworkInfo,
    KillTask,
    ReregisterAgent,
    Subscribe,
    Subscribed,
    TaskInfo,
    TaskState,
)
from agora.sdk.resources import Resources

FID = FrameworkID("e1-F1")
AGENT = AgentID("e1-A1")
INFO = AgentInfo(hostname="h1", resources=Resources.parse("cpus:4;mem:1024"))


def _registry(*frameworks: FrameworkEntry) -> Registry:
    registry = Registry()
    for entry in frameworks:
        registry.apply(UpsertFramework(framework=entry))
    registry.apply(AdmitAgent(agent=AgentEntry(agent_id=AGENT, hostname="h1")))
    return registry


def _reregister(master: Master, framework_id: FrameworkID, now: float) -> None:
    task = TaskInfo(
        name="t1", task_id="t1", resources=Resources.parse("cpus:1;mem:64"), agent_id=AGENT
    )
    running = AgentTask(framework_id=framework_id, task=task, state=TaskState.RUNNING, role="*")
    master.handle("a1", ReregisterAgent(agent_id=AGENT, agent_info=INFO, tasks=(running,)), now)


def _kills(actions: list[Action]) -> list[str]:
    return [
        str(a.message.task_id)
        for a in actions
        if isinstance(a, Send) and isinstance(a.message, KillTask)
    ]


def _removals(master: Master) -> list[dict[str, str]]:
    return [dict(n.fields) for n in master.notices() if n.event == "framework_removed"]


def test_a_framework_with_failover_timeout_0_keeps_its_tasks_through_a_leader_change() -> None:
    master = Master(
        MasterConfig(agent_reregister_timeout=30.0),
        registry=_registry(FrameworkEntry(framework_id=FID, name="run", failover_timeout=0.0)),
        now=0.0,
    )
    _reregister(master, FID, 0.5)
    assert not _kills(master.tick(1.0)), "nothing is removed on the first tick after activation"
    assert FID not in master.state.removed_frameworks
    info = FrameworkInfo(name="run", framework_id=FID, failover_timeout=0.0)
    out = master.handle("scheduler", Subscribe(framework_info=info), 5.0)
    assert [a.message for a in out if isinstance(a.message, Subscribed)]
    out = master.tick(100.0)
    assert not _kills(out) and FID in master.state.frameworks
    assert (FID, "t1") in master.state.frameworks[FID].tasks
    assert _removals(master) == []


def test_the_window_defaults_to_the_agent_reregistration_timeout_then_its_own_timeout() -> None:
    entry = FrameworkEntry(framework_id=FID, name="batch", failover_timeout=20.0)
    master = Master(MasterConfig(agent_reregister_timeout=30.0), registry=_registry(entry), now=0.0)
    _reregister(master, FID, 0.5)
    assert not _kills(master.tick(49.9)), "30 s window + 20 s failover timeout not yet over"
    out = master.tick(50.0)
    assert _kills(out) == ["t1"]
    [kill] = [a.message for a in out if isinstance(a, Send) and isinstance(a.message, KillTask)]
    assert kill.kill_id.startswith("e1-K"), "a kill the master makes itself has an id too"
    [removed] = _removals(master)
    assert removed["framework_id"] == FID and removed["name"] == "batch"
    assert "did not re-subscribe" in removed["reason"] and "30 s" in removed["reason"]


def test_the_window_is_configurable() -> None:
    entry = FrameworkEntry(framework_id=FID, failover_timeout=0.0)
    cfg = MasterConfig(agent_reregister_timeout=600.0, framework_reregister_timeout=5.0)
    master = Master(cfg, registry=_registry(entry), now=0.0)
    _reregister(master, FID, 0.5)
    assert not _kills(master.tick(4.9))
    assert _kills(master.tick(5.0)) == ["t1"]


def test_a_framework_known_only_from_an_agent_gets_the_window_too() -> None:
    stranger = FrameworkID("e1-F7")  # its registration never reached this registry
    cfg = MasterConfig(agent_reregister_timeout=30.0)
    master = Master(cfg, registry=_registry(), now=0.0)
    _reregister(master, stranger, 1.0)
    assert not _kills(master.tick(29.0))
    info = FrameworkInfo(name="late", framework_id=stranger)
    master.handle("scheduler", Subscribe(framework_info=info), 29.5)
    assert stranger in master.state.frameworks
    assert (stranger, "t1") in master.state.frameworks[stranger].tasks
    assert not _kills(master.tick(31.0))


def test_a_framework_known_only_from_an_agent_is_removed_after_the_window() -> None:
    stranger = FrameworkID("e1-F7")
    master = Master(MasterConfig(agent_reregister_timeout=30.0), registry=_registry(), now=0.0)
    _reregister(master, stranger, 1.0)
    assert _kills(master.tick(30.0)) == ["t1"]
    assert stranger in master.state.removed_frameworks
    assert [r["framework_id"] for r in _removals(master)] == [stranger]


def test_disconnecting_from_the_leader_it_subscribed_with_starts_the_clock() -> None:
    """Mesos's rule stays: failover_timeout 0 means removal as soon as the scheduler goes."""
    master = Master(MasterConfig(), now=0.0)
    out = master.handle("s", Subscribe(framework_info=FrameworkInfo(name="run")), 1.0)
    [subscribed] = [a.message for a in out if isinstance(a.message, Subscribed)]
    master.disconnected("s", 2.0)
    assert subscribed.framework_id in master.state.removed_frameworks
    [removed] = _removals(master)
    assert removed == {
        "framework_id": subscribed.framework_id,
        "name": "run",
        "reason": "its scheduler disconnected and failover_timeout is 0",
    }
    assert master.notices() == [], "notices are handed out once"


def test_a_disconnected_framework_is_removed_after_its_timeout_with_the_reason() -> None:
    master = Master(MasterConfig(), now=0.0)
    info = FrameworkInfo(name="svc", failover_timeout=10.0)
    out = master.handle("s", Subscribe(framework_info=info), 1.0)
    [subscribed] = [a.message for a in out if isinstance(a.message, Subscribed)]
    master.disconnected("s", 2.0)
    master.tick(11.9)
    assert subscribed.framework_id in master.state.frameworks
    master.tick(12.0)
    [removed] = _removals(master)
    assert removed["reason"] == "its scheduler stayed disconnected past failover_timeout (10 s)"
