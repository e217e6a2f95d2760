"""Operator calls (CLI, console, scripts -> master) and the master's answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar

import msgspec
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages._record import MaxItems, Message, Range, Record, ShortStr, Timestamp
from agora.sdk.messages.common import MasterInfo
from agora.sdk.messages.container import ContainerUsage
from agora.sdk.messages.enums import Reason, TaskState
from agora.sdk.messages.maintenance import (
    CancelMaintenance,
    MaintenanceSummary,
    ScheduleMaintenance,
)
from agora.sdk.resources import Resources

__all__ = [
    "MESSAGES",
    "OPERATOR_CALLS",
    "AgentSummary",
    "DrainAgent",
    "FrameworkSummary",
    "GetState",
    "MarkAgentGone",
    "MasterMember",
    "OperatorDone",
    "OperatorKill",
    "ReactivateAgent",
    "ReserveResources",
    "RoleSummary",
    "RoleWeight",
    "StateReply",
    "TaskSummary",
    "TeardownFramework",
    "UnreserveResources",
    "UpdateQuota",
    "UpdateWeights",
]

_MANY = 1_000_000
_Weight = Annotated[float, Range(0.0001, 1_000_000.0)]


class AgentSummary(Record, frozen=True, kw_only=True):
    agent_id: AgentID
    hostname: ShortStr
    port: Annotated[int, Range(0, 65_535)] = 0
    #: The agent's HTTP API (``agora logs`` reads task files there) at ``address:http_port``;
    #: http_port 0: the agent serves no HTTP.
    http_port: Annotated[int, Range(0, 65_535)] = 0
    address: ShortStr = ""
    #: ACTIVE or UNREACHABLE.
    status: ShortStr
    resources: Resources
    #: What tasks, executors and outstanding offers hold of ``resources``.
    allocated: Resources = msgspec.field(default_factory=Resources)
    attributes: Mapping[str, str] = msgspec.field(default_factory=dict)
    #: An operator drained it: no new offers; its tasks run on until they end.
    draining: bool = False
    #: Its live tasks (staging, starting, running, killing).
    tasks: Annotated[int, Range(0, 1_000_000_000)] = 0
    #: Draining with no task or executor left: ready for maintenance.
    drained: bool = False
    #: When what still runs on the draining agent is killed (None: never).
    drain_deadline: Timestamp | None = None


class FrameworkSummary(Record, frozen=True, kw_only=True):
    framework_id: FrameworkID
    name: str
    roles: tuple[ShortStr, ...] = ()
    #: False once torn down or failed over past its timeout (then kept as a completed framework).
    active: bool = True
    connected: bool = True
    user: ShortStr = ""
    principal: ShortStr | None = None
    #: Its dominant share (DRF, weighted by its role), None when inactive.
    share: Annotated[float, Range(0)] | None = None
    #: Offers sent to it and not yet answered.
    offers: Annotated[int, Range(0, 1_000_000_000)] = 0
    #: Times a new scheduler connection took it over (re-subscribed) under this leader.
    failovers: Annotated[int, Range(0, 1_000_000_000)] = 0
    #: Its tasks running (or being killed), and staging (or starting).
    running: Annotated[int, Range(0, 1_000_000_000)] = 0
    staging: Annotated[int, Range(0, 1_000_000_000)] = 0


class RoleSummary(Record, frozen=True, kw_only=True):
    """A role the master knows (configured, weighted, with quota, or used by a framework)."""

    name: ShortStr
    weight: _Weight = 1.0
    #: Scalar quota guarantee and limit (None: no quota / no limit).
    guarantee: Resources | None = None
    limit: Resources | None = None
    #: Its dominant share of the cluster (weighted).
    share: Annotated[float, Range(0)] = 0.0


class TaskSummary(Record, frozen=True, kw_only=True):
    task_id: TaskID
    framework_id: FrameworkID
    agent_id: AgentID
    name: str = ""
    state: TaskState
    reason: Reason | None = None
    message: str = ""
    exit_code: int | None = None
    resources: Resources = msgspec.field(default_factory=Resources)
    timestamp: Timestamp = 0.0
    #: The latest usage of the task's container, as its agent reported it.
    usage: ContainerUsage | None = None


class GetState(Message, frozen=True, kw_only=True):
    """Ask for the master's state; the limits make it cheap on a big cluster (a console).

    With ``agents_limit``, at most that many agents: every one that is not ACTIVE or is draining
    first, then the busiest by allocated share (to the whole percent). With ``tasks_limit``, the
    tasks the master updated last (launched or given a status). A
    filter keeps the agents (id, hostname, status) or tasks (id, name, state, agent id) that
    contain its text, ignoring case, before the limit applies. Frameworks are always all there.
    """

    NAME: ClassVar[str] = "GET_STATE"
    agents_limit: Annotated[int, Range(0, _MANY)] | None = None
    tasks_limit: Annotated[int, Range(0, _MANY)] | None = None
    agents_filter: ShortStr = ""
    tasks_filter: ShortStr = ""


class MasterMember(Record, frozen=True, kw_only=True):
    """One master of the group as the leader sees it."""

    address: ShortStr
    #: "leader" or "standby".
    role: ShortStr
    #: The leader heard from it within an election timeout.
    reachable: bool = True
    #: Seconds since the leader last heard from it (0 for the leader itself; None: never).
    last_contact: Annotated[float, Range(0)] | None = None


class StateReply(Message, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "STATE"
    master_info: MasterInfo
    agents: Annotated[tuple[AgentSummary, ...], MaxItems(_MANY)] = ()
    frameworks: Annotated[tuple[FrameworkSummary, ...], MaxItems(_MANY)] = ()
    #: Live tasks, then the completed ones the master still remembers.
    tasks: Annotated[tuple[TaskSummary, ...], MaxItems(_MANY)] = ()
    #: The election group (empty from a master that runs without one).
    masters: Annotated[tuple[MasterMember, ...], MaxItems(16)] = ()
    roles: Annotated[tuple[RoleSummary, ...], MaxItems(_MANY)] = ()
    #: The cluster's name (the master's ``--cluster``).
    cluster: ShortStr = ""
    #: Wall-clock time this master became the leader.
    leader_since: Timestamp = 0.0
    #: True when GET_STATE's limits or filters left rows out; then the counts and sums below
    #: are of the whole cluster (they are left empty otherwise: sum the rows).
    partial: bool = False
    agents_total: Annotated[int, Range(0, _MANY)] = 0
    tasks_total: Annotated[int, Range(0, _MANY)] = 0
    #: Of ``agents_total``: unreachable ones, and active ones an operator drained.
    agents_unreachable: Annotated[int, Range(0, _MANY)] = 0
    agents_draining: Annotated[int, Range(0, _MANY)] = 0
    #: Scalars over every agent: their total, and what is allocated of it.
    resources_total: Resources = msgspec.field(default_factory=Resources)
    resources_allocated: Resources = msgspec.field(default_factory=Resources)
    #: The master runs without CURVE (``--insecure``): anyone who reaches it may register agents,
    #: subscribe frameworks and make operator calls. A STATE from a master older than this field
    #: decodes as False (a client older than it ignores the field).
    insecure: bool = False
    #: Maintenance windows, one per host, with the frameworks' answers to their inverse offers.
    maintenance: Annotated[tuple[MaintenanceSummary, ...], MaxItems(_MANY)] = ()


class OperatorKill(Message, frozen=True, kw_only=True):
    """Kill a task as if its framework had asked; ``framework_id`` disambiguates a shared id."""

    NAME: ClassVar[str] = "OPERATOR_KILL"
    task_id: TaskID
    framework_id: FrameworkID | None = None


class RoleWeight(Record, frozen=True, kw_only=True):
    role: ShortStr
    weight: _Weight


class UpdateWeights(Message, frozen=True, kw_only=True):
    """Set the DRF weight of each role named (kept in the registry, so a new leader keeps it)."""

    NAME: ClassVar[str] = "UPDATE_WEIGHTS"
    weights: Annotated[tuple[RoleWeight, ...], MaxItems(1024)]


class UpdateQuota(Message, frozen=True, kw_only=True):
    """Set a role's quota: a scalar guarantee and an optional limit. An empty guarantee and no
    limit remove it."""

    NAME: ClassVar[str] = "UPDATE_QUOTA"
    role: ShortStr
    guarantee: Resources = msgspec.field(default_factory=Resources)
    limit: Resources | None = None


class DrainAgent(Message, frozen=True, kw_only=True):
    """No new offers on the agent; its tasks run on until they end (Mesos: DRAIN_AGENT)."""

    NAME: ClassVar[str] = "DRAIN_AGENT"
    agent_id: AgentID
    #: Kill what still runs on the agent at this time (seconds since the epoch; reason
    #: AGENT_DRAINING). None: tasks run on until they end.
    deadline: Timestamp | None = None


class ReactivateAgent(Message, frozen=True, kw_only=True):
    """A drained agent gets offers again."""

    NAME: ClassVar[str] = "REACTIVATE_AGENT"
    agent_id: AgentID


class MarkAgentGone(Message, frozen=True, kw_only=True):
    """The agent is gone for good: its tasks are GONE_BY_OPERATOR (or LOST) and it may never
    come back under its id."""

    NAME: ClassVar[str] = "MARK_AGENT_GONE"
    agent_id: AgentID


class TeardownFramework(Message, frozen=True, kw_only=True):
    """Remove a framework on an operator's word: its offers go, its tasks are killed."""

    NAME: ClassVar[str] = "TEARDOWN_FRAMEWORK"
    framework_id: FrameworkID


class ReserveResources(Message, frozen=True, kw_only=True):
    """Reserve free unreserved resources of an agent to one role (``cpus(db):2;mem(db):1024``),
    as a framework's RESERVE would; the agent checkpoints it (Mesos: RESERVE_RESOURCES)."""

    NAME: ClassVar[str] = "RESERVE_RESOURCES"
    agent_id: AgentID
    resources: Resources


class UnreserveResources(Message, frozen=True, kw_only=True):
    """Give back resources dynamically reserved on an agent (never its static reservations)."""

    NAME: ClassVar[str] = "UNRESERVE_RESOURCES"
    agent_id: AgentID
    resources: Resources


class OperatorDone(Message, frozen=True, kw_only=True):
    """The master's answer to an operator call that took effect (a refusal is an ERROR)."""

    NAME: ClassVar[str] = "OPERATOR_DONE"
    #: The NAME of the call answered.
    call: ShortStr
    message: str = ""


#: Calls only an operator may make (the ACL's ``operators``).
OPERATOR_CALLS: tuple[type[Message], ...] = (
    OperatorKill,
    UpdateWeights,
    UpdateQuota,
    DrainAgent,
    ReactivateAgent,
    MarkAgentGone,
    TeardownFramework,
    ScheduleMaintenance,
    CancelMaintenance,
    ReserveResources,
    UnreserveResources,
)

MESSAGES: tuple[type[Message], ...] = (
    GetState,
    StateReply,
    OperatorDone,
    *(call for call in OPERATOR_CALLS if call.__module__ == __name__),
)
