"""What the agent core asks its shell to do. The core never performs I/O itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import ExecutorInfo, Message
from agora.sdk.resources import Resources

__all__ = [
    "Action",
    "CreateVolume",
    "DestroyVolume",
    "ExecutorRefused",
    "GpusUnavailable",
    "LaunchExecutor",
    "LinkVolumes",
    "ResizeExecutor",
    "SignalExecutor",
    "Terminate",
    "ToExecutor",
    "ToMaster",
]


@dataclass(frozen=True, slots=True)
class ToMaster:
    """Send ``message`` on the master link (epoch 0: an agent is not a master)."""

    message: Message


@dataclass(frozen=True, slots=True)
class ToExecutor:
    """Send ``message`` to the executor connected as ``peer`` on the executor socket."""

    peer: str
    message: Message


@dataclass(frozen=True, slots=True)
class LaunchExecutor:
    """Start an executor process.

    ``sandbox`` is relative to the agent's work dir (``frameworks/<fid>/executors/<eid>``); the
    shell creates it, makes it the cwd and sends the process's stdout/stderr to
    ``executor.stdout``/``executor.stderr`` in it. ``builtin`` means the built-in command executor
    (``python -m agora.agent.executors.command``); otherwise run ``info.command``.

    ``environment`` holds the executor's own ``CommandInfo.environment`` overlaid with what the
    core knows: AGORA_FRAMEWORK_ID, AGORA_EXECUTOR_ID, AGORA_AGENT_ID,
    AGORA_SHUTDOWN_GRACE_PERIOD and AGORA_EXECUTOR_SECRET (never log it). The shell adds what
    only it knows: AGORA_AGENT_ENDPOINT, AGORA_SANDBOX (absolute) and AGORA_RECOVERY_TIMEOUT, on
    top of its base environment.
    ``user`` is the user to run as (None: the agent's own).
    ``resources`` is what a container of the executor's own must hold: its resources plus those
    of its tasks that are not over (the shell ignores it when it does not contain the executor).

    The shell must answer every LaunchExecutor with exactly one of ``Agent.executor_exited``
    (when the process ends) or ``Agent.executor_launch_failed`` (when it could not start).
    """

    framework_id: FrameworkID
    executor_id: ExecutorID
    info: ExecutorInfo
    builtin: bool
    sandbox: str
    environment: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    resources: Resources = field(default_factory=Resources)


@dataclass(frozen=True, slots=True)
class ResizeExecutor:
    """A custom executor's tasks changed (one was handed to it, or one ended): a container of
    its own must now hold ``resources`` (its resources plus its tasks' that are not over). It
    comes before the launch message that made it grow. The shell ignores it for an executor it
    does not contain."""

    framework_id: FrameworkID
    executor_id: ExecutorID
    resources: Resources


@dataclass(frozen=True, slots=True)
class GpusUnavailable:
    """A task asked for GPUs the agent does not have free (``error`` says how many): it was
    handed to its executor with none. The shell logs it as an error."""

    framework_id: FrameworkID
    task_id: TaskID
    error: str


@dataclass(frozen=True, slots=True)
class SignalExecutor:
    """Signal the executor's process group: SIGTERM (``kill=False``) or SIGKILL (``kill=True``).

    The executor's process may already be gone; the shell ignores the action then."""

    framework_id: FrameworkID
    executor_id: ExecutorID
    kill: bool


@dataclass(frozen=True, slots=True)
class Terminate:
    """The master told the agent to shut down. Every executor has been told to shut down (or
    signalled) already; the shell waits up to the shutdown grace period for them to exit, SIGKILLs
    the rest, and exits. The core ignores every stimulus after this."""

    reason: str


@dataclass(frozen=True, slots=True)
class ExecutorRefused:
    """A REGISTER/REREGISTER_EXECUTOR from ``peer`` claimed an executor without its secret
    (``reason``: "missing secret" or "wrong secret"); it changed nothing. The shell logs it."""

    framework_id: FrameworkID
    executor_id: ExecutorID
    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class CreateVolume:
    """Make the directory of the persistent volume ``volume_id`` of ``role`` (keep it if it
    exists): ``<work-dir>/volumes/roles/<role>/<volume_id>``, never keyed by the agent id."""

    role: str
    volume_id: str


@dataclass(frozen=True, slots=True)
class DestroyVolume:
    """Delete the persistent volume's directory and all its data."""

    role: str
    volume_id: str


@dataclass(frozen=True, slots=True)
class LinkVolumes:
    """Make the persistent volumes ``resources`` hold (``volumes(role):{id}``) appear at
    ``volumes/<id>`` in ``sandbox`` (relative to the work dir; created if missing), owned by
    ``user`` when tasks run as another user. Comes before the launch that uses them."""

    sandbox: str
    resources: Resources
    user: str | None = None


Action = (
    ToMaster
    | ToExecutor
    | LaunchExecutor
    | SignalExecutor
    | Terminate
    | ExecutorRefused
    | ResizeExecutor
    | GpusUnavailable
    | CreateVolume
    | DestroyVolume
    | LinkVolumes
)
