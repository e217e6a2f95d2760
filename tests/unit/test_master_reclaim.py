"""Lending and reclaim in the master core: role b borrows role a's idle guarantee on revocable
offers; when a wants it, b's revocable tasks are killed (RESOURCES_REVOKED) through their agent,
and what they free is offered to a first."""

from __future__ import annotations

from dataclasses import replace

from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core import MasterConfig
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import KillTask, Offer, Reason, Revive, TaskState
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, sent_to

_CFG = MasterConfig(
    quotas={"a": (Resources.parse("cpus:2"), None)},
    reclaim=ReclaimConfig(interval=1.0, min_runtime=5.0),
)


def _borrowed(config: MasterConfig = _CFG) -> tuple[Harness, FrameworkID, FrameworkID, list[Offer]]:
    """Two 2-cpu agents; a (guaranteed 2 cpus) is idle; b runs four 1-cpu tasks, two of them on
    what a's guarantee lends."""
    h = Harness(config)
    h.register_agent("h1", "cpus:2;mem:2048")
    h.register_agent("h2", "cpus:2;mem:2048")
    fa = h.subscribe("sa", ("a",), suppressed_roles=("a",))
    fb = h.subscribe("sb", ("b",), revocable=True)
    got: list[Offer] = []
    for _ in range(3):
        got += offers_in(h.tick(1.0), "sb")
        if sum(1 for o in got if o.resources.scalar_totals_milli().get("cpus")) >= 2:
            break
    with_cpus = [o for o in got if o.resources.scalar_totals_milli().get("cpus", 0) >= 1000]
    assert {o.revocable for o in with_cpus} == {True, False}
    n = 0
    for offer in with_cpus:
        tasks = []
        for _ in range(2):
            n += 1
            tasks.append((f"t{n}{'r' if offer.revocable else ''}", "cpus:1", offer.agent_id))
        h.launch("sb", fb, [offer], tasks)
    for tid in sorted(h.master.state.tasks):
        h.agent_update(_peer(h, h.master.state.tasks[tid].agent_id), fb, tid[1], TaskState.RUNNING)
    return h, fa, fb, with_cpus


def _peer(h: Harness, agent_id: AgentID) -> str:
    return str(h.master.state.agents[agent_id].peer)


def _kills(out: list[object]) -> list[KillTask]:
    return [m for p in ("h1", "h2") for m in of_type(sent_to(out, p), KillTask)]  # type: ignore[arg-type]


def test_borrowed_tasks_are_marked_revocable() -> None:
    h, _fa, _fb, _ = _borrowed()
    marks = {k[1]: t.revocable for k, t in h.master.state.tasks.items()}
    assert marks == {"t1": False, "t2": False, "t3r": True, "t4r": True} or marks == {
        "t1r": True,
        "t2r": True,
        "t3": False,
        "t4": False,
    }


def test_nothing_is_reclaimed_while_the_owner_wants_nothing() -> None:
    h, _fa, _fb, _ = _borrowed()
    out = []
    for _ in range(10):
        out += h.tick(1.0)
    assert _kills(out) == []


def test_the_owner_reclaims_revocable_tasks_first_and_gets_them_offered() -> None:
    h, fa, fb, _ = _borrowed()
    h.tick(10.0)  # past the minimum run time
    out = h.handle("sa", Revive(framework_id=fa))
    out += h.tick(1.0)
    kills = _kills(out)
    assert sorted(k.task_id for k in kills) == sorted(
        k[1] for k, t in h.master.state.tasks.items() if t.revocable
    )
    assert {k.reason for k in kills} == {Reason.RESOURCES_REVOKED}
    # Not again while they are stopping.
    assert _kills(h.tick(1.0)) == []
    before = len(h.sent)
    for kill in kills:
        task = h.master.state.tasks[(fb, kill.task_id)]
        h.agent_update(_peer(h, task.agent_id), fb, kill.task_id, TaskState.KILLED)
    h.tick(1.0)
    (first,) = offers_in(h.sent[before:], "sa")  # one offer per agent and role at a time
    assert not first.revocable and first.resources == Resources.parse("cpus:1")
    assert not offers_in(h.sent[before:], "sb")  # what a is owed is not lent again
    h.launch("sa", fa, [first], [("a1", "cpus:1", first.agent_id)])
    (second,) = offers_in(h.tick(1.0), "sa")
    assert second.resources == Resources.parse("cpus:1")


def test_young_tasks_are_not_taken() -> None:
    h, fa, _fb, _ = _borrowed()
    out = h.handle("sa", Revive(framework_id=fa)) + h.tick(1.0)
    assert _kills(out) == []  # started about a second ago; the minimum is 5 s
    out = h.tick(5.0)
    assert len(_kills(out)) == 2


def test_reclaim_can_be_turned_off() -> None:
    cfg = replace(_CFG, reclaim=ReclaimConfig(enabled=False))
    h, fa, _fb, _ = _borrowed(cfg)
    h.tick(10.0)
    out = h.handle("sa", Revive(framework_id=fa))
    for _ in range(5):
        out += h.tick(1.0)
    assert _kills(out) == []


def test_a_preempted_kill_is_resent_with_its_reason_when_the_agent_comes_back() -> None:
    from agora.sdk.messages import AgentInfo, AgentTask, ReregisterAgent

    h, fa, fb, _ = _borrowed()
    h.tick(10.0)
    kills = _kills(h.handle("sa", Revive(framework_id=fa)) + h.tick(1.0))
    victim = h.master.state.tasks[(fb, kills[0].task_id)]
    peer = _peer(h, victim.agent_id)
    report = AgentTask(task=victim.info, framework_id=fb, state=TaskState.RUNNING, role="b")
    info = AgentInfo(hostname=peer, resources=Resources.parse("cpus:2;mem:2048"))
    out = h.handle(
        peer, ReregisterAgent(agent_id=victim.agent_id, agent_info=info, tasks=(report,))
    )
    (again,) = of_type(sent_to(out, peer), KillTask)
    assert again.task_id == victim.info.task_id and again.reason is Reason.RESOURCES_REVOKED


def test_a_task_may_take_memory_from_an_ordinary_offer_and_cpus_from_a_lent_one() -> None:
    h = Harness(_CFG)
    h.register_agent("h1", "cpus:2;mem:2048")
    h.register_agent("h2", "cpus:2;mem:2048")
    h.subscribe("sa", ("a",), suppressed_roles=("a",))
    fb = h.subscribe("sb", ("b",), revocable=True)
    got: list[Offer] = []
    for _ in range(3):
        got += offers_in(h.tick(1.0), "sb")
    lent = next(o for o in got if o.revocable)
    same_agent = [o for o in got if o.agent_id == lent.agent_id]
    assert len(same_agent) == 2  # its memory in an ordinary offer, its cpus lent
    h.launch("sb", fb, same_agent, [("both", "cpus:1.5;mem:512", lent.agent_id)])
    task = h.master.state.tasks[(fb, "both")]  # type: ignore[index]
    assert task.revocable and task.state is TaskState.STAGING
    # The rest of both offers came back; nothing was charged twice.
    assert h.unclaimed(lent.agent_id) == Resources.parse("cpus:0.5;mem:1536")


def test_ordinary_tasks_go_lowest_priority_and_newest_first_when_nothing_was_lent() -> None:
    """A guarantee set after b filled the cluster: nothing is revocable, so every task is looked
    at. b stays at its own guarantee of 0 cpus; the two of lowest priority, newest first, are
    preempted (TASK_PREEMPTED), never the high-priority one."""
    from agora.sdk.messages import Accept, Filters, Launch, UpdateQuota
    from msgspec.structs import replace as with_fields
    from support.master_kit import task_info

    h = Harness(MasterConfig(reclaim=ReclaimConfig(min_runtime=5.0)))
    agent = h.register_agent("h1", "cpus:4;mem:4096")
    fb = h.subscribe("sb", ("b",))
    h.tick(1.0)
    infos = []
    for n, priority in enumerate((1, 9, 1, 1)):
        info = task_info(f"b{n}", "cpus:1;mem:64", agent)
        infos.append(with_fields(info, labels={"agora.priority": str(priority)}))
    for info in infos:  # launched a second apart: b3 is the newest
        h.tick(1.0)
        offers = [o for o in offers_in(h.sent, "sb") if o.offer_id in h.master.state.offers]
        h.handle(
            "sb",
            Accept(
                framework_id=fb,
                offer_ids=tuple(o.offer_id for o in offers),
                operations=(Launch(task_infos=(info,)),),
                filters=Filters(refuse_seconds=0.0),
            ),
        )
    assert len(h.master.state.tasks) == 4
    h.handle("ops", UpdateQuota(role="a", guarantee=Resources.parse("cpus:2")))
    h.subscribe("sa", ("a",))
    out = h.tick(10.0)
    kills = _kills(out)
    assert sorted(k.task_id for k in kills) == ["b2", "b3"]
    assert {k.reason for k in kills} == {Reason.TASK_PREEMPTED}


def test_tasks_on_a_draining_agent_are_not_taken() -> None:
    """What a draining agent frees is never offered: killing its tasks would gain nothing."""
    from agora.sdk.messages import DrainAgent

    h, fa, _fb, _ = _borrowed()
    for agent_id in list(h.master.state.agents):
        h.handle("ops", DrainAgent(agent_id=agent_id))
    h.tick(10.0)
    out = h.handle("sa", Revive(framework_id=fa))
    for _ in range(3):
        out += h.tick(1.0)
    assert _kills(out) == []
