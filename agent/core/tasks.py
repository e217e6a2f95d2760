"""Tasks: RUN_TASK / RUN_TASK_GROUP, KILL_TASK, executors' status updates, the master's acks.

A task with a ``command`` runs on the framework's built-in command executor; one with an
``executor`` (or in a group) on that custom executor. Tasks wait in their executor's queue until
it registers, then go to it (LAUNCH_TASK / LAUNCH_GROUP). A task is STAGING until its executor
reports, and leaves the agent when its final update is acknowledged.

Refusals: a task the agent cannot run (malformed, an id that cannot name a directory, another
definition of a running executor) is answered TASK_ERROR (reason TASK_INVALID) from the agent;
one that would run as a user the agent's flags refuse (root without --allow-root-tasks: see
``run_as``) is answered TASK_ERROR, reason TASK_UNAUTHORIZED.
A RUN_TASK for a task the agent already holds is a duplicate and is ignored, as is one for a
framework being shut down.
"""

from __future__ import annotations

from agora.agent.core.executors import (
    command_executor_info,
    end_launches,
    hand_over,
    launch_executor,
    shutdown_executor,
)
from agora.agent.core.state import (
    COMMAND_EXECUTOR_ID,
    AgentState,
    Executor,
    ExecutorState,
    Framework,
    QueuedLaunch,
    Task,
    is_final,
)
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorInfo,
    FrameworkCapability,
    FrameworkInfo,
    KillTask,
    Reason,
    ReconcileTasks,
    RunTask,
    RunTaskGroup,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    TaskInfo,
    TaskState,
)
from msgspec.structs import replace

__all__ = [
    "on_executor_update",
    "on_kill_task",
    "on_master_ack",
    "on_reconcile_tasks",
    "on_run_task",
    "on_run_task_group",
    "path_problem",
]


def path_problem(kind: str, value: str) -> str | None:
    """Why ``value`` cannot be a path component of a sandbox, or None if it can."""
    if (
        not value
        or len(value) > 255
        or value in (".", "..")
        or "/" in value
        or any(c.isspace() or not c.isprintable() for c in value)
    ):
        return f"{kind} {value[:64]!r} cannot name a directory"
    return None


# --- launching ---------------------------------------------------------------------------


def on_run_task(st: AgentState, msg: RunTask, now: float) -> None:
    fid, task = msg.framework_id, msg.task
    if _ignored(st, fid, (task,)):
        return
    problem = path_problem("framework id", fid) or _task_problem(st, fid, task, None)
    executor = task.executor
    if problem is None and executor is not None:
        problem = _executor_problem(st, fid, executor)
    if problem is not None:
        _refuse(st, fid, (task,), problem, now)
        return
    unauthorized = st.config.task_users.problem(task, None, msg.framework_info.user)
    if unauthorized is not None:
        _refuse(st, fid, (task,), unauthorized, now, Reason.TASK_UNAUTHORIZED)
        return
    fw = _framework(st, fid, msg.framework_info)
    if executor is None:
        _assign(st, fw, command_executor_info(fid), True, (task,), False, msg.role, now)
    else:
        _assign(st, fw, executor, False, (task,), False, msg.role, now)


def on_run_task_group(st: AgentState, msg: RunTaskGroup, now: float) -> None:
    fid, tasks, executor = msg.framework_id, msg.task_group.tasks, msg.executor
    if _ignored(st, fid, tasks):
        return
    problem = path_problem("framework id", fid) or _executor_problem(st, fid, executor)
    if problem is None and not tasks:
        problem = "a task group needs at least one task"
    if problem is None and len({t.task_id for t in tasks}) != len(tasks):
        problem = "task ids repeat within the group"
    for task in tasks:
        problem = problem or _task_problem(st, fid, task, executor)
    if problem is not None:
        _refuse(st, fid, tasks, problem, now)
        return
    users = st.config.task_users
    for task in tasks:
        unauthorized = users.problem(task, executor, msg.framework_info.user)
        if unauthorized is not None:
            _refuse(st, fid, tasks, unauthorized, now, Reason.TASK_UNAUTHORIZED)
            return
    fw = _framework(st, fid, msg.framework_info)
    _assign(st, fw, executor, False, tasks, True, msg.role, now)


def _ignored(st: AgentState, fid: FrameworkID, tasks: tuple[TaskInfo, ...]) -> bool:
    """A framework being shut down takes no work; a task the agent holds is a duplicate."""
    fw = st.frameworks.get(fid)
    if fw is not None and fw.terminating:
        return True
    return any((fid, t.task_id) in st.tasks or (fid, t.task_id) in st.updates for t in tasks)


def _task_problem(
    st: AgentState, fid: FrameworkID, task: TaskInfo, group: ExecutorInfo | None
) -> str | None:
    problem = path_problem("task id", task.task_id)
    if problem is not None:
        return problem
    if task.agent_id != st.agent_id:
        return f"task {task.task_id} is for agent {task.agent_id}, not this one"
    if group is not None:
        if task.executor is not None and task.executor != group:
            return f"task {task.task_id} in a group must not name another executor"
        return None
    if (task.command is None) == (task.executor is None):
        return f"task {task.task_id} needs exactly one of command and executor"
    return None


def _executor_problem(st: AgentState, fid: FrameworkID, info: ExecutorInfo) -> str | None:
    problem = path_problem("executor id", info.executor_id)
    if problem is not None:
        return problem
    if info.executor_id == COMMAND_EXECUTOR_ID:
        return f"executor id {COMMAND_EXECUTOR_ID} is reserved for the command executor"
    if info.framework_id != fid:
        return f"executor {info.executor_id} belongs to another framework"
    ex = st.executors.get((fid, info.executor_id))
    if ex is not None and ex.info != info:
        return f"executor {info.executor_id} is already running with a different definition"
    return None


def _refuse(
    st: AgentState,
    fid: FrameworkID,
    tasks: tuple[TaskInfo, ...],
    problem: str,
    now: float,
    reason: Reason = Reason.TASK_INVALID,
) -> None:
    for task in tasks:
        status = st.agent_status(fid, task.task_id, TaskState.ERROR, reason, now, message=problem)
        st.report(fid, status, now)


def _framework(st: AgentState, fid: FrameworkID, info: FrameworkInfo) -> Framework:
    info = replace(info, framework_id=fid)
    fw = st.frameworks.get(fid)
    if fw is None:
        fw = st.frameworks[fid] = Framework(framework_id=fid, info=info)
        st.touch(fw)
    elif fw.info != info:
        fw.info = info
        st.touch(fw)
    return fw


def _assign(
    st: AgentState,
    fw: Framework,
    info: ExecutorInfo,
    builtin: bool,
    tasks: tuple[TaskInfo, ...],
    group: bool,
    role: str,
    now: float,
) -> None:
    """Send the tasks to their executor, launching it (and queueing them) if need be."""
    ex = st.executors.get((fw.framework_id, info.executor_id))
    if ex is None:
        ex = launch_executor(st, fw, info, builtin, now)
    for task in tasks:
        st.add_task(
            Task(framework_id=fw.framework_id, info=task, executor_id=info.executor_id, role=role)
        )
    st.launch_seq += 1
    launch = QueuedLaunch(task_ids=tuple(t.task_id for t in tasks), group=group, seq=st.launch_seq)
    if ex.state is ExecutorState.LAUNCHING or ex.state is ExecutorState.RECOVERING:
        ex.queued.append(launch)  # handed over when it (re-)registers
        st.touch(ex)
    elif ex.state is ExecutorState.RUNNING:
        hand_over(st, ex, launch)
    else:
        ex.successor.append(launch)
        st.touch(ex)


# --- killing and reconciling ---------------------------------------------------------------


def _unknown(
    st: AgentState, fid: FrameworkID, tid: TaskID, partition_aware: bool, now: float
) -> None:
    """Say that this agent does not know the task (unless an update for it is on its way)."""
    if (fid, tid) in st.updates:
        return
    fw = st.frameworks.get(fid)
    aware = partition_aware or (
        fw is not None and FrameworkCapability.PARTITION_AWARE in fw.info.capabilities
    )
    state = TaskState.DROPPED if aware else TaskState.LOST
    status = st.agent_status(fid, tid, state, Reason.TASK_UNKNOWN, now, message="Unknown task")
    st.report(fid, status, now)


def on_reconcile_tasks(st: AgentState, msg: ReconcileTasks, now: float) -> None:
    """The master has these tasks on this agent, which the agent did not report when it
    re-registered: answer for each it does not know (see ``_unknown``); the others are here
    (their launch arrived meanwhile) and their own updates speak for them."""
    fw = st.frameworks.get(msg.framework_id)
    if fw is not None and fw.terminating:
        return
    for tid in msg.task_ids:
        if (msg.framework_id, tid) not in st.tasks:
            _unknown(st, msg.framework_id, tid, msg.partition_aware, now)


def on_kill_task(st: AgentState, msg: KillTask, now: float) -> None:
    """Kill a task: a queued one ends KILLED here; a launched one is the executor's to kill.

    A task the agent does not know (its RUN_TASK was lost, or it is long over) is answered
    with reason TASK_UNKNOWN, unless an update for it is still on its way: TASK_DROPPED for a
    partition-aware framework (the launch never reached an executor; such a framework must
    never hear LOST), TASK_LOST otherwise. Whether it is partition-aware comes with the
    KILL_TASK, as the agent may never have heard of the framework either."""
    fid, tid = msg.framework_id, msg.task_id
    fw = st.frameworks.get(fid)
    if fw is not None and fw.terminating:
        return
    task = st.tasks.get((fid, tid))
    if task is None:
        _unknown(st, fid, tid, msg.partition_aware, now)
        return
    if is_final(task.state):
        return
    if msg.reason is not None and task.kill_reason is None:
        task.kill_reason = msg.reason
        st.touch(task)
    ex = st.executors.get((fid, task.executor_id))
    if ex is None:
        return
    if not task.launched:
        _kill_waiting(st, ex, task, now)
    elif ex.state is ExecutorState.RUNNING and ex.peer is not None:
        task.kill_id = msg.kill_id
        st.to_executor(ex.peer, KillTask(framework_id=fid, task_id=tid, kill_id=msg.kill_id))
    elif ex.state is ExecutorState.RECOVERING:
        task.kill_id = msg.kill_id
        if tid not in ex.pending_kills:
            ex.pending_kills.append(tid)  # sent when it re-registers
    # A terminating executor's tasks end when it exits.


def _kill_waiting(st: AgentState, ex: Executor, task: Task, now: float) -> None:
    """Kill a task still waiting for its executor; the rest of its group goes with it."""
    tid = task.info.task_id
    for waiting in (ex.queued, ex.successor):
        for launch in list(waiting):
            if tid in launch.task_ids:
                waiting.remove(launch)
                st.touch(ex)
                end_launches(
                    st,
                    ex,
                    [launch],
                    TaskState.KILLED,
                    task.kill_reason or Reason.TASK_KILLED_DURING_LAUNCH,
                    "Task killed before it was launched",
                    now,
                )
    if ex.state is ExecutorState.LAUNCHING and not ex.queued and not ex.live:
        shutdown_executor(st, ex, now, requested=False)  # nothing left for it to run


# --- updates -----------------------------------------------------------------------------


def on_executor_update(st: AgentState, ex: Executor, update: StatusUpdate, now: float) -> None:
    """A status update from a registered executor: into the task's stream, acked at once.

    Updates without a uuid, for another framework, or with state STAGING are dropped. One for a
    task this executor does not run (unknown, long over) is acknowledged and dropped."""
    status = update.status
    uuid = status.uuid
    if update.framework_id != ex.framework_id or uuid is None or ex.peer is None:
        return
    if status.state is not TaskState.STAGING:
        task = st.tasks.get((ex.framework_id, status.task_id))
        if (
            task is not None
            and task.launched
            and task.executor_id == ex.executor_id
            and status.task_id in ex.tasks
        ):
            clean = replace(
                status,
                agent_id=st.agent_id,
                executor_id=ex.executor_id,
                source=StatusSource.EXECUTOR,
            )
            if task.limitation is not None and is_final(clean.state):
                # Killed for exceeding a limit of its container: it failed, for that reason.
                reason, message = task.limitation
                clean = replace(
                    clean,
                    state=TaskState.FAILED,
                    reason=reason,
                    message=message,
                    source=StatusSource.AGENT,
                )
            elif task.kill_reason is not None and clean.state is TaskState.KILLED:
                clean = replace(clean, reason=clean.reason or task.kill_reason)
            st.report(ex.framework_id, clean, now)
    st.to_executor(
        ex.peer,
        StatusUpdateAck(
            framework_id=ex.framework_id, task_id=status.task_id, uuid=uuid, agent_id=st.agent_id
        ),
    )


def on_master_ack(st: AgentState, msg: StatusUpdateAck, now: float) -> None:
    """The framework acknowledged an update. Only the head of a stream can be acknowledged;
    when that was the task's final update, the task leaves the agent."""
    if msg.agent_id is not None and msg.agent_id != st.agent_id:
        return
    acked = st.updates.acknowledge(msg.framework_id, msg.task_id, msg.uuid, now)
    st.flush_updates()
    if acked is not None and is_final(acked.state):
        st.forget_task((msg.framework_id, msg.task_id))
