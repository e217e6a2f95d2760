"""agora.sdk.messages: enums, records, registry and schemas, as the contract states them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, ClassVar, get_args

import agora.sdk.messages as messages
import msgspec
import pytest
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    MESSAGE_TYPES,
    TERMINAL_STATES,
    Accept,
    CommandInfo,
    Create,
    Decline,
    Destroy,
    ErrorCode,
    ExecutorInfo,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    GangRequest,
    Launch,
    LaunchGroup,
    MaxItems,
    MaxLen,
    Message,
    Operation,
    Placement,
    Range,
    Reason,
    Record,
    Reserve,
    StatusSource,
    TaskState,
    Unreserve,
    is_terminal,
)
from agora.sdk.messages._record import build_registry
from agora.sdk.messages._schema import (
    BytesKind,
    FloatKind,
    IntKind,
    OptionalKind,
    StrKind,
    TupleKind,
    UnionKind,
    record_schema,
    variant_tag,
)
from agora.sdk.resources import Resources

# Field names per message, copied from the contract (/tmp/spec/messages.md). The master, agent and
# drivers are written against these names: a rename must fail here first.
SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    "SUBSCRIBE": ("framework_info", "suppressed_roles", "features"),
    "TEARDOWN": ("framework_id",),
    "ACCEPT": ("framework_id", "offer_ids", "operations", "filters"),
    "DECLINE": ("framework_id", "offer_ids", "filters"),
    "REVIVE": ("framework_id", "roles"),
    "SUPPRESS": ("framework_id", "roles"),
    "KILL": ("framework_id", "task_id", "agent_id", "kill_id"),
    "SHUTDOWN": ("framework_id", "executor_id", "agent_id"),
    "ACKNOWLEDGE": ("framework_id", "agent_id", "task_id", "uuid"),
    "ACKNOWLEDGEMENTS": ("acks",),
    "RECONCILE": ("framework_id", "tasks"),
    "MESSAGE": ("framework_id", "agent_id", "executor_id", "data"),
    "REQUEST": ("framework_id", "gangs"),
    "SUBSCRIBED": ("framework_id", "heartbeat_interval_seconds", "master_info"),
    "OFFERS": ("offers",),
    "RESCIND": ("offer_id",),
    "UPDATE": ("status",),
    "UPDATES": ("statuses",),
    "FRAMEWORK_MESSAGE": ("agent_id", "executor_id", "data"),
    "FAILURE": ("agent_id", "executor_id", "status"),
    "ERROR": ("message", "code"),
    "HEARTBEAT": (),
    "GANG_EXPIRED": ("gang_id", "message"),
    "REGISTER_AGENT": (
        "agent_info",
        "version",
        "features",
        "checkpointed_resources",
        "checkpointed_volumes",
    ),
    "REREGISTER_AGENT": (
        "agent_id",
        "agent_info",
        "tasks",
        "executors",
        "frameworks",
        "features",
        "checkpointed_resources",
        "checkpointed_volumes",
    ),
    "CHECKPOINT_RESOURCES": ("resources", "volumes"),
    "AGENT_REGISTERED": ("agent_id", "master_info"),
    "AGENT_REREGISTERED": ("agent_id", "master_info"),
    "RETRY_REGISTRATION": ("retry_after",),
    "PING": ("connected",),
    "PONG": ("usage",),
    "RUN_TASK": ("framework_info", "framework_id", "task", "role"),
    "RUN_TASK_GROUP": ("framework_info", "framework_id", "executor", "task_group", "role"),
    "KILL_TASK": ("framework_id", "task_id", "kill_id", "partition_aware", "reason"),
    "RECONCILE_TASKS": ("framework_id", "task_ids", "partition_aware"),
    "SHUTDOWN_EXECUTOR": ("framework_id", "executor_id"),
    "SHUTDOWN_FRAMEWORK": ("framework_id",),
    "STATUS_UPDATE": ("update",),
    "STATUS_UPDATES": ("updates",),
    "STATUS_UPDATE_ACK": ("framework_id", "task_id", "uuid", "agent_id"),
    "STATUS_UPDATE_ACKS": ("acks",),
    "FRAMEWORK_TO_EXECUTOR": ("framework_id", "executor_id", "data"),
    "EXECUTOR_TO_FRAMEWORK": ("framework_id", "executor_id", "data", "agent_id"),
    "EXITED_EXECUTOR": ("framework_id", "executor_id", "status"),
    "EXITED_EXECUTOR_ACK": ("framework_id", "executor_id"),
    "UNREGISTER_AGENT": ("agent_id",),
    "SHUTDOWN_AGENT": ("message",),
    "REGISTER_EXECUTOR": ("framework_id", "executor_id", "secret"),
    "EXECUTOR_REGISTERED": (
        "executor_info",
        "framework_id",
        "framework_info",
        "agent_id",
        "agent_info",
    ),
    "REREGISTER_EXECUTOR": ("framework_id", "executor_id", "tasks", "updates", "secret"),
    "EXECUTOR_REREGISTERED": ("agent_id", "agent_info"),
    "LAUNCH_TASK": ("framework_id", "task"),
    "LAUNCH_GROUP": ("framework_id", "executor", "task_group"),
    "GET_STATE": ("agents_limit", "tasks_limit", "agents_filter", "tasks_filter"),
    "STATE": (
        "master_info",
        "agents",
        "frameworks",
        "tasks",
        "masters",
        "roles",
        "cluster",
        "leader_since",
        "partial",
        "agents_total",
        "tasks_total",
        "agents_unreachable",
        "agents_draining",
        "resources_total",
        "resources_allocated",
        "insecure",
        "maintenance",
    ),
    "OPERATOR_KILL": ("task_id", "framework_id"),
    "UPDATE_WEIGHTS": ("weights",),
    "UPDATE_QUOTA": ("role", "guarantee", "limit"),
    "DRAIN_AGENT": ("agent_id", "deadline"),
    "REACTIVATE_AGENT": ("agent_id",),
    "MARK_AGENT_GONE": ("agent_id",),
    "TEARDOWN_FRAMEWORK": ("framework_id",),
    "RESERVE_RESOURCES": ("agent_id", "resources"),
    "UNRESERVE_RESOURCES": ("agent_id", "resources"),
    "OPERATOR_DONE": ("call", "message"),
    "SCHEDULE_MAINTENANCE": ("agent_ids", "start", "duration"),
    "CANCEL_MAINTENANCE": ("agent_ids",),
    "INVERSE_OFFERS": ("inverse_offers",),
    "RESCIND_INVERSE_OFFER": ("inverse_offer_id",),
    "ACCEPT_INVERSE_OFFERS": ("framework_id", "inverse_offer_ids"),
    "DECLINE_INVERSE_OFFERS": ("framework_id", "inverse_offer_ids"),
    "RAFT_VOTE": ("sender", "term", "last_log_index", "last_log_term", "pre_vote"),
    "RAFT_VOTE_REPLY": ("sender", "term", "granted", "pre_vote"),
    "RAFT_APPEND": (
        "sender",
        "term",
        "prev_log_index",
        "prev_log_term",
        "entries",
        "leader_commit",
        "seq",
        "leader_http",
    ),
    "RAFT_APPEND_REPLY": ("sender", "term", "success", "match_index", "seq"),
    "RAFT_SNAPSHOT": ("sender", "term", "last_index", "last_term", "data", "seq"),
    "RAFT_SNAPSHOT_REPLY": ("sender", "term", "match_index", "seq"),
    "DETECT_LEADER": (),
    "LEADER": ("responder", "leader", "epoch", "masters"),
}

SPEC_RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "MasterInfo": ("master_id", "address", "epoch", "features"),
    "FrameworkInfo": (
        "name",
        "user",
        "roles",
        "failover_timeout",
        "capabilities",
        "principal",
        "hostname",
        "framework_id",
        "checkpoint",
    ),
    "AgentInfo": (
        "hostname",
        "resources",
        "attributes",
        "port",
        "http_port",
        "address",
        "agent_id",
    ),
    "CommandInfo": ("value", "argv", "shell", "environment", "user", "uris"),
    "ExecutorInfo": (
        "executor_id",
        "framework_id",
        "command",
        "resources",
        "name",
        "container",
        "mesos",
    ),
    "TaskInfo": (
        "task_id",
        "name",
        "agent_id",
        "resources",
        "command",
        "executor",
        "labels",
        "data",
        "kill_grace_period",
        "health_check",
        "container",
    ),
    "TaskGroupInfo": ("tasks",),
    "TaskStatus": (
        "task_id",
        "state",
        "source",
        "reason",
        "message",
        "agent_id",
        "executor_id",
        "uuid",
        "healthy",
        "timestamp",
        "unreachable_time",
        "data",
        "exit_code",
        "cpu_seconds",
        "max_rss_bytes",
    ),
    "Filters": ("refuse_seconds",),
    "Offer": (
        "offer_id",
        "framework_id",
        "agent_id",
        "hostname",
        "role",
        "resources",
        "attributes",
        "gang_id",
        "revocable",
    ),
    "GangRequest": (
        "gang_id",
        "role",
        "count",
        "shape",
        "placement",
        "hold_timeout",
        "max_per_agent",
    ),
    "ReconcileTask": ("task_id", "agent_id"),
    "Launch": ("task_infos",),
    "LaunchGroup": ("executor", "task_group"),
    "Reserve": ("resources",),
    "Unreserve": ("resources",),
    "Create": ("volumes",),
    "Destroy": ("volumes",),
    "PersistentVolume": ("volume_id", "role", "disk"),
    "StatusUpdate": ("framework_id", "status", "latest_state"),
    "InverseOffer": (
        "inverse_offer_id",
        "framework_id",
        "agent_id",
        "hostname",
        "start",
        "duration",
    ),
    "InverseOfferAnswer": ("inverse_offer_id", "framework_id", "agent_id", "answer"),
    "MaintenanceSummary": ("hostname", "agent_ids", "start", "duration", "status", "answers"),
    "AgentTask": ("task", "framework_id", "state", "status_uuid", "role", "status_state"),
}


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(cls))


def _all_subclasses(cls: type[Message]) -> Iterator[type[Message]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


# ---- enums ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "enum_cls", [TaskState, StatusSource, Reason, FrameworkCapability, Placement, ErrorCode]
)
def test_enum_values_are_member_names(enum_cls: type) -> None:
    assert all(m.value == m.name for m in enum_cls)  # type: ignore[attr-defined]


def test_enum_members_match_the_contract() -> None:
    assert [s.name for s in TaskState] == [
        "STAGING",
        "STARTING",
        "RUNNING",
        "KILLING",
        "FINISHED",
        "FAILED",
        "KILLED",
        "ERROR",
        "LOST",
        "DROPPED",
        "UNREACHABLE",
        "GONE",
        "GONE_BY_OPERATOR",
        "UNKNOWN",
    ]
    assert [s.name for s in StatusSource] == ["MASTER", "AGENT", "EXECUTOR"]
    assert len(Reason) == 32
    assert {
        "GANG_INCOMPLETE",
        "TIMEOUT",
        "RECONCILIATION",
        "TASK_PREEMPTED",
        "RESOURCES_REVOKED",
        "AGENT_DRAINING",
    } <= Reason.__members__.keys()
    assert [c.name for c in FrameworkCapability] == [
        "PARTITION_AWARE",
        "TASK_KILLING_STATE",
        "MULTI_ROLE",
        "GANG",
        "REVOCABLE_RESOURCES",
    ]
    assert [p.name for p in Placement] == ["DISTINCT", "PACK", "ANY"]
    assert len(ErrorCode) == 11


def test_terminal_states() -> None:
    assert {
        TaskState.FINISHED,
        TaskState.FAILED,
        TaskState.KILLED,
        TaskState.ERROR,
        TaskState.DROPPED,
        TaskState.GONE,
    } == TERMINAL_STATES
    assert isinstance(TERMINAL_STATES, frozenset)
    assert not is_terminal(TaskState.LOST)  # the master decides case by case
    assert not is_terminal(TaskState.UNREACHABLE)
    assert is_terminal(TaskState.GONE)


# ---- registry ------------------------------------------------------------------------------------


def test_registry_holds_every_message_once() -> None:
    defined = [c for c in _all_subclasses(Message) if c.__module__.startswith("agora.sdk.messages")]
    assert dict(MESSAGE_TYPES) == {cls.NAME: cls for cls in defined}
    assert len(MESSAGE_TYPES) == len(SPEC_FIELDS)


@pytest.mark.parametrize("name", sorted(SPEC_FIELDS))
def test_message_fields_match_the_contract(name: str) -> None:
    cls = MESSAGE_TYPES[name]
    assert name == cls.NAME
    assert cls.VERSION == 1
    assert _field_names(cls) == SPEC_FIELDS[name]


@pytest.mark.parametrize("name", sorted(SPEC_RECORD_FIELDS))
def test_record_fields_match_the_contract(name: str) -> None:
    cls = getattr(messages, name)
    assert issubclass(cls, Record)
    assert not issubclass(cls, Message)
    assert _field_names(cls) == SPEC_RECORD_FIELDS[name]


def test_duplicate_names_fail_at_registry_build() -> None:
    class Fake(Message, frozen=True, kw_only=True):
        NAME: ClassVar[str] = "HEARTBEAT"

    with pytest.raises(TypeError, match="HEARTBEAT"):
        build_registry([MESSAGE_TYPES["HEARTBEAT"], Fake])


def test_public_names_are_exported() -> None:
    exported = set(messages.__all__)
    assert {cls.__name__ for cls in MESSAGE_TYPES.values()} <= exported
    assert set(SPEC_RECORD_FIELDS) <= exported
    assert {"MESSAGE_TYPES", "Message", "Operation", "TERMINAL_STATES", "is_terminal"} <= exported
    assert all(hasattr(messages, n) for n in exported)


def test_launch_group_operation_and_message_are_distinct() -> None:
    assert messages.LaunchGroup is LaunchGroup
    assert MESSAGE_TYPES["LAUNCH_GROUP"] is messages.LaunchTaskGroup
    assert not issubclass(LaunchGroup, Message)


# ---- records -------------------------------------------------------------------------------------


def test_records_are_frozen_slotted_and_keyword_only() -> None:
    accept = Accept(framework_id=FrameworkID("f"), offer_ids=(OfferID("o"),))
    with pytest.raises(AttributeError):
        accept.framework_id = FrameworkID("g")  # type: ignore[misc]
    assert not hasattr(accept, "__dict__")
    with pytest.raises(TypeError):
        Accept(FrameworkID("f"), (OfferID("o"),))  # type: ignore[misc]


def test_defaults_let_drivers_build_messages_with_few_arguments() -> None:
    accept = Accept(framework_id=FrameworkID("f"), offer_ids=(OfferID("o"),))
    assert accept.operations == ()
    assert accept.filters == Filters(refuse_seconds=5.0)
    assert Decline(framework_id=FrameworkID("f"), offer_ids=()).filters.refuse_seconds == 5.0
    info = FrameworkInfo(name="spark")
    assert info.roles == ("*",)
    assert info.failover_timeout == 0.0
    assert info.framework_id is None and not info.checkpoint
    gang = GangRequest(gang_id=GangID("g"), role="*", count=4, shape=Resources.parse("cpus:1"))
    assert gang.placement is Placement.DISTINCT
    assert gang.hold_timeout == 60.0 and gang.max_per_agent == 0
    executor = ExecutorInfo(
        executor_id=ExecutorID("e"),
        framework_id=FrameworkID("f"),
        command=CommandInfo(value="run"),
    )
    assert executor.resources == Resources()
    assert CommandInfo().shell is True
    assert CommandInfo().environment == {}
    assert messages.Ping().connected is True
    assert messages.Error(message="x").code is ErrorCode.BAD_REQUEST


def test_mapping_defaults_are_not_shared() -> None:
    assert CommandInfo().environment is not CommandInfo().environment


def test_operation_union_has_tagged_variants() -> None:
    schema = record_schema(Accept)
    ops = next(f for f in schema.fields if f.name == "operations").kind
    assert isinstance(ops, TupleKind) and isinstance(ops.item, UnionKind)
    tags = [variant_tag(v.cls) for v in ops.item.variants]
    assert tags == ["LAUNCH", "LAUNCH_GROUP", "RESERVE", "UNRESERVE", "CREATE", "DESTROY"]
    assert set(get_args(Operation)) == {Launch, LaunchGroup, Reserve, Unreserve, Create, Destroy}


# ---- schemas -------------------------------------------------------------------------------------


def _kind(cls: type[Record], name: str) -> object:
    return next(f.kind for f in record_schema(cls).fields if f.name == name)


def test_schema_bounds() -> None:
    assert _kind(messages.Teardown, "framework_id") == StrKind(255, FrameworkID)
    assert _kind(messages.Error, "message") == StrKind(64 * 1024)
    assert _kind(messages.SendMessage, "data") == BytesKind(4 * 1024 * 1024)
    assert _kind(messages.Acknowledge, "uuid") == BytesKind(64)
    assert _kind(messages.Offers, "offers") == TupleKind(record_schema(messages.Offer), 10_000)
    assert _kind(Filters, "refuse_seconds") == FloatKind(Range(0, 365 * 86_400.0))
    assert _kind(GangRequest, "count") == IntKind(Range(1, 10_000))
    assert _kind(GangRequest, "hold_timeout") == FloatKind(Range(0, 365 * 86_400.0, lo_open=True))
    assert _kind(messages.Kill, "agent_id") == OptionalKind(StrKind(255, AgentID))
    assert _kind(messages.ReconcileTask, "task_id") == StrKind(255, TaskID)
    required = {f.name for f in record_schema(Accept).fields if f.required}
    assert required == {"framework_id", "offer_ids"}


def test_every_message_has_a_schema() -> None:
    for cls in MESSAGE_TYPES.values():
        assert record_schema(cls).cls is cls


def test_range_semantics() -> None:
    r = Range(0, 10, lo_open=True)
    assert not r.admits(0) and r.admits(0.5) and r.admits(10) and not r.admits(10.5)
    assert r.describe() == "(0, 10]"
    assert Range().admits(-1e300)


def test_schema_rejects_types_the_wire_cannot_carry() -> None:
    class Listy(Record, frozen=True, kw_only=True):
        items: list[str]

    class Misbound(Record, frozen=True, kw_only=True):
        flag: Annotated[bool, MaxLen(3)]

    class WrongMarker(Record, frozen=True, kw_only=True):
        name: Annotated[str, MaxItems(3)]

    for cls in (Listy, Misbound, WrongMarker):
        with pytest.raises(TypeError):
            record_schema(cls)


def test_ids_and_the_records_a_framework_uses_are_importable_where_the_docs_say() -> None:
    import agora.sdk as sdk
    import agora.sdk.ids as ids
    import agora.sdk.messages as messages

    for name in ("AgentID", "ExecutorID", "FrameworkID", "GangID", "OfferID", "TaskID"):
        assert getattr(messages, name) is getattr(ids, name), name
    for name in ("AgentID", "ExecutorID", "FrameworkID", "OfferID", "TaskID", "SchedulerCalls"):
        assert name in sdk.__all__ and getattr(sdk, name) is not None, name
    for record in (messages.Offer, messages.TaskStatus, messages.FrameworkInfo):
        assert record.__doc__ and len(record.__doc__) > 200, record.__name__


def test_final_states_have_one_definition_for_master_agent_and_sdk() -> None:
    import agora.agent.core.status_updates as agent_updates
    import agora.master.core.tasks as master_tasks
    from agora.sdk.messages import TaskState, is_final, is_terminal

    assert master_tasks.is_final is is_final and agent_updates.is_final is is_final
    assert {s for s in TaskState if is_final(s)} == {s for s in TaskState if is_terminal(s)} | {
        TaskState.LOST
    }


def test_which_task_states_are_terminal_and_final() -> None:
    from agora.sdk.messages.enums import is_final, is_terminal

    terminal = {s.name for s in TaskState if is_terminal(s)}
    assert terminal == {"FINISHED", "FAILED", "KILLED", "ERROR", "DROPPED", "GONE"}
    assert {s.name for s in TaskState if is_final(s)} == terminal | {"LOST"}
