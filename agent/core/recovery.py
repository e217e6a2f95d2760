"""Recovery after an agent restart: the state back from the checkpoint, executors re-attached.

``recover`` rebuilds frameworks, executors, tasks and update streams from the records, then
decides each checkpointed executor's fate from whether the shell found its process alive:

* alive, ``cleanup`` False (``--recover=reconnect``): RECOVERING until it sends
  REREGISTER_EXECUTOR (or REGISTER_EXECUTOR if it had not registered before the restart); it is
  then RUNNING again, its re-sent updates taken in (duplicates, by uuid, ignored) and its queued
  launches and kills handed over. A launched task it does not know of (still STAGING, not in its
  task list, no update for it) never reached it (the agent died between checkpointing the launch
  and sending it): TASK_LOST, reason AGENT_RESTARTED. No (re-)registration within
  ``executor_reregistration_timeout``: SIGKILL, and its tasks end FAILED, reason
  EXECUTOR_REREGISTRATION_TIMEOUT, when the shell reports its exit. An executor that was already
  terminating stays so, with a fresh grace period (SIGKILL right away if recovery had killed it).
* alive, ``cleanup`` True (``--recover=cleanup``): SIGKILL; its tasks end FAILED, reason
  AGENT_RESTARTED, when its exit is reported.
* not alive: it ended while the agent was down. Its tasks end now (FAILED, reason
  EXECUTOR_TERMINATED, or KILLED if its shutdown had been requested) and the master hears
  EXITED_EXECUTOR with status -1. Exception: an executor that had not registered yet (LAUNCHING)
  in reconnect mode. No task ever reached it and it may never have been started at all (the agent
  died between checkpointing the launch and starting it), so it is launched again (a fresh
  LaunchExecutor) with the same queued tasks.
* Launches that waited for a terminating executor go to a fresh one once it has exited, as usual.
* Executors alive that the checkpoint does not know are SIGKILLed.

The pending status updates come back in order and go out (fresh retry timers) once the master
answers the re-registration; ``connected`` sends REREGISTER_AGENT with the same agent id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from agora.agent.core import checkpoint, executors, gpus, tasks
from agora.agent.core.actions import SignalExecutor
from agora.agent.core.state import (
    AgentState,
    Executor,
    ExecutorKey,
    ExecutorState,
    Framework,
    QueuedLaunch,
    Task,
    is_final,
)
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorRegistered,
    ExecutorReregistered,
    KillTask,
    Reason,
    RegisterExecutor,
    ReregisterExecutor,
    ShutdownExecutor,
    TaskState,
)

__all__ = [
    "CLEANUP_MESSAGE",
    "DEAD_MESSAGE",
    "on_register",
    "on_reregister",
    "recover",
    "tick_recovering",
]

CLEANUP_MESSAGE = "killed by agent recovery (--recover=cleanup)"
DEAD_MESSAGE = "executor exited while the agent was down"
UNDELIVERED_MESSAGE = "Task launched during agent restart: its executor never received it"


def recover(
    st: AgentState,
    records: Mapping[tuple[str, str], bytes],
    now: float,
    alive: Set[ExecutorKey],
    cleanup: bool,
    legacy_gpus: Mapping[str, Sequence[int]] | None = None,
) -> None:
    data = checkpoint.decode(records)
    for key in sorted(alive):
        if data.agent_id is None or not any(
            (e.framework_id, e.info.executor_id) == key for e in data.executors
        ):
            fid, eid = key
            st.outbox.append(SignalExecutor(fid, eid, kill=True))  # not ours (any more)
    st.checkpointed_resources = data.checkpointed_resources
    st.checkpointed_volumes = data.checkpointed_volumes
    if data.agent_id is None:
        return
    st.agent_id = data.agent_id
    st.master_epoch = max(st.master_epoch, data.master_epoch)
    st.uuid_salt = repr(now)
    _rebuild(st, data)
    checkpoint.mark_saved(st)
    gpus.adopt_legacy(st, legacy_gpus or {})
    for ex in sorted(st.executors.values(), key=lambda e: e.key):
        if ex.key not in alive:
            _dead(st, ex, now, cleanup)
        elif cleanup:
            _kill(st, ex, Reason.AGENT_RESTARTED, CLEANUP_MESSAGE)
        elif ex.state is ExecutorState.TERMINATING:
            ex.kill_at = (
                now
                if ex.exit_reason is not None
                else (now + st.config.executor_shutdown_grace_period)
            )
        else:
            ex.recovered_from = ex.state
            ex.state = ExecutorState.RECOVERING
            ex.launched_at = now


def _rebuild(st: AgentState, data: checkpoint.Decoded) -> None:
    for fr in data.frameworks:
        fid = fr.info.framework_id
        if fid is None:
            raise checkpoint.CheckpointError("checkpointed framework without an id")
        st.frameworks[fid] = Framework(framework_id=fid, info=fr.info, terminating=fr.terminating)
    for er in data.executors:
        fw = _framework_of(st, er.framework_id)
        ex = Executor(
            framework_id=er.framework_id,
            executor_id=er.info.executor_id,
            info=er.info,
            builtin=er.builtin,
            state=er.state,
            launched_at=0.0,
            queued=[QueuedLaunch(q.task_ids, q.group, q.seq) for q in er.queued],
            successor=[QueuedLaunch(q.task_ids, q.group, q.seq) for q in er.successor],
            shutdown_requested=er.shutdown_requested,
            exit_reason=er.exit_reason,
            exit_message=er.exit_message,
            secret=er.secret,
        )
        st.executors[ex.key] = ex
        fw.executors.add(ex.executor_id)
    for tr in data.tasks:
        fw = _framework_of(st, tr.framework_id)
        task = Task(
            framework_id=tr.framework_id,
            info=tr.info,
            executor_id=tr.executor_id,
            role=tr.role,
            state=tr.state,
            launched=tr.launched,
            limitation=(
                (tr.limitation_reason, tr.limitation_message)
                if tr.limitation_reason is not None
                else None
            ),
            gpus=tr.gpus,
            kill_reason=tr.kill_reason,
        )
        st.tasks[task.key] = task
        fw.tasks.add(task.info.task_id)
        owner = st.executors.get((tr.framework_id, tr.executor_id))
        waiting = owner is not None and any(tr.info.task_id in q.task_ids for q in owner.successor)
        if owner is not None and not waiting:  # successors belong to the next executor
            owner.tasks.add(task.info.task_id)
            if not is_final(task.state):
                owner.live.add(task.info.task_id)
    for sr in data.streams:
        st.updates.restore(
            sr.framework_id, sr.task_id, sr.pending, frozenset(sr.seen), sr.terminated
        )


def _framework_of(st: AgentState, framework_id: FrameworkID) -> Framework:
    fw = st.frameworks.get(framework_id)
    if fw is None:
        raise checkpoint.CheckpointError(f"checkpoint lacks framework {framework_id!r}")
    return fw


def _kill(st: AgentState, ex: Executor, reason: Reason, message: str) -> None:
    """SIGKILL a recovered executor; its tasks end FAILED with ``reason`` when it exits."""
    ex.state = ExecutorState.TERMINATING
    ex.recovered_from = None
    ex.exit_reason, ex.exit_message = reason, message
    ex.kill_at = None
    ex.pending_kills.clear()
    st.touch(ex)
    st.outbox.append(SignalExecutor(ex.framework_id, ex.executor_id, kill=True))


def _dead(st: AgentState, ex: Executor, now: float, cleanup: bool) -> None:
    fw = st.frameworks[ex.framework_id]
    if ex.state is ExecutorState.LAUNCHING and not cleanup:
        # Nothing reached it; start it again with the same work.
        del st.executors[ex.key]
        fw.executors.discard(ex.executor_id)
        fresh = executors.launch_executor(st, fw, ex.info, ex.builtin, now)
        fresh.queued, fresh.tasks, fresh.live = ex.queued, ex.tasks, ex.live
        return
    executors.on_exited(st, ex.framework_id, ex.executor_id, None, now, message=DEAD_MESSAGE)


# --- executors coming back ---------------------------------------------------------------------


def on_register(st: AgentState, peer: str, msg: RegisterExecutor, now: float) -> None:
    """REGISTER_EXECUTOR from a RECOVERING executor: it had not registered (or never heard that
    it had) before the restart, so no task reached it."""
    ex = st.executors[(msg.framework_id, msg.executor_id)]
    if _claimed_by_other(st, peer, ex):
        return
    _back(st, peer, ex, now)
    assert st.agent_id is not None
    st.to_executor(
        peer,
        ExecutorRegistered(
            executor_info=ex.info,
            framework_id=ex.framework_id,
            framework_info=st.frameworks[ex.framework_id].info,
            agent_id=st.agent_id,
            agent_info=st.agent_info,
        ),
    )
    _after_back(st, ex, set(), now)


def on_reregister(st: AgentState, peer: str, msg: ReregisterExecutor, now: float) -> None:
    """REREGISTER_EXECUTOR from a RECOVERING executor: take it back with its updates."""
    ex = st.executors[(msg.framework_id, msg.executor_id)]
    if ex.recovered_from is ExecutorState.LAUNCHING:
        # It never registered with us: this is someone else's executor process.
        st.to_executor(
            peer, ShutdownExecutor(framework_id=msg.framework_id, executor_id=msg.executor_id)
        )
        return
    if _claimed_by_other(st, peer, ex):
        return
    _back(st, peer, ex, now)
    assert st.agent_id is not None
    st.to_executor(peer, ExecutorReregistered(agent_id=st.agent_id, agent_info=st.agent_info))
    for update in msg.updates:
        tasks.on_executor_update(st, ex, update, now)
    known = {t.task_id for t in msg.tasks} | {u.status.task_id for u in msg.updates}
    _after_back(st, ex, known, now)


def _claimed_by_other(st: AgentState, peer: str, ex: Executor) -> bool:
    claimed = st.executors_by_peer.get(peer)
    if claimed is not None and claimed != ex.key:
        st.to_executor(
            peer, ShutdownExecutor(framework_id=ex.framework_id, executor_id=ex.executor_id)
        )
        return True
    return False


def _back(st: AgentState, peer: str, ex: Executor, now: float) -> None:
    ex.state = ExecutorState.RUNNING
    ex.recovered_from = None
    ex.peer = peer
    st.executors_by_peer[peer] = ex.key
    st.touch(ex)


def _after_back(st: AgentState, ex: Executor, known: set[TaskID], now: float) -> None:
    """Lose the launched tasks it never received, hand over the queue, send the held kills."""
    fid = ex.framework_id
    for tid in sorted(ex.live):
        task = st.tasks.get((fid, tid))
        if (
            task is not None
            and task.launched
            and task.state is TaskState.STAGING
            and tid not in known
        ):
            status = st.agent_status(
                fid,
                tid,
                TaskState.LOST,
                Reason.AGENT_RESTARTED,
                now,
                executor_id=ex.executor_id,
                message=UNDELIVERED_MESSAGE,
            )
            st.report(fid, status, now)
    queued, ex.queued = ex.queued, []
    for launch in queued:
        executors.hand_over(st, ex, launch)
    kills, ex.pending_kills = ex.pending_kills, []
    assert ex.peer is not None
    for tid in kills:
        task = st.tasks.get((fid, tid))
        if task is not None and not is_final(task.state):
            kill_id = task.kill_id or ""
            st.to_executor(ex.peer, KillTask(framework_id=fid, task_id=tid, kill_id=kill_id))
    if ex.builtin and not ex.live and not ex.queued:
        ex.idle_since = now


# --- timers --------------------------------------------------------------------------------------


def tick_recovering(st: AgentState, now: float) -> None:
    timeout = st.config.executor_reregistration_timeout
    for ex in list(st.executors.values()):
        if ex.state is ExecutorState.RECOVERING and now - ex.launched_at >= timeout:
            message = f"Executor did not re-register within {timeout:g} seconds of agent recovery"
            _kill(st, ex, Reason.EXECUTOR_REREGISTRATION_TIMEOUT, message)
