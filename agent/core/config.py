"""The agent core's settings. Durations are in seconds; defaults suit one machine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agora.agent.core.run_as import TaskUsers
from agora.sdk.resources import Resources

__all__ = ["AgentConfig"]


@dataclass(frozen=True, slots=True)
class AgentConfig:
    hostname: str
    resources: Resources
    attributes: Mapping[str, str] = field(default_factory=dict)
    #: The agent's executor port, reported to the master in AgentInfo (0: unknown).
    port: int = 0
    #: The agent's HTTP API port and the host it is reached at, reported in AgentInfo
    #: (0 / "": no HTTP API).
    http_port: int = 0
    address: str = ""
    #: First retry delay of an unanswered (re-)registration, doubling up to the max. Each delay
    #: is spread over [delay/2, delay] by a hash of the hostname, so that many agents that lost
    #: the same master do not retry in lockstep.
    registration_backoff: float = 1.0
    registration_backoff_max: float = 10.0
    #: No PING from the master for this long: the master lost us (or we it), re-register.
    master_timeout: float = 75.0
    #: First resend of an unacknowledged status update, doubling up to the max (Mesos: 10 s
    #: doubling to 10 min; shorter here because a resend is cheap).
    status_update_retry: float = 1.0
    status_update_retry_max: float = 60.0
    #: A launched executor that has not registered after this long is killed (Mesos: 1 min).
    executor_registration_timeout: float = 60.0
    #: After an agent restart, a live executor that has not re-registered after this long is
    #: killed; its tasks end FAILED, reason EXECUTOR_REREGISTRATION_TIMEOUT (Mesos: 2 s).
    executor_reregistration_timeout: float = 10.0
    #: An executor told to shut down is SIGKILLed if still alive after this long (Mesos: 5 s).
    executor_shutdown_grace_period: float = 5.0
    #: The built-in command executor is shut down after this long without a live task.
    command_executor_idle_timeout: float = 10.0
    #: Whom tasks run as and whether root tasks are refused (--switch-user, --allow-root-tasks).
    task_users: TaskUsers = field(default_factory=TaskUsers)
    #: The GPUs (nvidia-smi indices) the agent hands to its tasks, each to one task at a time
    #: (see gpus.py). None: no GPU isolation, tasks' environments are left alone.
    gpus: tuple[int, ...] | None = None
