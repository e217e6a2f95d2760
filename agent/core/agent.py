"""The agent core: every stimulus in, the actions it causes out.

``Agent`` is the only public entry point. The daemon (agora.agent.server) feeds it decoded
messages from the master link (with the frame's epoch) and from the executor socket (with the
sender's peer name), reports the master link going up and down and executor processes ending,
calls ``tick`` regularly (every 0.1 s or so), and performs the returned actions in order:

* ``ToMaster(message)``: send on the master link, epoch 0;
* ``ToExecutor(peer, message)``: send on the executor socket to ``peer`` (a gone peer: drop);
* ``LaunchExecutor(...)``: start the process; later call ``executor_exited`` or, if it could not
  start, ``executor_launch_failed`` (exactly one of them per LaunchExecutor);
* ``SignalExecutor(fid, eid, kill)``: SIGTERM / SIGKILL its process group (gone: ignore);
* ``Terminate(reason)``: see its docstring; the core is inert afterwards;
* ``ExecutorRefused(fid, eid, peer, reason)``: a registration without the executor's secret was
  refused (log it as a warning; nothing changed);
* ``ResizeExecutor(fid, eid, resources)``: a custom executor's container must now hold
  ``resources`` (``LaunchExecutor.resources`` gives its first size);
* ``GpusUnavailable(fid, tid, error)``: a task got fewer GPUs than it asked for (log an error).

GPUs: given the agent's GPUs in ``AgentConfig.gpus``, the core assigns each task its own in the
launch it hands to the executor, and checkpoints them with the task (see gpus.py).

Shells read the state through the read functions below (``task``, ``tasks``, ``executor``,
``tasks_of``, ...), never by reaching into ``state``.

``now`` is any clock that only moves forward (all timers are relative); the core stamps the
statuses it generates with it, so the daemon should pass wall-clock ``time.time()``.
Nothing here does I/O, reads a clock or draws random numbers, except the executor secrets drawn
from the injected ``new_secret`` (executor_auth.py).

Checkpointing (write-ahead): after every stimulus (or burst of stimuli), and before performing
any of the actions they returned, the daemon calls ``checkpoint()``, writes the records it
returns into its journal (``Put`` -> put, ``Delete`` -> delete), commits (fsync), and only then
performs the actions. That order is what makes recovery sound: no StatusUpdateAck reaches an
executor (which then forgets the update) and no launch or registration reply goes out before
the state that caused it is durable. After a restart, the daemon builds a fresh ``Agent``, calls
``recover(journal.load(), now, alive=..., cleanup=...)`` before anything else (then checkpoints
and performs its actions, as after any stimulus), and connects to the master (``connected``
re-registers with the recovered agent id). See recovery.py for what happens to each executor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set
from types import MappingProxyType
from typing import Any

from agora.agent.core import (
    checkpoint,
    executor_auth,
    executors,
    exits,
    limits,
    recovery,
    registration,
    reservations,
    sandbox_gc,
    tasks,
)
from agora.agent.core.actions import (
    Action,
    ExecutorRefused,
    LaunchExecutor,
    SignalExecutor,
    Terminate,
)
from agora.agent.core.checkpoint import Delete, Put
from agora.agent.core.config import AgentConfig
from agora.agent.core.state import (
    AgentState,
    Executor,
    ExecutorKey,
    ExecutorState,
    Framework,
    Task,
    TaskKey,
)
from agora.agent.core.status_updates import StatusUpdateManager
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    CheckpointResources,
    ExecutorToFramework,
    ExitedExecutorAck,
    FrameworkToExecutor,
    KillTask,
    Message,
    Ping,
    Reason,
    ReconcileTasks,
    RegisterExecutor,
    ReregisterExecutor,
    RetryRegistration,
    RunTask,
    RunTaskGroup,
    ShutdownAgent,
    ShutdownExecutor,
    ShutdownFramework,
    StatusUpdateAck,
    StatusUpdateMessage,
)
from agora.sdk.resources import Resources

__all__ = ["Agent"]

_Handler = Callable[[AgentState, Any, float], None]

#: What the master may ask of an agent that has an id (registered, or re-registering).
_WORK: dict[type[Any], _Handler] = {
    RunTask: tasks.on_run_task,
    RunTaskGroup: tasks.on_run_task_group,
    KillTask: tasks.on_kill_task,
    ReconcileTasks: tasks.on_reconcile_tasks,
    StatusUpdateAck: tasks.on_master_ack,
    ShutdownExecutor: executors.on_shutdown_executor,
    ShutdownFramework: executors.on_shutdown_framework,
    FrameworkToExecutor: lambda st, msg, _now: executors.on_framework_message(st, msg),
    ExitedExecutorAck: exits.on_ack,
    CheckpointResources: reservations.on_checkpoint_resources,
}


class Agent:
    """The agent's state machine (sans-IO)."""

    def __init__(
        self, config: AgentConfig, *, new_secret: Callable[[], str] = executor_auth.random_secret
    ) -> None:
        """``new_secret``: where each launched executor's secret comes from (see
        executor_auth.py); random by default, a deterministic simulation passes its own."""
        updates = StatusUpdateManager(config.status_update_retry, config.status_update_retry_max)
        self._st = AgentState(config=config, updates=updates, new_secret=new_secret)

    # --- views -----------------------------------------------------------------------------
    @property
    def state(self) -> AgentState:
        """Read-only view (agent_id, registered, frameworks, executors, tasks, and the pending
        updates in ``state.updates``) for introspection and tests; mutate only via stimuli."""
        return self._st

    @property
    def agent_id(self) -> AgentID | None:
        return self._st.agent_id

    @property
    def registered(self) -> bool:
        return self._st.registered

    @property
    def terminated(self) -> bool:
        return self._st.terminated

    @property
    def config(self) -> AgentConfig:
        return self._st.config

    @property
    def master_epoch(self) -> int:
        """The newest master epoch seen."""
        return self._st.master_epoch

    # --- read functions (the records they return are the core's: do not change them) -----
    def tasks(self) -> Mapping[TaskKey, Task]:
        """Every task the agent holds, by (framework id, task id): a read-only view."""
        return MappingProxyType(self._st.tasks)

    def task(self, framework_id: FrameworkID, task_id: TaskID) -> Task | None:
        return self._st.tasks.get((framework_id, task_id))

    def frameworks(self) -> Mapping[FrameworkID, Framework]:
        """Every framework with work on this agent: a read-only view."""
        return MappingProxyType(self._st.frameworks)

    def framework(self, framework_id: FrameworkID) -> Framework | None:
        return self._st.frameworks.get(framework_id)

    def executors(self) -> Mapping[ExecutorKey, Executor]:
        """Every executor the agent runs, by (framework id, executor id): a read-only view."""
        return MappingProxyType(self._st.executors)

    def executor(self, framework_id: FrameworkID, executor_id: ExecutorID) -> Executor | None:
        return self._st.executors.get((framework_id, executor_id))

    def live_sandboxes(self) -> frozenset[str]:
        """The sandboxes (relative to the work dir) the sandbox collector must leave alone."""
        return sandbox_gc.live_sandboxes(self._st)

    def tasks_of(self, framework_id: FrameworkID, executor_id: ExecutorID) -> list[Task]:
        """The executor's tasks the agent still holds (over or not), by task id."""
        ex = self._st.executors.get((framework_id, executor_id))
        if ex is None:
            return []
        found = (self._st.tasks.get((framework_id, tid)) for tid in sorted(ex.tasks))
        return [task for task in found if task is not None]

    def executor_size(self, framework_id: FrameworkID, executor_id: ExecutorID) -> Resources:
        """What a container of the executor's own holds now (nothing for an unknown one)."""
        ex = self._st.executors.get((framework_id, executor_id))
        return Resources() if ex is None else self._st.executor_size(ex)

    def unacknowledged_updates(self) -> int:
        """Status updates the master has not acknowledged yet."""
        return self._st.updates.unacknowledged()

    # --- checkpointing ---------------------------------------------------------------------
    def checkpoint(self) -> list[Put | Delete]:
        """The durable records changed since the last call (see checkpoint.py), to be written
        and committed before the actions of the stimuli since then are performed."""
        return checkpoint.collect(self._st)

    def durable_records(self) -> dict[tuple[str, str], bytes]:
        """Every durable record as of now: what all checkpoints so far add up to."""
        return checkpoint.everything(self._st)

    def recover(
        self,
        records: Mapping[tuple[str, str], bytes],
        now: float,
        *,
        alive: Set[ExecutorKey],
        cleanup: bool,
        legacy_gpus: Mapping[str, Sequence[int]] | None = None,
    ) -> list[Action]:
        """Take the state back from a checkpoint (the journal's records) after a restart, on a
        fresh Agent, before any other stimulus. ``alive``: the checkpointed executors whose
        process the shell found still running. ``cleanup``: kill them (``--recover=cleanup``)
        instead of waiting for them to re-register. Records of kinds the core does not write
        are ignored. Raises ``CheckpointError`` (a ValueError) for a record it cannot read.
        ``legacy_gpus``: the GPU assignments an older agent kept outside its checkpoint
        (``gpus.json``: ``"<fid>/<tid>"`` -> indices), taken by the live tasks that hold none."""
        st = self._st
        if st.agent_id is not None or st.tasks or st.executors or st.updates:
            raise RuntimeError("recover() must come first, on a fresh Agent")
        recovery.recover(st, records, now, alive, cleanup, legacy_gpus)
        return self._finish()

    # --- stimuli ---------------------------------------------------------------------------
    def connected(self, now: float) -> list[Action]:
        """The master link is up (first connect or reconnect): (re-)register now."""
        if not self._st.terminated:
            registration.start_registration(self._st, now)
        return self._finish()

    def disconnected(self, now: float) -> list[Action]:
        """The master link is down: unregistered (updates held), registration keeps retrying."""
        if not self._st.terminated:
            registration.lost_master(self._st, now)
        return self._finish()

    def from_master(self, message: Message, epoch: int, now: float) -> list[Action]:
        """One decoded message from the master link, with the epoch of its frame. Messages of
        an older epoch than the newest seen are dropped (a deposed master acts on nothing)."""
        st = self._st
        if st.terminated or epoch < st.master_epoch:
            return self._finish()
        if epoch > st.master_epoch:
            st.master_epoch = epoch
            st.dirty_agent = True  # checkpointed (fsync) before anything it says is acted on
        if isinstance(message, AgentRegistered):
            registration.on_registered(st, message, epoch, now)
            return self._finish()
        if isinstance(message, AgentReregistered):
            registration.on_reregistered(st, message, epoch, now)
            return self._finish()
        if isinstance(message, RetryRegistration):
            registration.on_retry(st, message, now)
            return self._finish()
        if st.registered and epoch > st.registered_epoch:
            # A newer master than the one that accepted us: it may not know us yet.
            registration.start_registration(st, now)
        if isinstance(message, Ping):
            registration.on_ping(st, message, now)
        elif isinstance(message, ShutdownAgent):
            self._shutdown_agent(message.message or "the master shut this agent down")
        elif st.agent_id is not None and type(message) in _WORK:
            # Work needs an agent id; before the master gave us one, nothing means anything.
            _WORK[type(message)](st, message, now)
        # Anything else (ERROR, messages meant for others) changes nothing.
        return self._finish()

    def from_executor(self, peer: str, message: Message, now: float) -> list[Action]:
        """One decoded message from an executor connected as ``peer``."""
        st = self._st
        if st.terminated or st.agent_id is None:
            return self._finish()
        if isinstance(message, RegisterExecutor | ReregisterExecutor):
            known = st.executors.get((message.framework_id, message.executor_id))
            refused = executor_auth.refusal(known, message.secret)
            if refused is not None:  # not the process we launched: nothing changes
                st.outbox.append(
                    ExecutorRefused(message.framework_id, message.executor_id, peer, refused)
                )
                return self._finish()
            recovering = known is not None and known.state is ExecutorState.RECOVERING
        if isinstance(message, RegisterExecutor):
            if recovering:
                recovery.on_register(st, peer, message, now)
            else:
                executors.on_register(st, peer, message, now)
        elif isinstance(message, ReregisterExecutor):
            if recovering:
                recovery.on_reregister(st, peer, message, now)
                return self._finish()
            ex = executors.on_reregister(st, peer, message, now)
            if ex is not None:
                for update in message.updates:
                    tasks.on_executor_update(st, ex, update, now)
                executors.resend_kills(st, ex)
        else:
            key = st.executors_by_peer.get(peer)
            ex = st.executors.get(key) if key is not None else None
            if ex is None or ex.state in (ExecutorState.LAUNCHING, ExecutorState.RECOVERING):
                return self._finish()  # not a registered executor: ignored
            if isinstance(message, StatusUpdateMessage):
                tasks.on_executor_update(st, ex, message.update, now)
            elif isinstance(message, ExecutorToFramework):
                executors.on_executor_message(st, ex, message)
        return self._finish()

    def executor_exited(
        self,
        framework_id: FrameworkID,
        executor_id: ExecutorID,
        status: int | None,
        now: float,
        limitation: tuple[Reason, str] | None = None,
    ) -> list[Action]:
        """An executor process ended; ``status`` is its return code (negative: -signal), or None
        when the shell cannot know it (an executor re-attached after a restart is not its child:
        the shell sees its pid vanish); the master then hears status -1.

        Its tasks that are not over end TASK_FAILED (TASK_KILLED if it was being shut down on
        request), reason EXECUTOR_TERMINATED; the master hears EXITED_EXECUTOR. Tasks that
        arrived while it was terminating go to a fresh executor (a new LaunchExecutor).
        ``limitation``: the executor's container hit a limit (e.g. its memory): its tasks end
        TASK_FAILED with that reason and message instead."""
        if not self._st.terminated:
            executors.on_exited(
                self._st, framework_id, executor_id, status, now, limitation=limitation
            )
        return self._finish()

    def executor_launch_failed(
        self, framework_id: FrameworkID, executor_id: ExecutorID, error: str, now: float
    ) -> list[Action]:
        """An executor process could not be started. Its tasks end TASK_FAILED, reason
        CONTAINER_LAUNCH_FAILED; the master hears EXITED_EXECUTOR with status 127."""
        if not self._st.terminated:
            executors.on_launch_failed(self._st, framework_id, executor_id, error, now)
        return self._finish()

    def disk_targets(self) -> list[limits.DiskTarget]:
        """The containers whose sandbox the shell's disk isolator should measure now."""
        return [] if self._st.terminated else limits.disk_targets(self._st)

    def disk_usage(self, used: Mapping[limits.DiskKey, int], now: float) -> list[Action]:
        """The disk isolator measured these sandboxes (bytes, by ``DiskTarget.key``): every
        container over its ``disk`` is killed, its tasks to end TASK_FAILED with reason
        CONTAINER_LIMITATION_DISK (see limits.py)."""
        if not self._st.terminated and self._st.agent_id is not None:
            limits.enforce_disk(self._st, used, now)
        return self._finish()

    def tick(self, now: float) -> list[Action]:
        """Timers: registration retries and the master timeout, status-update resends,
        executor registration timeouts, shutdown grace periods, idle command executors."""
        st = self._st
        if not st.terminated:
            registration.tick_registration(st, now)
            st.updates.tick(now)
            st.flush_updates()
            executors.tick_executors(st, now)
            exits.tick_exits(st, now)
            recovery.tick_recovering(st, now)
        return self._finish()

    # --- internals -------------------------------------------------------------------------
    def _shutdown_agent(self, reason: str) -> None:
        """Tell every executor to shut down (SIGTERM those not registered), then Terminate."""
        st = self._st
        for ex in list(st.executors.values()):
            if ex.state is ExecutorState.RUNNING and ex.peer is not None:
                st.to_executor(
                    ex.peer,
                    ShutdownExecutor(framework_id=ex.framework_id, executor_id=ex.executor_id),
                )
            elif ex.state in (ExecutorState.LAUNCHING, ExecutorState.RECOVERING):
                st.outbox.append(SignalExecutor(ex.framework_id, ex.executor_id, kill=False))
        st.outbox.append(Terminate(reason))
        st.terminated = True
        st.updates.pause()

    def _finish(self) -> list[Action]:
        st = self._st
        st.flush_updates()
        out, st.outbox = st.outbox, []
        # An executor's first size counts the tasks queued for it by the end of the stimulus.
        return [self._sized(action) for action in out]

    def _sized(self, action: Action) -> Action:
        if not isinstance(action, LaunchExecutor) or action.builtin:
            return action
        ex = self._st.executors.get((action.framework_id, action.executor_id))
        size = action.info.resources if ex is None else self._st.executor_size(ex)
        return dataclasses.replace(action, resources=size)
