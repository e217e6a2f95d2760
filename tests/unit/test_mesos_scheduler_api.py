"""Mesos v1 scheduler calls and events <-> Agora's scheduler messages."""

from __future__ import annotations

from typing import Any

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, OfferID, TaskID
from agora.sdk.mesos import resources_from_mesos, task_status_from_mesos
from agora.sdk.mesos.scheduler_api import (
    SchedulerCall,
    Unsupported,
    events_to_mesos,
    scheduler_call_from_mesos,
)
from agora.sdk.messages import (
    Accept,
    AcceptInverseOffers,
    Acknowledge,
    Decline,
    Error,
    Failure,
    FrameworkMessage,
    GangExpired,
    InverseOffer,
    InverseOffers,
    Kill,
    Launch,
    LaunchGroup,
    MasterInfo,
    Offer,
    Offers,
    Reason,
    Reconcile,
    Rescind,
    Reserve,
    Revive,
    SendMessage,
    Shutdown,
    StatusSource,
    Subscribe,
    Subscribed,
    Suppress,
    TaskState,
    TaskStatus,
    Teardown,
    Update,
    Updates,
)
from agora.sdk.resources import Resources

FID = {"value": "F1"}
CPUS = [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}}]


def _call(kind: str, body: Any = None, **extra: Any) -> SchedulerCall:
    call: dict[str, Any] = {"type": kind, "framework_id": FID, **extra}
    if body is not None:
        call[kind.lower()] = body
    return scheduler_call_from_mesos(call)


def test_subscribe_takes_the_framework_info_and_its_id() -> None:
    call = scheduler_call_from_mesos(
        {
            "type": "SUBSCRIBE",
            "framework_id": FID,
            "subscribe": {
                "framework_info": {"user": "u", "name": "n", "id": FID, "failover_timeout": 100},
                "suppressed_roles": ["*"],
            },
        }
    )
    assert isinstance(call.message, Subscribe)
    assert call.message.framework_info.framework_id == "F1"
    assert call.message.framework_info.failover_timeout == 100
    assert call.message.suppressed_roles == ("*",)
    first = scheduler_call_from_mesos(
        {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"user": "u", "name": "n"}}}
    )
    assert first.framework_id is None and isinstance(first.message, Subscribe)
    with pytest.raises(ProtocolError) as info:
        scheduler_call_from_mesos(
            {
                "type": "SUBSCRIBE",
                "framework_id": {"value": "other"},
                "subscribe": {"framework_info": {"user": "u", "name": "n", "id": FID}},
            }
        )
    assert info.value.field == "call.framework_id"


def test_accept_launches_tasks_and_runs_custom_executors_under_the_bridge() -> None:
    task = {
        "name": "t",
        "task_id": {"value": "t1"},
        "slave_id": {"value": "A1"},  # an older client's name for agent_id
        "resources": CPUS,
        "command": {"value": "sleep 1"},
    }
    custom = {"executor_id": {"value": "e"}, "command": {"value": "./exec"}}
    group = {
        "type": "LAUNCH_GROUP",
        "launch_group": {
            "executor": {**custom, "type": "DEFAULT"},
            "task_group": {"tasks": [{**task, "task_id": {"value": "g1"}}]},
        },
    }
    call = _call(
        "ACCEPT",
        {
            "offer_ids": [{"value": "O1"}],
            "operations": [
                {"type": "LAUNCH", "launch": {"task_infos": [task]}},
                {
                    "type": "LAUNCH",
                    "launch": {
                        "task_infos": [
                            {
                                **{k: v for k, v in task.items() if k != "command"},
                                "task_id": {"value": "t2"},
                                "executor": custom,
                            }
                        ]
                    },
                },
                group,
                {"type": "RESERVE", "reserve": {"resources": [{**CPUS[0], "role": "r"}]}},
            ],
            "filters": {"refuse_seconds": 30},
        },
    )
    m = call.message
    assert isinstance(m, Accept) and m.offer_ids == (OfferID("O1"),)
    assert m.filters.refuse_seconds == 30
    plain, with_executor, grouped, reserve = m.operations
    assert isinstance(plain, Launch) and plain.task_infos[0].agent_id == AgentID("A1")
    assert plain.task_infos[0].command is not None
    assert isinstance(with_executor, Launch)
    executor = with_executor.task_infos[0].executor
    assert executor is not None and executor.mesos and executor.framework_id == "F1"
    assert isinstance(grouped, LaunchGroup) and not grouped.executor.mesos  # Agora's default
    assert isinstance(reserve, Reserve) and reserve.resources == Resources.parse("cpus(r):1")


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        ("TEARDOWN", None, Teardown(framework_id=FrameworkID("F1"))),
        (
            "DECLINE",
            {"offer_ids": [{"value": "O1"}]},
            Decline(framework_id=FrameworkID("F1"), offer_ids=(OfferID("O1"),)),
        ),
        ("REVIVE", {"roles": ["a"]}, Revive(framework_id=FrameworkID("F1"), roles=("a",))),
        ("REVIVE", None, Revive(framework_id=FrameworkID("F1"))),
        ("SUPPRESS", None, Suppress(framework_id=FrameworkID("F1"))),
        (
            "KILL",
            {"task_id": {"value": "t"}},
            Kill(framework_id=FrameworkID("F1"), task_id=TaskID("t")),
        ),
        (
            "SHUTDOWN",
            {"executor_id": {"value": "e"}, "agent_id": {"value": "A"}},
            Shutdown(framework_id=FrameworkID("F1"), executor_id="e", agent_id=AgentID("A")),
        ),
        (
            "ACKNOWLEDGE",
            {
                "agent_id": {"value": "A"},
                "task_id": {"value": "t"},
                "uuid": "AAECAwQFBgcICQoLDA0ODw==",
            },
            Acknowledge(
                framework_id=FrameworkID("F1"),
                agent_id=AgentID("A"),
                task_id=TaskID("t"),
                uuid=bytes(range(16)),
            ),
        ),
        ("RECONCILE", {"tasks": []}, Reconcile(framework_id=FrameworkID("F1"))),
        (
            "MESSAGE",
            {"agent_id": {"value": "A"}, "executor_id": {"value": "e"}, "data": "aGk="},
            SendMessage(
                framework_id=FrameworkID("F1"), agent_id=AgentID("A"), executor_id="e", data=b"hi"
            ),
        ),
        (
            "ACCEPT_INVERSE_OFFERS",
            {"inverse_offer_ids": [{"value": "I1"}]},
            AcceptInverseOffers(framework_id=FrameworkID("F1"), inverse_offer_ids=("I1",)),
        ),
        ("REQUEST", {"requests": [{"resources": CPUS}]}, None),
    ],
)
def test_each_call_becomes_its_agora_message(kind: str, body: Any, expected: Any) -> None:
    assert _call(kind, body).message == expected


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"framework_id": FID}, "call.type"),
        ({"type": "DECLINE", "decline": {"offer_ids": []}}, "call.framework_id"),
        ({"type": "BOGUS", "framework_id": FID}, "call.type"),
        ({"type": "DECLINE", "framework_id": FID}, "call.decline"),
        (
            {"type": "DECLINE", "framework_id": FID, "decline": {"offer_ids": "O1"}},
            "call.decline.offer_ids",
        ),
        (
            {"type": "KILL", "framework_id": FID, "kill": {"task_id": {"value": "a/b"}}},
            "call.kill.task_id.value",
        ),
        (
            {
                "type": "ACKNOWLEDGE",
                "framework_id": FID,
                "acknowledge": {
                    "agent_id": {"value": "A"},
                    "task_id": {"value": "t"},
                    "uuid": "AAE=",
                },
            },
            "call.acknowledge.uuid",
        ),
        (
            {
                "type": "KILL",
                "framework_id": FID,
                "kill": {"task_id": {"value": "t"}, "kill_policy": {}},
            },
            "call.kill.kill_policy",
        ),
        (
            {"type": "SHUTDOWN", "framework_id": FID, "shutdown": {"executor_id": {"value": "e"}}},
            "call.shutdown.agent_id",
        ),
        ({"type": "DECLINE", "framework_id": FID, "surprise": 1}, "call.surprise"),
    ],
)
def test_malformed_calls_name_the_field(call: Any, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        scheduler_call_from_mesos(call)
    assert not isinstance(info.value, Unsupported)
    assert info.value.field == field


@pytest.mark.parametrize(
    "call",
    [
        {"type": "UPDATE_FRAMEWORK", "framework_id": FID},
        {"type": "RECONCILE_OPERATIONS", "framework_id": FID},
        {
            "type": "ACCEPT",
            "framework_id": FID,
            "accept": {"offer_ids": [FID], "operations": [{"type": "CREATE", "create": {}}]},
        },
        {
            "type": "ACCEPT",
            "framework_id": FID,
            "accept": {"offer_ids": [FID], "operations": [{"type": "RESERVE", "id": FID}]},
        },
    ],
)
def test_what_agora_lacks_is_unsupported_not_malformed(call: Any) -> None:
    with pytest.raises(Unsupported):
        scheduler_call_from_mesos(call)


def _status(**extra: Any) -> TaskStatus:
    return TaskStatus(
        task_id=TaskID("t1"),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        agent_id=AgentID("A1"),
        uuid=bytes(range(16)),
        timestamp=1700000000.5,
        **extra,
    )


def test_events_carry_what_the_core_said_and_round_trip() -> None:
    [update] = events_to_mesos(Update(status=_status(data=b"x")), version="1.11.0")
    assert update["type"] == "UPDATE"
    assert task_status_from_mesos(update["update"]["status"]) == _status(data=b"x")  # type: ignore[index]
    batch = Updates(statuses=(_status(), _status(reason=Reason.RECONCILIATION)))
    assert [e["type"] for e in events_to_mesos(batch, version="1")] == ["UPDATE", "UPDATE"]

    offer = Offer(
        offer_id=OfferID("O1"),
        framework_id=FrameworkID("F1"),
        agent_id=AgentID("A1"),
        hostname="h",
        resources=Resources.parse("cpus:2;mem:64;ports:[31000-31009]"),
        role="*",
    )
    [offers] = events_to_mesos(Offers(offers=(offer,)), version="1")
    [mesos_offer] = offers["offers"]["offers"]  # type: ignore[index]
    assert resources_from_mesos(mesos_offer["resources"]) == offer.resources
    assert events_to_mesos(Rescind(offer_id=OfferID("O1")), version="1") == [
        {"type": "RESCIND", "rescind": {"offer_id": {"value": "O1"}}}
    ]

    info = MasterInfo(master_id="m1", address="tcp://10.0.0.1:5050", epoch=3)
    subscribed = Subscribed(
        framework_id=FrameworkID("F1"), heartbeat_interval_seconds=15, master_info=info
    )
    [event] = events_to_mesos(subscribed, version="1.11.0")
    body = event["subscribed"]
    assert body["framework_id"] == {"value": "F1"}  # type: ignore[index]
    assert body["heartbeat_interval_seconds"] == 15  # type: ignore[index]
    assert body["master_info"]["hostname"] == "10.0.0.1"  # type: ignore[index]
    assert body["master_info"]["port"] == 5050  # type: ignore[index]

    message = FrameworkMessage(agent_id=AgentID("A1"), executor_id="e", data=b"hi")
    assert events_to_mesos(message, version="1")[0]["message"]["data"] == "aGk="  # type: ignore[index]
    failure = Failure(agent_id=AgentID("A1"), executor_id="e", status=3)
    assert events_to_mesos(failure, version="1")[0]["failure"] == {  # type: ignore[index]
        "agent_id": {"value": "A1"},
        "executor_id": {"value": "e"},
        "status": 3,
    }
    assert events_to_mesos(Error(message="no"), version="1") == [
        {"type": "ERROR", "error": {"message": "no"}}
    ]
    inverse = InverseOffer(
        inverse_offer_id="I1",
        framework_id=FrameworkID("F1"),
        agent_id=AgentID("A1"),
        start=10.0,
        duration=60.0,
    )
    [io] = events_to_mesos(InverseOffers(inverse_offers=(inverse,)), version="1")
    unavailable = io["inverse_offers"]["inverse_offers"][0]["unavailability"]  # type: ignore[index]
    assert unavailable == {
        "start": {"nanoseconds": 10**10},
        "duration": {"nanoseconds": 6 * 10**10},
    }
    assert events_to_mesos(GangExpired(gang_id="g"), version="1") == []  # type: ignore[arg-type]


def test_one_launch_may_fill_a_big_offer_with_thousands_of_tasks() -> None:
    task = {"name": "t", "agent_id": {"value": "A1"}, "resources": CPUS}
    tasks = [
        {**task, "task_id": {"value": f"t{i}"}, "command": {"value": "true"}} for i in range(3000)
    ]
    call = _call(
        "ACCEPT",
        {
            "offer_ids": [{"value": "O1"}],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}],
        },
    )
    assert isinstance(call.message, Accept)
    [launch] = call.message.operations
    assert isinstance(launch, Launch) and len(launch.task_infos) == 3000
