"""GET_STATE with limits and filters on the master core: the rows a console on a big cluster
asks for (agents to see first, then the busiest; the tasks updated last) and the whole
cluster's counts and sums beside them."""

from __future__ import annotations

import itertools
from typing import Any

from agora.master.core import MasterConfig
from agora.master.core.state import AgentStatus
from agora.sdk.ids import AgentID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    CommandInfo,
    DrainAgent,
    Filters,
    GetState,
    Launch,
    OperatorDone,
    Ping,
    Pong,
    StateReply,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to

AGENT = "cpus:4;mem:4096"
HOSTS = ("web-1", "web-2", "db-1", "db-2")
#: cpus each host's task holds: web-2 is the busiest, then db-1, web-1, db-2.
CPUS = {"web-1": 1, "web-2": 3, "db-1": 2, "db-2": 1}


def _cluster(**config: Any) -> tuple[Harness, dict[str, AgentID], FrameworkID]:
    """Four agents (web-1, web-2, db-1, db-2), framework s1 with one RUNNING task on each:
    t-<host> named job-<host>, holding CPUS[host] cpus, last updated at 100, 200, 300, 400."""
    h = Harness(MasterConfig(agent_ping_interval=1.0, max_agent_ping_timeouts=3, **config))
    agents = {host: h.register_agent(host, AGENT) for host in HOSTS}
    fw = h.subscribe("s1")
    by_agent = {o.agent_id: o for o in offers_in(h.tick(), "s1")}
    for n, (host, aid) in enumerate(agents.items(), 1):
        info = TaskInfo(
            task_id=TaskID(f"t-{host}"),
            name=f"job-{host}",
            agent_id=aid,
            resources=Resources.parse(f"cpus:{CPUS[host]};mem:128"),
            command=CommandInfo(value="true"),
        )
        _accept(h, fw, by_agent[aid].offer_id, info)
        _update(h, host, fw, aid, f"t-{host}", TaskState.RUNNING, 100.0 * n)
    return h, agents, fw


def _accept(h: Harness, fw: FrameworkID, offer_id: OfferID, info: TaskInfo) -> None:
    h.handle(
        "s1",
        Accept(
            framework_id=fw,
            offer_ids=(offer_id,),
            operations=(Launch(task_infos=(info,)),),
            filters=Filters(refuse_seconds=3600.0),
        ),
    )


_UUIDS = itertools.count(1)


def _update(
    h: Harness, peer: str, fw: FrameworkID, aid: AgentID, task: str, state: TaskState, ts: float
) -> None:
    """The agent reports ``state`` for ``task`` at ``ts``; the framework acknowledges it."""
    uuid = next(_UUIDS).to_bytes(16, "big")
    status = TaskStatus(
        task_id=TaskID(task), state=state, source=StatusSource.EXECUTOR, uuid=uuid, timestamp=ts
    )
    h.handle(peer, StatusUpdateMessage(update=StatusUpdate(framework_id=fw, status=status)))
    h.handle("s1", Acknowledge(framework_id=fw, agent_id=aid, task_id=TaskID(task), uuid=uuid))


def _state(h: Harness, query: GetState | None = None) -> StateReply:
    return only(of_type(sent_to(h.handle("ops", query or GetState()), "ops"), StateReply))


def _silence(h: Harness, quiet: str, seconds: int = 5) -> None:
    """Every agent but ``quiet`` answers its pings for ``seconds``."""
    for _ in range(seconds):
        out = h.tick(1.0)
        for host in HOSTS:
            if host != quiet and of_type(sent_to(out, host), Ping):
                h.handle(host, Pong())


def _troubled(**config: Any) -> tuple[Harness, dict[str, AgentID], FrameworkID]:
    """The cluster with web-1 drained and db-2 unreachable."""
    h, agents, fw = _cluster(**config)
    only(
        of_type(sent_to(h.handle("ops", DrainAgent(agent_id=agents["web-1"])), "ops"), OperatorDone)
    )
    _silence(h, "db-2")
    assert h.master.state.agents[agents["db-2"]].status is AgentStatus.UNREACHABLE
    assert h.master.state.agents[agents["db-1"]].status is AgentStatus.ACTIVE
    return h, agents, fw


def _hosts(reply: StateReply) -> list[str]:
    return [a.hostname for a in reply.agents]


def test_agents_to_see_come_first_then_the_busiest() -> None:
    h, _agents, _fw = _troubled()
    reply = _state(h, GetState(agents_limit=3))
    assert reply.partial
    assert set(_hosts(reply)[:2]) == {"web-1", "db-2"}  # drained, unreachable
    assert _hosts(reply)[2] == "web-2"  # 3 of 4 cpus held
    assert _hosts(_state(h, GetState(agents_limit=4)))[2:] == ["web-2", "db-1"]
    assert _hosts(_state(h, GetState(agents_limit=1)))[0] in {"web-1", "db-2"}
    assert (reply.agents_total, reply.agents_unreachable, reply.agents_draining) == (4, 1, 1)


def test_an_idle_cluster_is_ranked_busiest_first_within_the_limit() -> None:
    h, _agents, _fw = _cluster()
    assert _hosts(_state(h, GetState(agents_limit=2))) == ["web-2", "db-1"]
    empty = _state(h, GetState(agents_limit=0, tasks_limit=0))
    assert (empty.agents, empty.tasks) == ((), ())
    assert (empty.agents_total, empty.tasks_total) == (4, 4)
    assert [f.framework_id for f in empty.frameworks] == [
        f.framework_id for f in _state(h).frameworks
    ]


def test_counts_and_sums_are_the_whole_clusters() -> None:
    h, _agents, fw = _troubled()
    _update(h, "db-1", fw, _agents["db-1"], "t-db-1", TaskState.FINISHED, 900.0)  # completed
    full = _state(h)
    part = _state(h, GetState(agents_limit=1, tasks_limit=1, tasks_filter="zzz"))
    assert not full.partial and part.partial
    assert part.agents_total == len(full.agents) == 4
    assert part.tasks_total == len(full.tasks) == 4
    total = Resources()
    allocated = Resources()
    for a in full.agents:
        total = total + a.resources
        allocated = allocated + a.allocated
    assert part.resources_total.scalar_totals_milli() == total.scalar_totals_milli()
    assert part.resources_allocated.scalar_totals_milli() == allocated.scalar_totals_milli()
    # web-1 (drained) and web-2 hold their tasks' cpus (db-1's may be offered again); db-2 is gone
    assert part.resources_allocated.scalar("cpus") >= CPUS["web-1"] + CPUS["web-2"]
    assert part.resources_total.scalar("cpus") == 16


def test_the_tasks_updated_last_live_or_completed() -> None:
    h, agents, fw = _cluster()
    _update(h, "web-1", fw, agents["web-1"], "t-web-1", TaskState.FINISHED, 500.0)
    reply = _state(h, GetState(tasks_limit=2))
    assert [t.task_id for t in reply.tasks] == ["t-web-1", "t-db-2"]  # at 500, 400
    assert reply.tasks[0].state is TaskState.FINISHED
    assert len(reply.agents) == 4  # no agents_limit: every agent
    assert len(_state(h, GetState(tasks_limit=10)).tasks) == 4


def test_agent_filters_match_hostname_id_or_status_ignoring_case() -> None:
    h, agents, _fw = _troubled()

    def hosts(needle: str) -> set[str]:
        return set(_hosts(_state(h, GetState(agents_filter=needle))))

    assert hosts("WEB") == {"web-1", "web-2"}
    assert hosts(agents["db-1"].upper()) == {"db-1"}
    assert hosts("unreach") == {"db-2"}
    assert hosts("drain") == {"web-1"}  # as the console's own filter reads its status
    assert hosts("nothing-like-it") == set()
    limited = _state(h, GetState(agents_limit=1, agents_filter="web"))
    assert _hosts(limited) == ["web-1"]  # drained: first among the matches
    assert limited.agents_total == 4


def test_task_filters_match_id_name_state_or_agent_ignoring_case() -> None:
    h, agents, fw = _cluster()
    _update(h, "db-1", fw, agents["db-1"], "t-db-1", TaskState.FAILED, 500.0)

    def tasks(needle: str, limit: int | None = None) -> set[str]:
        query = GetState(tasks_filter=needle, tasks_limit=limit)
        return {t.task_id for t in _state(h, query).tasks}

    assert tasks("T-WEB") == {"t-web-1", "t-web-2"}
    assert tasks("JOB-DB-2") == {"t-db-2"}
    assert tasks("failed") == {"t-db-1"}
    assert tasks(agents["web-2"].upper()) == {"t-web-2"}
    assert tasks("running", limit=1) == {"t-db-2"}  # the running one updated last


def test_a_plain_get_state_is_full_with_empty_sums() -> None:
    h, _agents, _fw = _troubled()
    reply = _state(h)
    assert not reply.partial
    assert (reply.agents_total, reply.tasks_total) == (0, 0)
    assert (reply.agents_unreachable, reply.agents_draining) == (0, 0)
    assert reply.resources_total.is_empty() and reply.resources_allocated.is_empty()
    assert len(reply.agents) == 4 and len(reply.tasks) == 4


def test_rows_carry_their_live_task_counts() -> None:
    h, _agents, _fw = _cluster()
    reply = _state(h, GetState(agents_limit=2, tasks_limit=0))
    assert [(a.hostname, a.tasks) for a in reply.agents] == [("web-2", 1), ("db-1", 1)]
    assert [(f.running, f.staging) for f in reply.frameworks] == [(4, 0)]


def test_tasks_past_the_history_bound_are_gone_from_the_rows_and_counts() -> None:
    h, agents, fw = _cluster(max_completed_tasks_per_framework=1)
    _update(h, "web-1", fw, agents["web-1"], "t-web-1", TaskState.FINISHED, 500.0)
    _update(h, "web-2", fw, agents["web-2"], "t-web-2", TaskState.FAILED, 600.0)
    reply = _state(h, GetState(tasks_limit=10))
    # t-web-1 fell out of the one-task history when t-web-2 ended
    assert [t.task_id for t in reply.tasks] == ["t-web-2", "t-db-2", "t-db-1"]
    assert reply.tasks_total == 3
    assert [t.task_id for t in _state(h, GetState(tasks_limit=1, tasks_filter="web")).tasks] == [
        "t-web-2"
    ]


def test_a_forgotten_agent_leaves_the_counts_and_sums() -> None:
    h, agents, _fw = _troubled(unreachable_gc_age=10.0)
    before = _state(h, GetState(agents_limit=0))
    assert (before.agents_total, before.agents_unreachable) == (4, 1)
    _silence(h, "db-2", seconds=12)  # db-2 has been unreachable for longer than the GC age
    assert agents["db-2"] not in h.master.state.agents
    after = _state(h, GetState(agents_limit=4))
    assert (after.agents_total, after.agents_unreachable, after.agents_draining) == (3, 0, 1)
    assert after.resources_total.scalar("cpus") == 12
    assert _hosts(after) == ["web-1", "web-2", "db-1"]  # drained first, then the busiest
