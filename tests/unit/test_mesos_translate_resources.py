"""Mesos Resource lists <-> Agora Resources, and Mesos id wrappers."""

from __future__ import annotations

import pytest
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, TaskID
from agora.sdk.mesos import id_from_mesos, id_to_mesos, resources_from_mesos, resources_to_mesos
from agora.sdk.resources import Resources


@pytest.mark.parametrize(
    "text",
    [
        "",
        "cpus:4;mem:4096.5",
        "cpus:0.001;disk:1000000",
        "ports:[31000-32000,32005-32010]",
        "zones:{a,b};cpus(batch):2;mem(batch):10",
        "gpus:1;ports(web):[80-80,443-443];cpus:1.5",
    ],
)
def test_resources_round_trip(text: str) -> None:
    r = Resources.parse(text)
    assert resources_from_mesos(resources_to_mesos(r)) == r


def test_resources_to_mesos_shape() -> None:
    out = resources_to_mesos(Resources.parse("cpus(batch):2;ports:[1-5]"), allocation_role="b")
    assert out == [
        {
            "name": "cpus",
            "type": "SCALAR",
            "scalar": {"value": 2},
            "role": "batch",
            "reservations": [{"type": "STATIC", "role": "batch"}],
            "allocation_info": {"role": "b"},
        },
        {
            "name": "ports",
            "type": "RANGES",
            "ranges": {"range": [{"begin": 1, "end": 5}]},
            "role": "*",
            "allocation_info": {"role": "b"},
        },
    ]


def test_mesos_entries_of_one_name_are_summed_and_reservations_give_the_role() -> None:
    got = resources_from_mesos(
        [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1.5}},
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.5}},
            {
                "name": "mem",
                "type": "SCALAR",
                "scalar": {"value": 64},
                "reservations": [{"type": "DYNAMIC", "role": "web", "principal": "p"}],
            },
            {"name": "zones", "type": "SET", "set": {"item": ["x"]}},
            {"name": "zones", "type": "SET", "set": {"item": ["y"]}},
        ]
    )
    assert got == Resources.parse("cpus:2;mem(web):64;zones:{x,y}")


def _cpus(**extra: object) -> dict[str, object]:
    return {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}, **extra}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"name": "cpus"}, "resources"),  # not a list
        (["cpus:1"], "resources[0]"),
        ([{"type": "SCALAR", "scalar": {"value": 1}}], "resources[0].name"),
        ([{"name": "cpus", "scalar": {"value": 1}}], "resources[0].type"),
        ([{"name": "cpus", "type": "TEXT", "text": {"value": "x"}}], "resources[0].text"),
        ([{"name": "cpus", "type": "TEXT"}], "resources[0].type"),
        (
            [{"name": "cpus", "type": "SCALAR", "scalar": {"value": -1}}],
            "resources[0].scalar.value",
        ),
        (
            [{"name": "cpus", "type": "SCALAR", "scalar": {"value": "1"}}],
            "resources[0].scalar.value",
        ),
        (
            [{"name": "cpus", "type": "SCALAR", "scalar": {"value": True}}],
            "resources[0].scalar.value",
        ),
        (
            [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1e300}}],
            "resources[0].scalar.value",
        ),
        ([{"name": "cpus", "type": "SCALAR", "scalar": {}}], "resources[0].scalar.value"),
        ([{"name": "cpus", "type": "SCALAR"}], "resources[0].scalar"),
        (
            [
                {
                    "name": "ports",
                    "type": "RANGES",
                    "ranges": {"range": [{"begin": 0, "end": 2**64}]},
                }
            ],
            "resources[0].ranges.range[0].end",
        ),
        (
            [{"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 9, "end": 1}]}}],
            "resources[0].ranges.range[0]",
        ),
        (
            [{"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": -1, "end": 1}]}}],
            "resources[0].ranges.range[0].begin",
        ),
        (
            [
                {
                    "name": "ports",
                    "type": "RANGES",
                    "ranges": {"range": [{"begin": 2 * i, "end": 2 * i} for i in range(5000)]},
                }
            ],
            "resources[0].ranges.range",
        ),
        ([{"name": "cpus", "type": "RANGES", "ranges": {"range": []}}], "resources[0]"),
        ([{"name": "zones", "type": "SET", "set": {"item": [1]}}], "resources[0].set.item[0]"),
        ([{"name": "a(b)", "type": "SET", "set": {"item": ["x"]}}], "resources[0].name"),
        ([_cpus(disk={"persistence": {"id": "v"}})], "resources[0].disk"),
        ([_cpus(revocable={})], "resources[0].revocable"),
        ([_cpus(shared={})], "resources[0].shared"),
        ([_cpus(scalar={"value": 1}, set={"item": []})], "resources[0].set"),
        (
            [
                _cpus(
                    reservations=[{"type": "STATIC", "role": "a"}, {"type": "DYNAMIC", "role": "b"}]
                )
            ],
            "resources[0].reservations",
        ),
        (
            [_cpus(reservations=[{"type": "WEIRD", "role": "a"}])],
            "resources[0].reservations[0].type",
        ),
        ([_cpus(reservations=[{"type": "STATIC"}])], "resources[0].reservations[0].role"),
        ([_cpus(role="a", reservations=[{"role": "b"}])], "resources[0].role"),
        ([_cpus(role="bad role")], "resources[0]"),
        ([_cpus(), {"name": "cpus", "type": "SET", "set": {"item": ["x"]}}], "resources[1]"),
        ([_cpus()] * 2000, "resources"),
    ],
)
def test_resources_from_mesos_refuses(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        resources_from_mesos(value)
    assert info.value.field == field


def test_ids_round_trip() -> None:
    assert id_to_mesos(TaskID("t-1")) == {"value": "t-1"}
    got = id_from_mesos(id_to_mesos(TaskID("t-1")), TaskID, "task_id")
    assert got == TaskID("t-1")
    assert type(got) is TaskID


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("t-1", "agent_id"),
        ({}, "agent_id.value"),
        ({"value": 7}, "agent_id.value"),
        ({"value": ""}, "agent_id.value"),
        ({"value": "a/b"}, "agent_id.value"),
        ({"value": ".."}, "agent_id.value"),
        ({"value": "x" * 256}, "agent_id.value"),
        ({"value": "a", "extra": 1}, "agent_id.extra"),
    ],
)
def test_ids_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        id_from_mesos(value, AgentID, "agent_id")
    assert info.value.field == field
