"""The registry's operations: each committed log entry carries exactly one of these.

An operation is a frozen record, encoded with the SDK codec inside a :class:`RegistryEntry`, so a
log written by one master version is read back with the same bounds and checks as any message.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, TypeAlias

from agora.sdk.codec import pack_record, unpack_record
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import MaxItems, Record, RoleWeight
from agora.sdk.messages._record import Seconds, ShortStr, Timestamp
from agora.sdk.resources import Resources

__all__ = [
    "AdmitAgent",
    "AgentEntry",
    "DrainAgent",
    "FrameworkEntry",
    "MaintenanceWindow",
    "MarkUnreachable",
    "Operation",
    "QuotaEntry",
    "ReadmitAgent",
    "RegistryEntry",
    "RemoveAgent",
    "RemoveFramework",
    "SetMaintenance",
    "SetQuota",
    "SetWeights",
    "UpsertFramework",
    "decode_operation",
    "encode_operation",
]


class AgentEntry(Record, frozen=True, kw_only=True):
    """An agent the cluster knows: admitted, unreachable since a time, and maybe draining."""

    agent_id: AgentID
    hostname: ShortStr
    unreachable_since: Timestamp | None = None
    draining: bool = False
    #: While draining: when what still runs there is killed (None: never).
    drain_deadline: Timestamp | None = None


class FrameworkEntry(Record, frozen=True, kw_only=True):
    framework_id: FrameworkID
    name: ShortStr = ""
    roles: Annotated[tuple[ShortStr, ...], MaxItems(1024)] = ()
    failover_timeout: Seconds = 0.0
    principal: ShortStr | None = None


class QuotaEntry(Record, frozen=True, kw_only=True):
    role: ShortStr
    guarantee: Resources
    limit: Resources | None = None


class MaintenanceWindow(Record, frozen=True, kw_only=True):
    """Planned downtime of a host: from ``start`` for ``duration`` seconds."""

    hostname: ShortStr
    start: Timestamp
    duration: Seconds


class AdmitAgent(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "ADMIT_AGENT"
    agent: AgentEntry


class ReadmitAgent(Record, frozen=True, kw_only=True):
    """An unreachable agent came back."""

    TYPE: ClassVar[str] = "READMIT_AGENT"
    agent_id: AgentID


class MarkUnreachable(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "MARK_UNREACHABLE"
    agent_id: AgentID
    time: Timestamp


class RemoveAgent(Record, frozen=True, kw_only=True):
    """The agent is gone for good (it unregistered, was garbage-collected or marked gone)."""

    TYPE: ClassVar[str] = "REMOVE_AGENT"
    agent_id: AgentID


class DrainAgent(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "DRAIN_AGENT"
    agent_id: AgentID
    draining: bool = True
    #: The drain's deadline (ignored when not draining).
    deadline: Timestamp | None = None


class UpsertFramework(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "UPSERT_FRAMEWORK"
    framework: FrameworkEntry


class RemoveFramework(Record, frozen=True, kw_only=True):
    TYPE: ClassVar[str] = "REMOVE_FRAMEWORK"
    framework_id: FrameworkID


class SetWeights(Record, frozen=True, kw_only=True):
    """Set the DRF weight of each role named (one operator call, one entry)."""

    TYPE: ClassVar[str] = "SET_WEIGHTS"
    weights: Annotated[tuple[RoleWeight, ...], MaxItems(1024)]


class SetQuota(Record, frozen=True, kw_only=True):
    """Set (or, with ``quota`` None, clear) a role's quota."""

    TYPE: ClassVar[str] = "SET_QUOTA"
    role: ShortStr
    quota: QuotaEntry | None = None


class SetMaintenance(Record, frozen=True, kw_only=True):
    """Set (or, with ``window`` None, clear) a host's maintenance window."""

    TYPE: ClassVar[str] = "SET_MAINTENANCE"
    hostname: ShortStr
    window: MaintenanceWindow | None = None


Operation: TypeAlias = (
    AdmitAgent
    | ReadmitAgent
    | MarkUnreachable
    | RemoveAgent
    | DrainAgent
    | UpsertFramework
    | RemoveFramework
    | SetWeights
    | SetQuota
    | SetMaintenance
)


class RegistryEntry(Record, frozen=True, kw_only=True):
    """What one log entry holds."""

    op: Operation


def encode_operation(op: Operation) -> bytes:
    return pack_record(RegistryEntry(op=op))


def decode_operation(data: bytes) -> Operation:
    """The operation in a log entry; raises ProtocolError for anything else."""
    return unpack_record(RegistryEntry, data).op
