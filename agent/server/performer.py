"""Carrying out what the agent core said: its actions, performed in the order it gave them.

Messages to the master and to executors are queued on the outbox; a PONG carries the containers'
usage (:mod:`agora.agent.server.containment`) and the sandboxes' disk usage. The core has already
put each task's GPUs in its launch; a custom executor's container is resized as the core says
(``ResizeExecutor``), and a task left without the GPUs it asked for is logged.
Executors are launched and signalled in place. An executor refused for a wrong secret is
counted and logged, a few a second per peer (the rest summarised on the tick).
A launch that fails is handed back to the caller, to be reported to the core once the whole batch
is out, so that what the core said first also goes out first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog
from agora.agent.core import (
    CreateVolume,
    DestroyVolume,
    ExecutorRefused,
    GpusUnavailable,
    LaunchExecutor,
    LinkVolumes,
    ResizeExecutor,
    SignalExecutor,
    Terminate,
    ToExecutor,
    ToMaster,
)
from agora.agent.server import volumes
from agora.agent.server.containment import AgentContainment
from agora.agent.server.disk_du import DiskIsolator
from agora.agent.server.history import AgentHistory
from agora.agent.server.launcher import ExecutorLauncher
from agora.agent.server.outbox import AgentOutbox
from agora.agent.server.processes import ExecutorProcesses
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import ContainerUsage, KillTask, Pong, Reason, StatusUpdateMessage

__all__ = ["ActionPerformer", "LaunchFailure"]

log = structlog.get_logger(__name__)

#: An executor that could not be started: (framework id, executor id, why).
LaunchFailure = tuple[FrameworkID, ExecutorID, str]


class ActionPerformer:
    """Performs the core's actions; ``terminate(reason)`` is called when the master ends this
    agent (TERMINATE)."""

    def __init__(
        self,
        *,
        outbox: AgentOutbox,
        containment: AgentContainment,
        disk: DiskIsolator,
        history: AgentHistory,
        launcher: ExecutorLauncher,
        processes: ExecutorProcesses,
        terminate: Callable[[str], None],
    ) -> None:
        self._outbox = outbox
        self._containment = containment
        self._disk = disk
        self._history = history
        self._launcher = launcher
        self._processes = processes
        self._terminate = terminate
        #: Registrations refused for a missing or wrong executor secret.
        self.executor_auth_refused = 0
        #: Executor messages refused for a wrong secret (a stranger's flood): a few warnings a
        #: second per peer, the rest counted and summarised.
        self._refusal_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)
        #: The container usage sampled for the latest PONG (empty: none, or no containers).
        self.latest_usage: tuple[ContainerUsage, ...] = ()

    def summarise(self, now: float) -> None:
        """Log how many refusal warnings were held back (``now``: monotonic seconds)."""
        refused = self._refusal_log.summary(now)
        if refused is not None:
            log.warning("executor_auth_refusals_suppressed", **refused.log_fields())

    def perform(self, actions: Iterable[object]) -> list[LaunchFailure]:
        """Perform ``actions`` in order; the launches that failed, to be told to the core."""
        failed: list[LaunchFailure] = []
        for action in actions:
            if isinstance(action, ToMaster):
                if self._history.enabled:
                    self._history.to_master(action.message)
                message = self._containment.to_master(action.message)
                if isinstance(message, Pong):
                    message = Pong(usage=self._disk.annotate(message.usage))
                    self.latest_usage = message.usage
                elif (
                    isinstance(message, StatusUpdateMessage)
                    and message.update.status.reason is Reason.TASK_UNAUTHORIZED
                ):
                    log.warning(
                        "task_unauthorized",
                        framework_id=message.update.framework_id,
                        task_id=message.update.status.task_id,
                        reason=message.update.status.message,
                    )
                self._outbox.put(None, message)
            elif isinstance(action, ToExecutor):
                message = action.message
                if isinstance(message, KillTask):
                    log.info(
                        "kill_forwarded",
                        task_id=message.task_id,
                        kill_id=message.kill_id,
                        peer=action.peer,
                    )
                self._outbox.put(action.peer, message)
            elif isinstance(action, LaunchExecutor):
                error = self._launcher.launch(action)
                if error is not None:
                    failed.append((action.framework_id, action.executor_id, error))
            elif isinstance(action, SignalExecutor):
                try:
                    self._processes.signal(action.framework_id, action.executor_id, action.kill)
                except OSError as exc:
                    log.warning("executor_signal_failed", error=str(exc))
            elif isinstance(action, ExecutorRefused):
                self.executor_auth_refused += 1
                if self._refusal_log.allow(action.peer, time.monotonic()):
                    log.warning(
                        "executor_auth_refused",
                        framework_id=action.framework_id,
                        executor_id=action.executor_id,
                        peer=action.peer,
                        reason=action.reason,
                    )
            elif isinstance(action, ResizeExecutor):
                self._containment.resize(action.framework_id, action.executor_id, action.resources)
            elif isinstance(action, GpusUnavailable):
                log.error("gpu_assignment_failed", task_id=action.task_id, error=action.error)
            elif isinstance(action, CreateVolume | DestroyVolume):
                self._volume(action)
            elif isinstance(action, LinkVolumes):
                self._launcher.link_volumes(action)
            elif isinstance(action, Terminate):
                log.warning("agent_terminated_by_master", reason=action.reason)
                self._terminate(action.reason)
            else:
                log.error("unknown_action", action=repr(action))
        return failed

    def _volume(self, action: CreateVolume | DestroyVolume) -> None:
        """A persistent volume's directory (volumes.py); a failure is logged, the agent goes on."""
        try:
            if isinstance(action, CreateVolume):
                volumes.create(self._launcher.work_dir, action.role, action.volume_id)
            else:
                volumes.destroy(self._launcher.work_dir, action.role, action.volume_id)
        except (OSError, ValueError) as exc:
            log.error("volume_failed", role=action.role, volume_id=action.volume_id, error=str(exc))
