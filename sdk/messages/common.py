"""Records shared by several messages: framework, agent and task descriptions, offers, gangs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, TypeAlias

import msgspec
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages._record import (
    DAY,
    MaxItems,
    MaxLen,
    Range,
    Record,
    Seconds,
    ShortStr,
    Timestamp,
    Uuid,
)
from agora.sdk.messages.container import URI, ContainerInfo, HealthCheck
from agora.sdk.messages.enums import (
    FrameworkCapability,
    Placement,
    Reason,
    StatusSource,
    TaskState,
)
from agora.sdk.resources import Resources

__all__ = [
    "AgentInfo",
    "AgentTask",
    "CommandInfo",
    "Create",
    "Destroy",
    "ExecutorInfo",
    "Filters",
    "FrameworkInfo",
    "GangRequest",
    "Launch",
    "LaunchGroup",
    "MasterInfo",
    "Offer",
    "Operation",
    "PersistentVolume",
    "ReconcileTask",
    "Reserve",
    "StatusUpdate",
    "TaskGroupInfo",
    "TaskInfo",
    "TaskStatus",
    "Unreserve",
]

_MAX_GANG = 10_000


#: Optional protocol features a peer says it understands (see ``agora.sdk.messages.batching``);
#: names it does not know are ignored, so neighbouring versions agree on what both have.
Features = Annotated[tuple[ShortStr, ...], MaxItems(32)]
#: Most items one batch message (UPDATES, ACKNOWLEDGEMENTS, STATUS_UPDATES, STATUS_UPDATE_ACKS)
#: carries.
MAX_BATCH_ITEMS: Final = 256


class MasterInfo(Record, frozen=True, kw_only=True):
    master_id: ShortStr
    address: ShortStr
    epoch: Annotated[int, Range(0, 2**63 - 1)]
    #: What this master understands beyond the base protocol.
    features: Features = ()


class FrameworkInfo(Record, frozen=True, kw_only=True):
    """Who a framework is, as it subscribes.

    ``name`` is shown to operators. ``user`` is the Unix user its tasks run as when a task
    names none (the master's ACL decides which users a principal may name). ``roles`` are the
    roles it is offered resources for (``"*"``: the default role). ``failover_timeout`` is how
    long, in seconds, the master keeps its tasks running after its scheduler disconnects (0:
    torn down at once); a scheduler that comes back within it subscribes again with its
    ``framework_id``. ``capabilities`` opt in to newer behaviour (``PARTITION_AWARE``: tasks on an
    unreachable agent become ``UNREACHABLE`` rather than ``LOST``; ``GANG``: gang requests).
    ``principal`` is filled in by the master from the CURVE key the scheduler connected with.
    ``checkpoint`` is kept for Mesos compatibility: agents here journal every task, whatever
    it says, and keep them across their own restarts.
    """

    name: str
    user: ShortStr = ""
    roles: Annotated[tuple[ShortStr, ...], MaxItems(1024)] = ("*",)
    failover_timeout: Seconds = 0.0
    capabilities: Annotated[tuple[FrameworkCapability, ...], MaxItems(64)] = ()
    principal: ShortStr | None = None
    hostname: ShortStr = ""
    framework_id: FrameworkID | None = None
    checkpoint: bool = False


class AgentInfo(Record, frozen=True, kw_only=True):
    hostname: ShortStr
    resources: Resources
    attributes: Mapping[str, str] = msgspec.field(default_factory=dict)
    port: Annotated[int, Range(0, 65_535)] = 0
    #: The agent's HTTP API (task sandbox files, /state) at ``address:http_port`` (0: none).
    http_port: Annotated[int, Range(0, 65_535)] = 0
    #: Host or address the agent's HTTP API is reached at ("": unknown).
    address: ShortStr = ""
    agent_id: AgentID | None = None


class CommandInfo(Record, frozen=True, kw_only=True):
    """What to run: ``value`` through the shell when ``shell``, else ``argv`` directly."""

    value: str | None = None
    argv: tuple[str, ...] = ()
    shell: bool = True
    environment: Mapping[str, str] = msgspec.field(default_factory=dict)
    user: ShortStr | None = None
    uris: Annotated[tuple[URI, ...], MaxItems(256)] = ()


class ExecutorInfo(Record, frozen=True, kw_only=True):
    executor_id: ExecutorID
    framework_id: FrameworkID
    command: CommandInfo
    resources: Resources = msgspec.field(default_factory=Resources)
    name: str = ""
    container: ContainerInfo | None = None
    #: The command speaks the Mesos v1 executor HTTP API (e.g. pymesos): the agent runs it
    #: through the Mesos executor bridge (``agora.agent.executors.mesos_bridge``).
    mesos: bool = False


class TaskInfo(Record, frozen=True, kw_only=True):
    task_id: TaskID
    name: str
    agent_id: AgentID
    resources: Resources
    command: CommandInfo | None = None
    executor: ExecutorInfo | None = None
    labels: Mapping[str, str] = msgspec.field(default_factory=dict)
    data: bytes = b""
    kill_grace_period: Seconds | None = None
    health_check: HealthCheck | None = None
    container: ContainerInfo | None = None


class TaskGroupInfo(Record, frozen=True, kw_only=True):
    tasks: tuple[TaskInfo, ...]


class TaskStatus(Record, frozen=True, kw_only=True):
    """One state a task reached, as its framework is told in ``status_update``.

    ``state`` is the task's state (``is_terminal(state)``: it will not change again);
    ``source`` says who decided it (the executor, the agent or the master) and ``reason``,
    when set, why, with ``message`` in words. ``uuid`` is set on updates that must be
    acknowledged (the driver does it after the callback returns, unless implicit
    acknowledgements are off); answers to reconciliation carry none. ``healthy`` is the latest
    health check result, ``data`` opaque bytes from the executor, ``exit_code`` the command's
    exit status on a terminal update (128+N when killed by signal N), and ``cpu_seconds`` and
    ``max_rss_bytes`` what the task used, when measured.
    """

    task_id: TaskID
    state: TaskState
    source: StatusSource
    reason: Reason | None = None
    message: str = ""
    agent_id: AgentID | None = None
    executor_id: ExecutorID | None = None
    uuid: Uuid | None = None
    healthy: bool | None = None
    timestamp: Timestamp = 0.0
    unreachable_time: Timestamp | None = None
    data: bytes = b""
    #: The command's exit status when it ended, as a shell gives it: 128+N when killed by
    #: signal N (older agents sent -N).
    exit_code: Annotated[int, Range(-255, 255)] | None = None
    #: On a terminal update, the task's CPU time (user + system, seconds) and peak memory: its
    #: container's cgroup totals, else the rusage of its process. None: not measured.
    cpu_seconds: Annotated[float, Range(0, 1e15)] | None = None
    max_rss_bytes: Annotated[int, Range(0, 2**63 - 1)] | None = None


class Filters(Record, frozen=True, kw_only=True):
    refuse_seconds: Annotated[float, Range(0, 365 * DAY)] = 5.0


class Offer(Record, frozen=True, kw_only=True):
    """Resources of one agent offered to one framework in one role.

    Launch on it (``driver.launch(offer, [TaskSpec(...)])``), or decline it; while the
    framework holds it, no other framework is offered those resources. ``hostname`` and
    ``attributes`` describe the agent; ``gang_id`` is set when the offer is part of a gang
    offer, which is accepted or declined whole. An offer can be rescinded
    (``offer_rescinded``) once its agent is lost or its framework disconnects.
    """

    offer_id: OfferID
    framework_id: FrameworkID
    agent_id: AgentID
    hostname: ShortStr
    role: ShortStr
    resources: Resources
    attributes: Mapping[str, str] = msgspec.field(default_factory=dict)
    gang_id: GangID | None = None
    #: Lent from another role's unused guarantee (only to frameworks with the
    #: REVOCABLE_RESOURCES capability): tasks launched on it may be killed, reason
    #: RESOURCES_REVOKED, when the owner needs it back.
    revocable: bool = False


class GangRequest(Record, frozen=True, kw_only=True):
    """``count`` slots of ``shape`` for ``role``, held together for at most ``hold_timeout`` s.

    ``max_per_agent``: 0 = no cap; > 0 = at most this many slots on one agent.
    """

    gang_id: GangID
    role: ShortStr
    count: Annotated[int, Range(1, _MAX_GANG)]
    shape: Resources
    placement: Placement = Placement.DISTINCT
    hold_timeout: Annotated[float, Range(0, 365 * DAY, lo_open=True)] = 60.0
    max_per_agent: Annotated[int, Range(0, _MAX_GANG)] = 0


class ReconcileTask(Record, frozen=True, kw_only=True):
    task_id: TaskID
    agent_id: AgentID | None = None


# Operations of an ACCEPT. On the wire each is a map whose "type" key holds the class's TYPE.


class Launch(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "LAUNCH"
    task_infos: tuple[TaskInfo, ...]


class LaunchGroup(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "LAUNCH_GROUP"
    executor: ExecutorInfo
    task_group: TaskGroupInfo


class Reserve(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "RESERVE"
    resources: Resources


class Unreserve(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "UNRESERVE"
    resources: Resources


class PersistentVolume(Record, frozen=True, kw_only=True):
    """A persistent volume: ``disk`` MB of disk reserved to ``role`` that outlives the tasks
    using it. In resources it shows as the set item ``volumes(role):{volume_id}``; a task that
    holds it finds its data at ``volumes/<volume_id>`` in its sandbox. Its id is unique per agent
    and role."""

    volume_id: Annotated[str, MaxLen(64)]
    role: ShortStr
    disk: Annotated[float, Range(0.0, 1e12, lo_open=True)]


class Create(Record, frozen=True, kw_only=True):
    """Make persistent volumes out of disk reserved to the offer's role (Mesos: CREATE)."""

    TYPE: ClassVar[str] = "CREATE"
    volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(64)]


class Destroy(Record, frozen=True, kw_only=True):
    """Delete persistent volumes (their data too) and give their disk back to the role."""

    TYPE: ClassVar[str] = "DESTROY"
    volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(64)]


Operation: TypeAlias = Launch | LaunchGroup | Reserve | Unreserve | Create | Destroy


class StatusUpdate(Record, frozen=True, kw_only=True):
    """A task status on its way to the framework; ``latest_state`` is the newest queued state."""

    framework_id: FrameworkID
    status: TaskStatus
    latest_state: TaskState | None = None


class AgentTask(Record, frozen=True, kw_only=True):
    """A task as an agent reports it when re-registering."""

    task: TaskInfo
    framework_id: FrameworkID
    state: TaskState
    status_uuid: Uuid | None = None
    #: The role the task's resources were allocated to (the offer's role).
    role: ShortStr = "*"
    #: The state of the update at the head of the task's stream, the one not acknowledged yet
    #: (None: nothing pending, or an older agent). A master that learns the task from this
    #: report answers reconciliation with it, never with a ``state`` the stream has not
    #: delivered yet (Mesos: ``status_update_state``).
    status_state: TaskState | None = None
