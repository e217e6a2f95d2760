"""Executors: launch, registration, shutdown with a grace period, exit, and their timers.

An executor is LAUNCHING from the LaunchExecutor action until its REGISTER_EXECUTOR, then
RUNNING, then TERMINATING from a shutdown (or kill) until the shell reports its exit. Tasks
for it wait in its queue until it registers. A task for an executor that is terminating waits
for that executor to exit, then goes to a fresh executor with the same id.

Shutdown (by the master, the framework's teardown, an idle command executor): a registered
executor is sent SHUTDOWN_EXECUTOR and left to stop its tasks; one that never registered is
sent SIGTERM. Either way it is SIGKILLed if still alive after the shutdown grace period.
"""

from __future__ import annotations

from agora.agent.core import exits, gpus, reservations
from agora.agent.core.actions import LaunchExecutor, SignalExecutor
from agora.agent.core.executor_auth import SECRET_ENV
from agora.agent.core.state import (
    COMMAND_EXECUTOR_ID,
    AgentState,
    Executor,
    ExecutorState,
    Framework,
    QueuedLaunch,
    is_final,
)
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import (
    CommandInfo,
    ExecutorInfo,
    ExecutorRegistered,
    ExecutorReregistered,
    ExecutorToFramework,
    ExitedExecutor,
    FrameworkToExecutor,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    Reason,
    RegisterExecutor,
    ReregisterExecutor,
    ShutdownExecutor,
    ShutdownFramework,
    TaskGroupInfo,
    TaskState,
)
from msgspec.structs import replace

__all__ = [
    "LAUNCH_FAILED_STATUS",
    "UNKNOWN_EXIT_STATUS",
    "command_executor_info",
    "end_launches",
    "hand_over",
    "launch_executor",
    "on_executor_message",
    "on_exited",
    "on_framework_message",
    "on_launch_failed",
    "on_register",
    "on_reregister",
    "on_shutdown_executor",
    "on_shutdown_framework",
    "resend_kills",
    "shutdown_executor",
    "shutdown_framework",
    "tick_executors",
]

#: The exit status reported to the master (EXITED_EXECUTOR) for an executor that never started.
LAUNCH_FAILED_STATUS = 127
#: ... and for one whose exit status nobody knows (it ended while the agent was down, or the
#: shell re-attached to it after a restart and cannot wait for it).
UNKNOWN_EXIT_STATUS = -1


def command_executor_info(framework_id: FrameworkID) -> ExecutorInfo:
    """The built-in command executor of a framework: one per framework on an agent."""
    return ExecutorInfo(
        executor_id=COMMAND_EXECUTOR_ID,
        framework_id=framework_id,
        command=CommandInfo(value="agora-command-executor"),
        name="Command Executor",
    )


def launch_executor(
    st: AgentState, fw: Framework, info: ExecutorInfo, builtin: bool, now: float
) -> Executor:
    ex = Executor(
        framework_id=fw.framework_id,
        executor_id=info.executor_id,
        info=info,
        builtin=builtin,
        state=ExecutorState.LAUNCHING,
        launched_at=now,
        secret=st.new_secret(),
    )
    if not ex.secret:
        raise ValueError("the executor secret source gave an empty secret")
    st.executors[ex.key] = ex
    st.touch(ex)
    fw.executors.add(ex.executor_id)
    environment = dict(info.command.environment)
    environment.update(
        AGORA_FRAMEWORK_ID=str(ex.framework_id),
        AGORA_EXECUTOR_ID=str(ex.executor_id),
        AGORA_AGENT_ID=str(st.agent_id),
        AGORA_SHUTDOWN_GRACE_PERIOD=str(st.config.executor_shutdown_grace_period),
    )
    environment[SECRET_ENV] = ex.secret
    st.outbox.append(
        LaunchExecutor(
            framework_id=ex.framework_id,
            executor_id=ex.executor_id,
            info=info,
            builtin=builtin,
            sandbox=ex.sandbox,
            environment=environment,
            user=info.command.user or st.config.task_users.fallback(fw.info.user) or None,
        )
    )
    return ex


def hand_over(st: AgentState, ex: Executor, launch: QueuedLaunch) -> None:
    """Give a launch to a registered executor."""
    assert ex.peer is not None
    tasks = [st.tasks[(ex.framework_id, tid)] for tid in launch.task_ids]
    infos = tuple(gpus.handed_over(st, task) for task in tasks)
    for task in tasks:
        task.launched = True
        st.touch(task)
    st.resize(ex)  # before the launch: the container holds the tasks before they start
    reservations.link_volumes(st, ex, tasks)
    if launch.group:
        message: LaunchTask | LaunchTaskGroup = LaunchTaskGroup(
            framework_id=ex.framework_id, executor=ex.info, task_group=TaskGroupInfo(tasks=infos)
        )
    else:
        message = LaunchTask(framework_id=ex.framework_id, task=infos[0])
    st.to_executor(ex.peer, message)


def end_launches(
    st: AgentState,
    ex: Executor,
    launches: list[QueuedLaunch],
    state: TaskState,
    reason: Reason,
    message: str,
    now: float,
) -> None:
    """Tasks that never reached their executor end here, with an update from the agent."""
    for launch in launches:
        for tid in launch.task_ids:
            task = st.tasks.get((ex.framework_id, tid))
            if task is None or is_final(task.state):
                continue
            status = st.agent_status(
                ex.framework_id,
                tid,
                state,
                reason,
                now,
                executor_id=ex.executor_id,
                message=message,
            )
            st.report(ex.framework_id, status, now)


# --- registration ----------------------------------------------------------------------


def on_register(st: AgentState, peer: str, msg: RegisterExecutor, now: float) -> None:
    ex = st.executors.get((msg.framework_id, msg.executor_id))
    claimed = st.executors_by_peer.get(peer)
    if ex is not None and ex.state is ExecutorState.RUNNING and ex.peer == peer:
        st.to_executor(peer, _registered(st, ex))  # a retried registration: answer again
        return
    fw = st.frameworks.get(msg.framework_id)
    if (
        ex is None
        or fw is None
        or fw.terminating
        or ex.state is not ExecutorState.LAUNCHING
        or (claimed is not None and claimed != ex.key)
    ):
        # Unknown, unexpected, or a second process claiming the executor's id.
        st.to_executor(
            peer, ShutdownExecutor(framework_id=msg.framework_id, executor_id=msg.executor_id)
        )
        return
    ex.state = ExecutorState.RUNNING
    st.touch(ex)
    ex.peer = peer
    st.executors_by_peer[peer] = ex.key
    st.to_executor(peer, _registered(st, ex))
    queued, ex.queued = ex.queued, []
    for launch in queued:
        hand_over(st, ex, launch)


def _registered(st: AgentState, ex: Executor) -> ExecutorRegistered:
    assert st.agent_id is not None
    return ExecutorRegistered(
        executor_info=ex.info,
        framework_id=ex.framework_id,
        framework_info=st.frameworks[ex.framework_id].info,
        agent_id=st.agent_id,
        agent_info=st.agent_info,
    )


def on_reregister(
    st: AgentState, peer: str, msg: ReregisterExecutor, now: float
) -> Executor | None:
    """A registered executor reconnected (its peer name may have changed). Returns the executor
    if it is known, so that the caller takes in the updates it re-sends."""
    ex = st.executors.get((msg.framework_id, msg.executor_id))
    claimed = st.executors_by_peer.get(peer)
    if (
        ex is None
        or ex.state is ExecutorState.LAUNCHING
        or (claimed is not None and claimed != ex.key)
    ):
        st.to_executor(
            peer, ShutdownExecutor(framework_id=msg.framework_id, executor_id=msg.executor_id)
        )
        return None
    if ex.peer is not None and ex.peer != peer:
        st.executors_by_peer.pop(ex.peer, None)
    ex.peer = peer
    st.executors_by_peer[peer] = ex.key
    if ex.state is ExecutorState.TERMINATING:
        # It may have missed the shutdown while it was away: say it again.
        st.to_executor(
            peer, ShutdownExecutor(framework_id=ex.framework_id, executor_id=ex.executor_id)
        )
    else:
        assert st.agent_id is not None
        st.to_executor(peer, ExecutorReregistered(agent_id=st.agent_id, agent_info=st.agent_info))
    return ex


def resend_kills(st: AgentState, ex: Executor) -> None:
    """After a registered executor re-registered (and its re-sent updates were taken in):
    kills handed to its previous connection may never have reached it, so a task it still
    runs that was killed is killed again, with the same kill id."""
    peer = ex.peer
    if ex.state is not ExecutorState.RUNNING or peer is None:
        return
    for tid in sorted(ex.live):
        task = st.tasks.get((ex.framework_id, tid))
        if task is None or task.kill_id is None or not task.launched or is_final(task.state):
            continue
        st.to_executor(
            peer, KillTask(framework_id=ex.framework_id, task_id=tid, kill_id=task.kill_id)
        )


# --- messages --------------------------------------------------------------------------


def on_executor_message(st: AgentState, ex: Executor, msg: ExecutorToFramework) -> None:
    """Executor -> framework data, relayed through the master, best effort."""
    fw = st.frameworks.get(ex.framework_id)
    if msg.framework_id != ex.framework_id or msg.executor_id != ex.executor_id:
        return
    if fw is None or fw.terminating:
        return
    st.to_master(replace(msg, agent_id=st.agent_id))


def on_framework_message(st: AgentState, msg: FrameworkToExecutor) -> None:
    """Framework -> executor data: delivered if the executor is registered, else dropped."""
    ex = st.executors.get((msg.framework_id, msg.executor_id))
    if ex is not None and ex.state is ExecutorState.RUNNING and ex.peer is not None:
        st.to_executor(ex.peer, msg)


# --- shutdown ----------------------------------------------------------------------------


def shutdown_executor(st: AgentState, ex: Executor, now: float, *, requested: bool) -> None:
    """Stop an executor. ``requested``: the master or the framework asked, so its tasks end
    KILLED (not FAILED) and tasks still waiting for it are KILLED too."""
    st.touch(ex)
    if requested:
        ex.shutdown_requested = True
        waiting = ex.queued + ex.successor
        ex.queued, ex.successor = [], []
        end_launches(
            st,
            ex,
            waiting,
            TaskState.KILLED,
            Reason.TASK_KILLED_DURING_LAUNCH,
            "Executor shut down before the task was launched",
            now,
        )
    if ex.state is ExecutorState.TERMINATING:
        return
    ex.state = ExecutorState.TERMINATING
    ex.kill_at = now + st.config.executor_shutdown_grace_period
    ex.idle_since = None
    if ex.peer is not None:
        st.to_executor(
            ex.peer, ShutdownExecutor(framework_id=ex.framework_id, executor_id=ex.executor_id)
        )
    else:
        st.outbox.append(SignalExecutor(ex.framework_id, ex.executor_id, kill=False))


def on_shutdown_executor(st: AgentState, msg: ShutdownExecutor, now: float) -> None:
    ex = st.executors.get((msg.framework_id, msg.executor_id))
    if ex is not None:
        shutdown_executor(st, ex, now, requested=True)


def on_shutdown_framework(st: AgentState, msg: ShutdownFramework, now: float) -> None:
    fw = st.frameworks.get(msg.framework_id)
    if fw is not None:
        shutdown_framework(st, fw, now)
    else:
        # Nothing of it ran here, but the agent may still owe it an update (the answer to a
        # kill of a task it never heard of): nobody will acknowledge that any more, and the
        # master says SHUTDOWN_FRAMEWORK again for every resend.
        st.updates.remove_framework(msg.framework_id)


def shutdown_framework(st: AgentState, fw: Framework, now: float) -> None:
    """The framework is gone from the master: stop its executors, forget its updates (nobody
    will acknowledge them) and its tasks once they are over."""
    fw.terminating = True
    st.touch(fw)
    st.updates.remove_framework(fw.framework_id)
    for tid in sorted(fw.tasks):
        task = st.tasks.get((fw.framework_id, tid))
        if task is not None and is_final(task.state):
            st.forget_task(task.key)
    for eid in sorted(fw.executors):
        shutdown_executor(st, st.executors[(fw.framework_id, eid)], now, requested=True)
    st.gc_framework(fw.framework_id)


# --- exit --------------------------------------------------------------------------------


def on_exited(
    st: AgentState,
    framework_id: FrameworkID,
    executor_id: ExecutorID,
    status: int | None,
    now: float,
    *,
    message: str | None = None,
    limitation: tuple[Reason, str] | None = None,
) -> None:
    """The executor is gone. ``status`` None: unknown (reported to the master as -1).
    ``limitation``: a limit of its container ended it (reason and message for its tasks)."""
    ex = st.executors.get((framework_id, executor_id))
    if ex is None:
        return
    if message is None:
        known = f"with status {status}" if status is not None else "(exit status unknown)"
        message = f"Executor exited {known}"
    if ex.exit_reason is not None:
        # Killed by recovery: its own reason, FAILED even if a shutdown had been requested.
        _ended(st, ex, TaskState.FAILED, ex.exit_reason, ex.exit_message or message, now)
    elif limitation is not None:
        _ended(st, ex, TaskState.FAILED, limitation[0], f"{limitation[1]} ({message})", now)
    else:
        state = TaskState.KILLED if ex.shutdown_requested else TaskState.FAILED
        _ended(st, ex, state, Reason.EXECUTOR_TERMINATED, message, now)
    code = UNKNOWN_EXIT_STATUS if status is None else status
    exits.exited(
        st, ExitedExecutor(framework_id=framework_id, executor_id=executor_id, status=code), now
    )
    _relaunch(st, ex, now)


def on_launch_failed(
    st: AgentState, framework_id: FrameworkID, executor_id: ExecutorID, error: str, now: float
) -> None:
    ex = st.executors.get((framework_id, executor_id))
    if ex is None:
        return
    state = TaskState.KILLED if ex.shutdown_requested else TaskState.FAILED
    message = f"Executor could not be launched: {error}"
    _ended(st, ex, state, Reason.CONTAINER_LAUNCH_FAILED, message[:4096], now)
    exits.exited(
        st,
        ExitedExecutor(
            framework_id=framework_id, executor_id=executor_id, status=LAUNCH_FAILED_STATUS
        ),
        now,
    )
    _relaunch(st, ex, now)


def _ended(
    st: AgentState, ex: Executor, state: TaskState, reason: Reason, message: str, now: float
) -> None:
    """The executor is gone: every task of it that is not over yet ends ``state``."""
    del st.executors[ex.key]
    st.touch(ex)
    if ex.peer is not None and st.executors_by_peer.get(ex.peer) == ex.key:
        del st.executors_by_peer[ex.peer]
    fw = st.frameworks.get(ex.framework_id)
    if fw is not None:
        fw.executors.discard(ex.executor_id)
    queued = {tid for launch in ex.queued for tid in launch.task_ids}
    for tid in sorted(ex.live | queued):
        task = st.tasks.get((ex.framework_id, tid))
        if task is None or is_final(task.state):
            continue
        task_state, task_reason, task_message = state, reason, message
        if task.limitation is not None:  # killed for exceeding a limit of its container
            task_state = TaskState.FAILED
            task_reason, task_message = task.limitation
        status = st.agent_status(
            ex.framework_id,
            tid,
            task_state,
            task_reason,
            now,
            executor_id=ex.executor_id,
            message=task_message,
        )
        st.report(ex.framework_id, status, now)


def _relaunch(st: AgentState, ex: Executor, now: float) -> None:
    """Launches that waited for the old executor to exit go to a fresh one."""
    fw = st.frameworks.get(ex.framework_id)
    if fw is not None and ex.successor and not fw.terminating:
        fresh = launch_executor(st, fw, ex.info, ex.builtin, now)
        exits.forget(st, fresh.key)
        fresh.queued = list(ex.successor)
        st.touch(fresh)
        for launch in fresh.queued:
            for tid in launch.task_ids:
                fresh.tasks.add(tid)
                fresh.live.add(tid)
    st.gc_framework(ex.framework_id)


# --- timers ------------------------------------------------------------------------------


def tick_executors(st: AgentState, now: float) -> None:
    cfg = st.config
    for ex in list(st.executors.values()):
        if ex.state is ExecutorState.LAUNCHING:
            if now - ex.launched_at >= cfg.executor_registration_timeout:
                _registration_timed_out(st, ex, now)
        elif ex.state is ExecutorState.RECOVERING:
            continue  # recovery.tick_recovering watches these
        elif ex.state is ExecutorState.TERMINATING:
            if ex.kill_at is not None and now >= ex.kill_at:
                ex.kill_at = None
                st.outbox.append(SignalExecutor(ex.framework_id, ex.executor_id, kill=True))
        elif (
            ex.builtin
            and ex.idle_since is not None
            and not ex.live
            and not ex.queued
            and now - ex.idle_since >= cfg.command_executor_idle_timeout
        ):
            shutdown_executor(st, ex, now, requested=False)


def _registration_timed_out(st: AgentState, ex: Executor, now: float) -> None:
    queued, ex.queued = ex.queued, []
    ex.state = ExecutorState.TERMINATING
    st.touch(ex)
    ex.kill_at = None
    st.outbox.append(SignalExecutor(ex.framework_id, ex.executor_id, kill=True))
    end_launches(
        st,
        ex,
        queued,
        TaskState.FAILED,
        Reason.EXECUTOR_REGISTRATION_TIMEOUT,
        f"Executor did not register within {st.config.executor_registration_timeout:g} seconds",
        now,
    )
