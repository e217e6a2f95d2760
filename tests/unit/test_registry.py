"""The replicated registry: committed operations applied identically by every replica."""

from __future__ import annotations

import pytest
from agora.master.registry import (
    MAX_REMOVED,
    AdmitAgent,
    AgentEntry,
    DrainAgent,
    FrameworkEntry,
    MaintenanceWindow,
    MarkUnreachable,
    QuotaEntry,
    ReadmitAgent,
    Registry,
    RemoveAgent,
    RemoveFramework,
    SetMaintenance,
    SetQuota,
    SetWeights,
    UpsertFramework,
    decode_operation,
    encode_operation,
)
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import RoleWeight
from agora.sdk.resources import Resources

A1 = AgentID("e1-A1")
F1 = FrameworkID("e1-F1")


def _admit(agent_id: AgentID = A1) -> AdmitAgent:
    return AdmitAgent(agent=AgentEntry(agent_id=agent_id, hostname="h1"))


def test_agent_lifecycle_admitted_unreachable_back_gone() -> None:
    reg = Registry()
    assert reg.apply(_admit())
    assert [a.agent_id for a in reg.admitted()] == [A1]
    assert reg.apply(MarkUnreachable(agent_id=A1, time=100.0))
    assert reg.admitted() == []
    assert reg.agents[A1].unreachable_since == 100.0
    assert reg.apply(ReadmitAgent(agent_id=A1))
    assert [a.agent_id for a in reg.admitted()] == [A1]
    assert reg.apply(RemoveAgent(agent_id=A1))
    assert A1 not in reg.agents and reg.is_removed_agent(A1)


def test_a_removed_agent_is_never_admitted_again() -> None:
    reg = Registry()
    reg.apply(RemoveAgent(agent_id=A1))
    assert not reg.apply(_admit())
    assert not reg.apply(ReadmitAgent(agent_id=A1))
    assert A1 not in reg.agents


def test_stale_and_duplicate_operations_change_nothing() -> None:
    reg = Registry()
    empty = reg.digest()
    assert not reg.apply(MarkUnreachable(agent_id=A1, time=1.0))  # unknown agent
    assert not reg.apply(DrainAgent(agent_id=A1))
    assert reg.digest() == empty
    reg.apply(_admit())
    admitted = reg.digest()
    assert not reg.apply(ReadmitAgent(agent_id=A1))  # already admitted
    assert reg.digest() == admitted
    assert reg.apply(RemoveAgent(agent_id=A1))
    assert not reg.apply(RemoveAgent(agent_id=A1))  # removed twice


def test_frameworks_keep_their_failover_timeout_and_removal_is_final() -> None:
    reg = Registry()
    entry = FrameworkEntry(framework_id=F1, name="batch", roles=("a",), failover_timeout=86400.0)
    assert reg.apply(UpsertFramework(framework=entry))
    assert reg.frameworks[F1].failover_timeout == 86400.0
    assert not reg.apply(UpsertFramework(framework=entry))  # same again
    assert reg.apply(RemoveFramework(framework_id=F1))
    assert not reg.apply(UpsertFramework(framework=entry))
    assert F1 not in reg.frameworks


def test_weights_quota_drain_and_maintenance() -> None:
    reg = Registry()
    reg.apply(_admit())
    reg.apply(SetWeights(weights=(RoleWeight(role="batch", weight=3.0),)))
    quota = QuotaEntry(role="x", guarantee=Resources.parse("cpus:4"))
    reg.apply(SetQuota(role="batch", quota=quota))
    reg.apply(DrainAgent(agent_id=A1))
    reg.apply(
        SetMaintenance(hostname="h1", window=MaintenanceWindow(hostname="", start=5, duration=60))
    )
    assert reg.weights == {"batch": 3.0}
    assert reg.quotas["batch"].role == "batch"  # the operation's role wins over the entry's
    assert reg.agents[A1].draining
    assert reg.maintenance["h1"].duration == 60
    assert reg.apply(SetQuota(role="batch"))
    assert reg.apply(SetMaintenance(hostname="h1"))
    assert reg.quotas == {} and reg.maintenance == {}


def test_snapshot_round_trip_restores_everything_in_place() -> None:
    reg = Registry()
    reg.apply(_admit())
    reg.apply(_admit(AgentID("e1-A2")))
    reg.apply(MarkUnreachable(agent_id=AgentID("e1-A2"), time=7.0))
    reg.apply(RemoveAgent(agent_id=AgentID("e1-A3")))
    reg.apply(UpsertFramework(framework=FrameworkEntry(framework_id=F1, failover_timeout=5.0)))
    reg.apply(RemoveFramework(framework_id=FrameworkID("e1-F2")))
    reg.apply(SetWeights(weights=(RoleWeight(role="r", weight=2.0),)))
    other = Registry()
    held = other
    other.restore(reg.snapshot())
    assert held is other and other.digest() == reg.digest()
    assert other.agents == reg.agents
    assert list(other.removed_agents) == list(reg.removed_agents)
    assert other.frameworks == reg.frameworks and other.weights == reg.weights


def test_replicas_applying_the_same_log_agree() -> None:
    log = [
        _admit(),
        UpsertFramework(framework=FrameworkEntry(framework_id=F1)),
        MarkUnreachable(agent_id=A1, time=3.0),
        ReadmitAgent(agent_id=A1),
        SetWeights(weights=(RoleWeight(role="a", weight=1.5),)),
        RemoveAgent(agent_id=A1),
    ]
    a, b = Registry(), Registry()
    for op in log:
        a.apply(decode_operation(encode_operation(op)))
    for op in log:
        b.apply(op)
    assert a.digest() == b.digest()


def test_removed_ids_are_bounded_oldest_first() -> None:
    reg = Registry()
    for i in range(MAX_REMOVED + 5):
        reg.apply(RemoveAgent(agent_id=AgentID(f"A{i}")))
    assert len(reg.removed_agents) == MAX_REMOVED
    assert not reg.is_removed_agent(AgentID("A0"))
    assert reg.is_removed_agent(AgentID(f"A{MAX_REMOVED + 4}"))


@pytest.mark.parametrize("data", [b"", b"\x92\x01", b"\x81\xa2op\x81\xa4type\xa4NOPE"])
def test_garbage_log_entries_are_refused_with_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_operation(data)


def test_garbage_snapshot_is_refused() -> None:
    with pytest.raises(ProtocolError):
        Registry.from_snapshot(b"\xc1")
