"""Task traffic after launch: status updates, acknowledgements, kills, reconciliation, messages."""

from __future__ import annotations

from collections.abc import Iterable

from agora.master.core.state import Agent, AgentStatus, Framework, MasterState, Task, TaskKey
from agora.sdk.messages import (
    Acknowledge,
    AgentTask,
    ExecutorToFramework,
    ExitedExecutor,
    ExitedExecutorAck,
    Failure,
    FrameworkMessage,
    FrameworkToExecutor,
    Kill,
    KillTask,
    Reason,
    Reconcile,
    ReconcileTask,
    SendMessage,
    Shutdown,
    ShutdownExecutor,
    ShutdownFramework,
    StatusSource,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
    Update,
    is_final,
)
from msgspec.structs import replace

__all__ = [
    "is_final",
    "on_acknowledge",
    "on_executor_message",
    "on_exited_executor",
    "on_kill",
    "on_message",
    "on_reconcile",
    "on_shutdown",
    "on_status_update",
    "reconcile_one",
    "resend_kills",
    "stop",
]


def on_status_update(st: MasterState, agent: Agent, msg: StatusUpdateMessage, now: float) -> None:
    update = msg.update
    status = update.status
    if update.framework_id in st.removed_frameworks:
        # The framework was torn down, but the agent runs on as if its SHUTDOWN_FRAMEWORK was
        # lost (ZeroMQ drops silently; nothing makes the agent re-register). Say it again rather
        # than drop its updates, which it would retry forever.
        st.send(agent.peer, ShutdownFramework(framework_id=update.framework_id))
        return
    key: TaskKey = (update.framework_id, status.task_id)
    task = st.tasks.get(key)
    if task is not None and task.agent_id != agent.agent_id:
        return  # not this agent's task: a confused or stale agent changes nothing
    if status.agent_id is None or status.agent_id != agent.agent_id:
        status = replace(status, agent_id=agent.agent_id)
    if task is not None:
        latest = update.latest_state or status.state
        st.set_task_state(task, latest)
        st.set_status(task, status)
        if is_final(latest):
            # Resources are free as soon as the agent says so, before any acknowledgement.
            st.release_task(task, now)
            if status.reason is Reason.TASK_UNKNOWN and task.new_executor:
                _never_started(st, agent, task, now)
        if status.uuid is None and is_final(status.state):
            complete(st, task)
    st.send_framework(update.framework_id, Update(status=status))


def _never_started(st: MasterState, agent: Agent, task: Task, now: float) -> None:
    """The agent never heard of ``task``, whose launch brought its executor: that launch was
    lost, so the executor never started and no EXITED_EXECUTOR will come. Drop it (and free
    what it was charged) unless another live task of the master's uses it."""
    executor_id = task.executor_id
    assert executor_id is not None
    for key in agent.tasks:
        other = st.tasks.get(key)
        if (
            other is not None
            and other is not task
            and other.framework_id == task.framework_id
            and not is_final(other.state)
            and other.executor_id == executor_id
        ):
            return
    entry = agent.executors.pop((task.framework_id, executor_id), None)
    if entry is not None:
        info, role = entry
        st.recover(task.framework_id, agent.agent_id, role, info.resources, now)


def on_acknowledge(st: MasterState, fw: Framework, msg: Acknowledge) -> None:
    agent = st.agents.get(msg.agent_id)
    if agent is None or agent.status is not AgentStatus.ACTIVE:
        return  # the agent re-sends the update once it is back; nothing to forward now
    st.send(
        agent.peer,
        StatusUpdateAck(
            framework_id=fw.framework_id, task_id=msg.task_id, uuid=msg.uuid, agent_id=msg.agent_id
        ),
    )
    task = st.tasks.get((fw.framework_id, msg.task_id))
    if task is not None and _ends_stream(task, msg.uuid):
        complete(st, task)


def _ends_stream(task: Task, uuid: bytes) -> bool:
    """Whether acknowledging ``uuid`` ends the task's update stream: it is the task's final
    update, forwarded by this master or reported pending by its agent (the framework heard it
    from an earlier leader; after this ACK the agent sends nothing more of the task)."""
    if task.status is not None and task.status.uuid == uuid and is_final(task.status.state):
        return True
    head = task.reported_head
    return task.reported_uuid == uuid and head is not None and is_final(head)


def complete(st: MasterState, task: Task) -> None:
    """The task is over for the master (its framework has seen its final update, or its agent
    is gone): keep it only in the framework's bounded history."""
    fw = st.frameworks.get(task.framework_id)
    st.forget_task(task.key, kept=fw is not None)
    if fw is not None:
        st.keep_completed(fw, task)


def on_kill(st: MasterState, fw: Framework, msg: Kill, now: float) -> None:
    task = st.tasks.get((fw.framework_id, msg.task_id))
    if (
        task is None
        or st.agents.get(task.agent_id) is None
        or (st.agents[task.agent_id].status is not AgentStatus.ACTIVE)
    ):
        # Unknown here, or on an agent out of reach: answer as reconciliation does.
        st.notice(
            "kill_answered_by_master",
            framework_id=fw.framework_id,
            task_id=msg.task_id,
            kill_id=msg.kill_id,
            why="unknown task" if task is None else "agent not reachable",
        )
        reconcile_one(st, fw, ReconcileTask(task_id=msg.task_id, agent_id=msg.agent_id), now)
        return
    if is_final(task.state):
        # Its agent already reported the end: the update stream carries the answer.
        st.notice(
            "kill_of_ended_task",
            framework_id=fw.framework_id,
            task_id=msg.task_id,
            kill_id=msg.kill_id,
            state=task.state.value,
        )
        return
    task.kill_id = msg.kill_id
    st.send_agent(
        task.agent_id,
        KillTask(
            framework_id=fw.framework_id,
            task_id=msg.task_id,
            kill_id=msg.kill_id,
            partition_aware=fw.partition_aware,
        ),
    )


def stop(st: MasterState, task: Task, reason: Reason, kill_id: str, why: str) -> None:
    """The master kills ``task`` itself (reclaim, a drain's deadline): its KILLED update gets
    ``reason`` from the agent, and the kill is sent again if the agent re-registers with the
    task still running. ``why`` is logged with it."""
    task.stop_reason = reason
    task.kill_id = kill_id
    fw = st.frameworks.get(task.framework_id)
    st.notice(
        "task_stopped_by_master",
        framework_id=task.framework_id,
        task_id=task.info.task_id,
        agent_id=task.agent_id,
        reason=reason.value,
        kill_id=kill_id,
        why=why,
    )
    st.send_agent(
        task.agent_id,
        KillTask(
            framework_id=task.framework_id,
            task_id=task.info.task_id,
            kill_id=kill_id,
            partition_aware=fw is not None and fw.partition_aware,
            reason=reason,
        ),
    )


def resend_kills(st: MasterState, agent: Agent, reported: Iterable[AgentTask]) -> None:
    """Kill again the tasks the agent reports still running that were killed: the first
    KILL_TASK may have been lost with the connection the agent re-registers from."""
    for at in reported:
        task = st.tasks.get((at.framework_id, at.task.task_id))
        if (
            task is None
            or task.kill_id is None
            or task.agent_id != agent.agent_id
            or is_final(at.state)
            or is_final(task.state)
        ):
            continue
        st.notice(
            "kill_resent",
            framework_id=at.framework_id,
            task_id=at.task.task_id,
            kill_id=task.kill_id,
            agent_id=agent.agent_id,
        )
        fw = st.frameworks.get(at.framework_id)
        st.send(
            agent.peer,
            KillTask(
                framework_id=at.framework_id,
                task_id=at.task.task_id,
                kill_id=task.kill_id,
                partition_aware=fw is not None and fw.partition_aware,
                reason=task.stop_reason,
            ),
        )


def on_shutdown(st: MasterState, fw: Framework, msg: Shutdown) -> None:
    st.send_agent(
        msg.agent_id, ShutdownExecutor(framework_id=fw.framework_id, executor_id=msg.executor_id)
    )


def on_message(st: MasterState, fw: Framework, msg: SendMessage) -> None:
    st.send_agent(
        msg.agent_id,
        FrameworkToExecutor(
            framework_id=fw.framework_id, executor_id=msg.executor_id, data=msg.data
        ),
    )


def on_executor_message(st: MasterState, agent: Agent, msg: ExecutorToFramework) -> None:
    st.send_framework(
        msg.framework_id,
        FrameworkMessage(agent_id=agent.agent_id, executor_id=msg.executor_id, data=msg.data),
    )


def on_exited_executor(st: MasterState, agent: Agent, msg: ExitedExecutor, now: float) -> None:
    # Acknowledged even when already heard: the agent sends it until it is (a copy of an
    # earlier one finds nothing left to do).
    st.send(
        agent.peer, ExitedExecutorAck(framework_id=msg.framework_id, executor_id=msg.executor_id)
    )
    entry = agent.executors.pop((msg.framework_id, msg.executor_id), None)
    if entry is None:
        return
    info, role = entry
    st.recover(msg.framework_id, agent.agent_id, role, info.resources, now)
    st.send_framework(
        msg.framework_id,
        Failure(agent_id=agent.agent_id, executor_id=msg.executor_id, status=msg.status),
    )


# --- reconciliation ---------------------------------------------------------------------


def on_reconcile(st: MasterState, fw: Framework, msg: Reconcile, now: float) -> None:
    if not msg.tasks:
        # Implicit: the latest state of every task the master knows for the framework.
        for key in sorted(fw.tasks):
            task = st.tasks.get(key)
            if task is not None:
                st.send_framework(fw.framework_id, Update(status=_latest(st, fw, task, now)))
        return
    for item in msg.tasks:
        reconcile_one(st, fw, item, now)


def reconcile_one(st: MasterState, fw: Framework, item: ReconcileTask, now: float) -> None:
    task = st.tasks.get((fw.framework_id, item.task_id))
    if task is not None:
        st.send_framework(fw.framework_id, Update(status=_latest(st, fw, task, now)))
        return
    if item.agent_id is not None and item.agent_id in st.recovering_agents:
        # An agent this master expects back (it was admitted before a failover): no answer
        # until it re-registers or is given up, as Mesos does; any answer now could contradict
        # what the agent is about to report. The framework asks again.
        return
    agent = st.agents.get(item.agent_id) if item.agent_id is not None else None
    pa = fw.partition_aware
    if agent is not None and agent.status is AgentStatus.UNREACHABLE:
        state = TaskState.UNREACHABLE if pa else TaskState.LOST
    elif agent is not None or item.agent_id is None or item.agent_id in st.removed_agents:
        # Unknown task on a registered agent, on no agent named, or on one that left for good.
        state = TaskState.GONE if pa else TaskState.LOST
    else:
        state = TaskState.UNKNOWN if pa else TaskState.LOST  # the agent itself is unknown
    status = st.master_status(
        item.task_id, state, Reason.RECONCILIATION, now, agent_id=item.agent_id
    )
    st.send_framework(fw.framework_id, Update(status=status))


def _latest(st: MasterState, fw: Framework, task: Task, now: float) -> TaskStatus:
    agent = st.agents.get(task.agent_id)
    # As Mesos does: the state of the newest update forwarded to the framework (the head of the
    # task's update stream), not the agent's ``latest_state``. Answering with a queued terminal
    # state lets the stream's earlier updates reach the framework after it (RUNNING after
    # FINISHED). Resources still follow ``task.state``.
    # A task learnt from an agent's report with an update pending: that update's state.
    head = task.reported_head if task.reported_head is not None else task.state
    state = task.status.state if task.status is not None else head
    if agent is not None and agent.status is AgentStatus.UNREACHABLE and not is_final(task.state):
        state = TaskState.UNREACHABLE if fw.partition_aware else TaskState.LOST
    if task.status is None:
        return st.master_status(
            task.info.task_id, state, Reason.RECONCILIATION, now, agent_id=task.agent_id
        )
    # Keep what the agent said (healthy, executor, message) but never a uuid or data.
    return replace(
        task.status,
        state=state,
        reason=Reason.RECONCILIATION,
        uuid=None,
        data=b"",
        source=StatusSource.MASTER,
        timestamp=now,
    )
