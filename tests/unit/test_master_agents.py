"""Agent rules of the master core: health checks, unreachability, re-registration."""

from __future__ import annotations

from agora.master.core import AgentStatus, MasterConfig
from agora.sdk.ids import AgentID, ExecutorID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentReregistered,
    AgentTask,
    ContainerUsage,
    Error,
    Failure,
    GetState,
    KillTask,
    Ping,
    Pong,
    Reason,
    Reconcile,
    ReconcileTask,
    ReconcileTasks,
    RegisterAgent,
    ReregisterAgent,
    ShutdownAgent,
    ShutdownFramework,
    StateReply,
    StatusUpdateAck,
    TaskState,
    UnregisterAgent,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, of_type, offers_in, only, sent_to, task_info, updates_in

_CFG = MasterConfig(agent_ping_interval=1.0, max_agent_ping_timeouts=3)


def _cluster(partition_aware: bool) -> tuple[Harness, AgentID, str]:
    h = Harness(_CFG)
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", partition_aware=partition_aware, failover_timeout=3600)
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:2;mem:1024", agent)])
    _, uuid = h.agent_update("a1", fw, "t1", TaskState.RUNNING)
    h.ack("s1", fw, agent, "t1", uuid)
    return h, agent, fw


def _silence(h: Harness, seconds: int) -> list[object]:
    out = []
    for _ in range(seconds):
        out += h.tick(1.0)
    return out


def test_agent_answering_pings_stays_active() -> None:
    h, agent, _ = _cluster(False)
    for _ in range(10):
        out = h.tick(1.0)
        if of_type(sent_to(out, "a1"), Ping):
            h.handle("a1", Pong())
    assert h.master.state.agents[agent].status is AgentStatus.ACTIVE


def test_unreachable_agent_tasks_are_lost() -> None:
    h, agent, _ = _cluster(False)
    out = _silence(h, 5)
    assert h.master.state.agents[agent].status is AgentStatus.UNREACHABLE
    status = only(updates_in(out, "s1"))
    assert (status.state, status.reason) == (TaskState.LOST, Reason.AGENT_REMOVED)
    assert status.unreachable_time is not None
    assert [f.agent_id for f in of_type(sent_to(out, "s1"), Failure)] == [agent]


def test_unreachable_agent_tasks_are_unreachable_when_partition_aware() -> None:
    h, _agent, _ = _cluster(True)
    status = only(updates_in(_silence(h, 5), "s1"))
    assert (status.state, status.reason) == (TaskState.UNREACHABLE, Reason.AGENT_REMOVED)


def _reregister(h: Harness, agent: AgentID, fw: str, peer: str = "a1") -> list[object]:
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    task = AgentTask(
        task=task_info("t1", "cpus:2;mem:1024", agent), framework_id=fw, state=TaskState.RUNNING
    )  # type: ignore[arg-type]
    return h.handle(peer, ReregisterAgent(agent_id=agent, agent_info=info, tasks=(task,)))  # type: ignore[return-value]


def test_reregistered_agent_tasks_return_to_running_and_are_not_killed() -> None:
    for partition_aware in (False, True):
        h, agent, fw = _cluster(partition_aware)
        _silence(h, 5)
        out = _reregister(h, agent, fw)
        assert h.master.state.agents[agent].status is AgentStatus.ACTIVE
        assert only(of_type(sent_to(out, "a1"), AgentReregistered)).agent_id == agent  # type: ignore[arg-type]
        assert of_type(sent_to(out, "a1"), KillTask) == []  # type: ignore[arg-type]
        status = only(updates_in(out, "s1"))  # type: ignore[arg-type]
        assert (status.state, status.reason) == (TaskState.RUNNING, Reason.AGENT_REREGISTERED)
        # Its task still holds its resources: only the rest is free (or offered again).
        free = h.master.state.allocator.available(agent)
        for offer in offers_in(out, "s1"):  # type: ignore[arg-type]
            free = free + offer.resources
        assert free == Resources.parse("cpus:2;mem:3072")


def test_status_updates_from_a_removed_agent_are_dropped() -> None:
    h, _agent, fw = _cluster(False)
    _silence(h, 5)
    out, _ = h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    assert updates_in(out, "s1") == []


def test_spurious_reregistration_keeps_tasks() -> None:
    h, agent, fw = _cluster(False)
    out = _reregister(h, agent, fw, peer="a1-new")
    assert of_type(sent_to(out, "a1-new"), KillTask) == []  # type: ignore[arg-type]
    assert updates_in(out, "s1") == []  # type: ignore[arg-type]
    assert (fw, TaskID("t1")) in h.master.state.tasks


def test_a_quick_restart_is_asked_about_the_tasks_it_did_not_report() -> None:
    """An agent restarted before the master missed it re-registers without a task whose
    RUN_TASK arrived while it was down: the master asks it (RECONCILE_TASKS), so that the task
    does not stay STAGING for ever. Found by the simulation of the real cores."""
    for partition_aware in (False, True):
        h = Harness(_CFG)
        agent = h.register_agent("a1", "cpus:4;mem:4096")
        fw = h.subscribe("s1", partition_aware=partition_aware, failover_timeout=3600)
        offer = only(offers_in(h.tick(), "s1"))
        tasks = [("t1", "cpus:2;mem:1024", agent), ("t2", "cpus:1;mem:128", agent)]
        h.launch("s1", fw, [offer], tasks)  # t2's RUN_TASK is lost on the way
        out = _reregister(h, agent, fw)  # reports t1 only
        ask = only(of_type(sent_to(out, "a1"), ReconcileTasks))  # type: ignore[arg-type]
        assert ask == ReconcileTasks(
            framework_id=fw,  # type: ignore[arg-type]
            task_ids=(TaskID("t2"),),
            partition_aware=partition_aware,
        )
        assert (fw, TaskID("t2")) in h.master.state.tasks  # the agent's answer ends it


def test_a_reregistration_that_reports_every_task_asks_nothing() -> None:
    h, agent, fw = _cluster(False)
    out = _reregister(h, agent, fw)
    assert of_type(sent_to(out, "a1"), ReconcileTasks) == []  # type: ignore[arg-type]


def test_reregistration_kills_tasks_of_frameworks_torn_down_meanwhile() -> None:
    h, agent, fw = _cluster(False)
    _silence(h, 5)
    h.disconnect("s1")
    h.tick(3601.0)  # failover timeout passes: the framework is torn down
    out = _reregister(h, agent, fw)
    assert [m.framework_id for m in of_type(sent_to(out, "a1"), ShutdownFramework)] == [fw]  # type: ignore[arg-type]
    assert (fw, TaskID("t1")) not in h.master.state.tasks


def test_unregistered_agent_may_not_come_back() -> None:
    h, agent, fw = _cluster(True)
    out = h.handle("a1", UnregisterAgent(agent_id=agent))
    assert only(updates_in(out, "s1")).state is TaskState.GONE
    back = _reregister(h, agent, fw, peer="a1b")
    assert of_type(sent_to(back, "a1b"), ShutdownAgent)  # type: ignore[arg-type]


def test_agent_without_resources_is_refused() -> None:
    h = Harness()
    out = h.handle("a1", RegisterAgent(agent_info=AgentInfo(hostname="a1", resources=Resources())))
    assert of_type(sent_to(out, "a1"), Error)
    assert h.master.state.agents == {}


def test_unreachable_agents_are_forgotten_after_the_gc_age() -> None:
    cfg = MasterConfig(agent_ping_interval=1.0, max_agent_ping_timeouts=3, unreachable_gc_age=100.0)
    h = Harness(cfg)
    agent = h.register_agent("a1")
    fw = h.subscribe("s1", partition_aware=True, failover_timeout=3600)
    offer = only(offers_in(h.tick(), "s1"))
    h.launch("s1", fw, [offer], [("t1", "cpus:2;mem:1024", agent)])
    _silence(h, 5)
    assert h.master.state.agents[agent].status is AgentStatus.UNREACHABLE
    _silence(h, 50)
    assert agent in h.master.state.agents  # still remembered, may come back
    _silence(h, 60)
    assert agent not in h.master.state.agents
    assert (fw, TaskID("t1")) not in h.master.state.tasks
    item = ReconcileTask(task_id=TaskID("t1"), agent_id=agent)
    out = h.handle("s1", Reconcile(framework_id=fw, tasks=(item,)))
    assert only(updates_in(out, "s1")).state is TaskState.GONE
    back = _reregister(h, agent, fw, peer="a1b")
    assert of_type(sent_to(back, "a1b"), ShutdownAgent)  # type: ignore[arg-type]


def test_unreachable_agents_beyond_the_cap_are_forgotten_oldest_first() -> None:
    cfg = MasterConfig(agent_ping_interval=1.0, max_agent_ping_timeouts=3, max_unreachable_agents=1)
    h = Harness(cfg)
    first = h.register_agent("a1")
    h.tick(1.0)
    second = h.register_agent("a2")
    _silence(h, 5)  # a1 goes unreachable one round before a2
    _silence(h, 2)
    assert first not in h.master.state.agents
    assert h.master.state.agents[second].status is AgentStatus.UNREACHABLE


def test_a_new_master_reconciles_a_reported_task_with_the_head_of_its_stream() -> None:
    """After a failover, an agent reports a task that FINISHED while its RUNNING update is still
    unacknowledged: until that update is forwarded, reconciliation answers RUNNING, never the
    FINISHED the stream has not delivered (it would reach the framework after it). Found by the
    simulation's master failover."""
    h = Harness(_CFG)
    fw = h.subscribe("s1", failover_timeout=3600)
    agent = AgentID("a-old")
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    task = AgentTask(
        task=task_info("t1", "cpus:1;mem:128", agent),
        framework_id=fw,  # type: ignore[arg-type]
        state=TaskState.FINISHED,
        status_uuid=b"u" * 16,
        status_state=TaskState.RUNNING,
    )
    h.handle("a1", ReregisterAgent(agent_id=agent, agent_info=info, tasks=(task,)))
    ask = Reconcile(framework_id=fw, tasks=(ReconcileTask(task_id=TaskID("t1")),))  # type: ignore[arg-type]
    assert only(updates_in(h.handle("s1", ask), "s1")).state is TaskState.RUNNING  # type: ignore[arg-type]
    h.agent_update("a1", fw, "t1", TaskState.RUNNING)  # the stream delivers its head
    h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    assert only(updates_in(h.handle("s1", ask), "s1")).state is TaskState.FINISHED  # type: ignore[arg-type]


def test_a_new_master_forgets_a_reported_task_once_its_final_update_is_acknowledged() -> None:
    """After a failover, the framework acknowledges a FINISHED it heard from the old leader; the
    agent had reported that update still pending. The ACK ends the agent's stream, so no update
    follows it: the new master must forget the task on that ACK, or it keeps it for ever. Found
    by the simulation's soak (seed 207786)."""
    h = Harness(_CFG)
    fw = h.subscribe("s1", failover_timeout=3600)
    agent = AgentID("a-old")
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    pending = b"f" * 16
    task = AgentTask(
        task=task_info("t1", "cpus:1;mem:128", agent),
        framework_id=fw,  # type: ignore[arg-type]
        state=TaskState.FINISHED,
        status_uuid=pending,
        status_state=TaskState.FINISHED,
    )
    h.handle("a1", ReregisterAgent(agent_id=agent, agent_info=info, tasks=(task,)))
    h.ack("s1", fw, agent, "t1", b"x" * 16)  # some other uuid: not the end of the stream
    assert (fw, TaskID("t1")) in h.master.state.tasks
    out = h.ack("s1", fw, agent, "t1", pending)
    assert of_type(sent_to(out, "a1"), StatusUpdateAck)
    assert (fw, TaskID("t1")) not in h.master.state.tasks


def test_an_acknowledged_pending_running_update_does_not_forget_a_reported_task() -> None:
    """The reported head is RUNNING (its FINISHED queued behind it): acknowledging the head does
    not end the task for the master; the FINISHED still follows."""
    h = Harness(_CFG)
    fw = h.subscribe("s1", failover_timeout=3600)
    agent = AgentID("a-old")
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    head = b"r" * 16
    task = AgentTask(
        task=task_info("t1", "cpus:1;mem:128", agent),
        framework_id=fw,  # type: ignore[arg-type]
        state=TaskState.FINISHED,
        status_uuid=head,
        status_state=TaskState.RUNNING,
    )
    h.handle("a1", ReregisterAgent(agent_id=agent, agent_info=info, tasks=(task,)))
    h.ack("s1", fw, agent, "t1", head)
    assert (fw, TaskID("t1")) in h.master.state.tasks


def test_reregistration_drops_executors_the_agent_no_longer_reports() -> None:
    from agora.sdk.ids import ExecutorID
    from agora.sdk.messages import Accept, CommandInfo, ExecutorInfo, Launch, TaskInfo

    h = Harness(_CFG)
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", failover_timeout=3600)
    offer = only(offers_in(h.tick(), "s1"))
    executor = ExecutorInfo(
        executor_id=ExecutorID("ex"),
        framework_id=fw,  # type: ignore[arg-type]
        command=CommandInfo(value="exec"),
        resources=Resources.parse("cpus:1;mem:512"),
    )
    task = TaskInfo(
        task_id=TaskID("t1"),
        name="t1",
        agent_id=agent,
        resources=Resources.parse("cpus:1;mem:512"),
        executor=executor,
    )
    launch = Accept(
        framework_id=fw, offer_ids=(offer.offer_id,), operations=(Launch(task_infos=(task,)),)
    )  # type: ignore[arg-type]
    h.handle("s1", launch)
    h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    assert h.unclaimed(agent) == Resources.parse(
        "cpus:3;mem:3584"
    )  # the executor still holds its share
    # Its EXITED_EXECUTOR was lost; the agent reconnects and reports no executor.
    info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:4;mem:4096"))
    h.handle("a1", ReregisterAgent(agent_id=agent, agent_info=info))
    assert h.master.state.agents[agent].executors == {}
    assert h.unclaimed(agent) == Resources.parse("cpus:4;mem:4096")


def test_pong_usage_is_kept_per_task_and_shown_in_the_state() -> None:
    h, _agent, fw = _cluster(partition_aware=False)
    usage = ContainerUsage(
        framework_id=fw,
        executor_id=ExecutorID("agora-command"),
        task_id=TaskID("t1"),
        cpu_seconds=1.5,
        rss_bytes=4096,
        mem_limit_bytes=1024 << 20,
        cpu_limit=2.0,
        timestamp=7.0,
    )
    stranger = ContainerUsage(
        framework_id=fw, executor_id=ExecutorID("agora-command"), task_id=TaskID("nope")
    )
    h.handle("a1", Pong(usage=(usage, stranger)))
    (task,) = [t for t in _state(h).tasks if t.task_id == "t1"]
    assert task.usage == usage


def test_usage_from_another_agent_is_ignored() -> None:
    h, _agent, fw = _cluster(partition_aware=False)
    h.register_agent("a2", "cpus:1;mem:64")
    usage = ContainerUsage(
        framework_id=fw, executor_id=ExecutorID("agora-command"), task_id=TaskID("t1")
    )
    h.handle("a2", Pong(usage=(usage,)))
    (task,) = [t for t in _state(h).tasks if t.task_id == "t1"]
    assert task.usage is None


def _state(h: Harness) -> StateReply:
    return only(of_type(sent_to(h.handle("ops", GetState()), "ops"), StateReply))


def test_every_exited_executor_is_acknowledged_even_when_already_heard() -> None:
    """The agent sends EXITED_EXECUTOR until it is acknowledged; the first frees the executor's
    resources and tells the framework, a copy only gets its acknowledgement."""
    from agora.sdk.messages import (
        Accept,
        CommandInfo,
        ExecutorInfo,
        ExitedExecutor,
        ExitedExecutorAck,
        Launch,
        TaskInfo,
    )

    h = Harness(_CFG)
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", failover_timeout=3600)
    offer = only(offers_in(h.tick(), "s1"))
    executor = ExecutorInfo(
        executor_id=ExecutorID("ex"),
        framework_id=fw,
        command=CommandInfo(value="exec"),
        resources=Resources.parse("cpus:1;mem:512"),
    )
    task = TaskInfo(
        task_id=TaskID("t1"),
        name="t1",
        agent_id=agent,
        resources=Resources.parse("cpus:1;mem:512"),
        executor=executor,
    )
    h.handle(
        "s1",
        Accept(
            framework_id=fw, offer_ids=(offer.offer_id,), operations=(Launch(task_infos=(task,)),)
        ),
    )
    h.agent_update("a1", fw, "t1", TaskState.FINISHED)
    exited = ExitedExecutor(framework_id=fw, executor_id=ExecutorID("ex"), status=0)
    ack = ExitedExecutorAck(framework_id=fw, executor_id=ExecutorID("ex"))
    out = h.handle("a1", exited)
    assert of_type(sent_to(out, "a1"), ExitedExecutorAck) == [ack]
    assert h.unclaimed(agent) == Resources.parse("cpus:4;mem:4096")
    assert len(of_type(sent_to(out, "s1"), Failure)) == 1
    again = h.handle("a1", exited)
    assert of_type(sent_to(again, "a1"), ExitedExecutorAck) == [ack]
    assert of_type(sent_to(again, "s1"), Failure) == []


def test_an_executor_whose_launch_never_reached_the_agent_is_dropped_with_its_task() -> None:
    """RUN_TASK with a new custom executor is lost; the agent answers a KILL of the task with
    TASK_UNKNOWN. The executor never started, so no EXITED_EXECUTOR will ever come: the master
    drops it and frees what it was charged. One still used by another live task stays. Found by
    the cluster simulation on a lossy network."""
    from agora.sdk.messages import (
        Accept,
        CommandInfo,
        ExecutorInfo,
        Launch,
        StatusSource,
        StatusUpdate,
        StatusUpdateMessage,
        TaskInfo,
        TaskStatus,
    )

    h = Harness(_CFG)
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1", failover_timeout=3600)
    offer = only(offers_in(h.tick(), "s1"))

    def executor(name: str) -> ExecutorInfo:
        return ExecutorInfo(
            executor_id=ExecutorID(name),
            framework_id=fw,
            command=CommandInfo(value="exec"),
            resources=Resources.parse("cpus:1;mem:256"),
        )

    def task(name: str, ex: ExecutorInfo) -> TaskInfo:
        return TaskInfo(
            task_id=TaskID(name),
            name=name,
            agent_id=agent,
            resources=Resources.parse("cpus:0.5;mem:128"),
            executor=ex,
        )

    lone, shared = executor("lone"), executor("shared")
    tasks = (task("t1", lone), task("t2", shared), task("t3", shared))
    h.handle(
        "s1",
        Accept(
            framework_id=fw, offer_ids=(offer.offer_id,), operations=(Launch(task_infos=tasks),)
        ),
    )
    used = Resources.parse("cpus:3.5;mem:896")  # 3 tasks and 2 executors

    def unknown(task_id: str) -> None:
        status = TaskStatus(
            task_id=TaskID(task_id),
            state=TaskState.LOST,
            source=StatusSource.AGENT,
            reason=Reason.TASK_UNKNOWN,
            uuid=task_id.encode().ljust(16, b"-"),
        )
        h.handle("a1", StatusUpdateMessage(update=StatusUpdate(framework_id=fw, status=status)))

    assert h.unclaimed(agent) == Resources.parse("cpus:4;mem:4096") - used
    unknown("t1")
    unknown("t2")
    executors = h.master.state.agents[agent].executors
    assert set(executors) == {(fw, ExecutorID("shared"))}  # t3 still uses it
    # t1, its executor and t2 are back.
    assert h.unclaimed(agent) == Resources.parse("cpus:2.5;mem:3712")
