"""Mesos FrameworkInfo <-> Agora FrameworkInfo, and Agora offers -> Mesos offers."""

from __future__ import annotations

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, GangID, OfferID
from agora.sdk.mesos import (
    framework_info_from_mesos,
    framework_info_to_mesos,
    offer_to_mesos,
    resources_from_mesos,
)
from agora.sdk.messages.common import FrameworkInfo, Offer
from agora.sdk.messages.enums import FrameworkCapability
from agora.sdk.resources import Resources


def test_framework_info_from_mesos_single_role() -> None:
    info = framework_info_from_mesos(
        {
            "user": "root",
            "name": "pymesos",
            "role": "batch",
            "failover_timeout": 60,
            "checkpoint": True,
            "principal": "p",
            "hostname": "h",
            "id": {"value": "fw-1"},
            "capabilities": [{"type": "PARTITION_AWARE"}],
        }
    )
    assert info == FrameworkInfo(
        name="pymesos",
        user="root",
        roles=("batch",),
        failover_timeout=60.0,
        capabilities=(FrameworkCapability.PARTITION_AWARE,),
        principal="p",
        hostname="h",
        framework_id=FrameworkID("fw-1"),
        checkpoint=True,
    )


def test_framework_info_defaults_to_the_star_role() -> None:
    assert framework_info_from_mesos({"user": "u", "name": "n"}).roles == ("*",)


@pytest.mark.parametrize(
    "info",
    [
        FrameworkInfo(name="n", user="u"),
        FrameworkInfo(
            name="n",
            user="u",
            roles=("a", "b"),
            capabilities=(FrameworkCapability.MULTI_ROLE, FrameworkCapability.TASK_KILLING_STATE),
            failover_timeout=3600.0,
            principal="p",
            hostname="h",
            framework_id=FrameworkID("fw"),
            checkpoint=True,
        ),
    ],
)
def test_framework_info_round_trip(info: FrameworkInfo) -> None:
    assert framework_info_from_mesos(framework_info_to_mesos(info)) == info


def test_framework_info_to_mesos_refuses_gang_and_unflagged_roles() -> None:
    with pytest.raises(ProtocolError):
        framework_info_to_mesos(
            FrameworkInfo(name="n", user="u", capabilities=(FrameworkCapability.GANG,))
        )
    with pytest.raises(ProtocolError):
        framework_info_to_mesos(FrameworkInfo(name="n", user="u", roles=("a", "b")))


_MR = [{"type": "MULTI_ROLE"}]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, "framework_info"),
        ({"name": "n"}, "framework_info.user"),
        ({"user": "u"}, "framework_info.name"),
        ({"user": "u", "name": 3}, "framework_info.name"),
        ({"user": "u", "name": "n", "labels": {}}, "framework_info.labels"),
        ({"user": "u", "name": "n", "webui_url": 1}, "framework_info.webui_url"),
        ({"user": "u", "name": "n", "roles": ["a"]}, "framework_info.roles"),
        ({"user": "u", "name": "n", "capabilities": _MR}, "framework_info.roles"),
        (
            {"user": "u", "name": "n", "capabilities": _MR, "roles": ["a", "a"]},
            "framework_info.roles",
        ),
        (
            {"user": "u", "name": "n", "capabilities": _MR, "role": "a", "roles": ["a"]},
            "framework_info.role",
        ),
        (
            {"user": "u", "name": "n", "capabilities": [{"type": "SHARED_RESOURCES"}]},
            "framework_info.capabilities[0].type",
        ),
        ({"user": "u", "name": "n", "failover_timeout": -1}, "framework_info.failover_timeout"),
        ({"user": "u", "name": "n", "failover_timeout": 1e30}, "framework_info.failover_timeout"),
        ({"user": "u", "name": "n", "checkpoint": 1}, "framework_info.checkpoint"),
        ({"user": "u", "name": "n", "id": {"value": ""}}, "framework_info.id.value"),
    ],
)
def test_framework_info_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        framework_info_from_mesos(value)
    assert info.value.field == field


def _offer(**extra: object) -> Offer:
    fields: dict[str, object] = {
        "offer_id": OfferID("o-1"),
        "framework_id": FrameworkID("fw-1"),
        "agent_id": AgentID("a-1"),
        "hostname": "host1",
        "role": "batch",
        "resources": Resources.parse("cpus:4;mem(batch):1024;ports:[31000-31010]"),
        "attributes": {"rack": "r1", "zone": "z"},
        **extra,
    }
    return Offer(**fields)  # type: ignore[arg-type]


def test_offer_to_mesos() -> None:
    offer = _offer()
    m = offer_to_mesos(offer)
    assert m["id"] == {"value": "o-1"}
    assert m["framework_id"] == {"value": "fw-1"}
    assert m["agent_id"] == {"value": "a-1"}
    assert m["hostname"] == "host1"
    assert m["attributes"] == [
        {"name": "rack", "type": "TEXT", "text": {"value": "r1"}},
        {"name": "zone", "type": "TEXT", "text": {"value": "z"}},
    ]
    resources = m["resources"]
    assert isinstance(resources, list)
    assert all(r["allocation_info"] == {"role": "batch"} for r in resources)
    assert all("revocable" not in r for r in resources)
    # the resources a Mesos client echoes back in its ACCEPT are the offer's
    assert resources_from_mesos(resources) == offer.resources


def test_revocable_offer_marks_its_resources() -> None:
    resources = offer_to_mesos(_offer(revocable=True))["resources"]
    assert isinstance(resources, list)
    assert resources and all(r["revocable"] == {} for r in resources)


def test_gang_offer_is_refused() -> None:
    with pytest.raises(ProtocolError) as info:
        offer_to_mesos(_offer(gang_id=GangID("g")))
    assert info.value.field == "offer.gang_id"


def test_gpu_resources_capability_is_accepted_and_dropped() -> None:
    # pymesos asks for it whenever the master reports 1.0 or later.
    info = framework_info_from_mesos(
        {"user": "u", "name": "n", "capabilities": [{"type": "GPU_RESOURCES"}]}
    )
    assert info.capabilities == ()
