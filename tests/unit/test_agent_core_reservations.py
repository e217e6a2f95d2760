"""The agent keeps the dynamic reservations the master sends (CHECKPOINT_RESOURCES): it
checkpoints them in its journal and reports them in every (re-)registration, also after a
restart from that journal."""

from __future__ import annotations

from pathlib import Path

from agora.agent.core import Agent, Delete, Put
from agora.agent.core.checkpoint import RESOURCES
from agora.agent.server.journal import Journal
from agora.sdk.messages import CheckpointResources, RegisterAgent, ReregisterAgent
from agora.sdk.resources import Resources
from support.agent_kit import AgentHarness, of_type, only, to_master

RESERVED = Resources.parse("cpus(db):2;mem(db):512")


def _commit(agent: Agent, journal: Journal) -> None:
    for record in agent.checkpoint():
        if isinstance(record, Put):
            journal.put(record.kind, record.key, record.value)
        else:
            journal.delete(record.kind, record.key)
    journal.commit()


def test_checkpoint_resources_is_journaled_once_and_reported_on_reregistration() -> None:
    h = AgentHarness()
    h.register()
    h.agent.checkpoint()
    h.master(CheckpointResources(resources=RESERVED))
    records = h.agent.checkpoint()
    assert [(r.kind, type(r)) for r in records] == [(RESOURCES, Put)]
    h.master(CheckpointResources(resources=RESERVED))  # the same set again: nothing to write
    assert h.agent.checkpoint() == []
    assert (RESOURCES, "checkpointed") in h.agent.durable_records()
    actions = h.connected()  # the link came back: the agent re-registers
    message = only(of_type(to_master(actions), ReregisterAgent))
    assert message.checkpointed_resources == RESERVED
    assert message.agent_info.resources == h.cfg.resources  # the static total, unchanged


def test_an_empty_set_deletes_the_record() -> None:
    h = AgentHarness()
    h.register()
    h.master(CheckpointResources(resources=RESERVED))
    h.agent.checkpoint()
    h.master(CheckpointResources(resources=Resources()))
    assert [type(r) for r in h.agent.checkpoint()] == [Delete]
    assert (RESOURCES, "checkpointed") not in h.agent.durable_records()


def test_reservations_survive_an_agent_restart_from_the_journal(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "journal"))
    journal.load()
    h = AgentHarness()
    h.register()
    h.master(CheckpointResources(resources=RESERVED))
    _commit(h.agent, journal)
    journal.close()

    journal = Journal(str(tmp_path / "journal"))
    records = journal.load()
    journal.close()
    fresh = AgentHarness()
    fresh.agent.recover(records, fresh.now, alive=frozenset(), cleanup=False)
    actions = fresh.connected()
    message = only(of_type(to_master(actions), ReregisterAgent))
    assert message.checkpointed_resources == RESERVED


def test_reservations_are_reported_even_when_the_agent_id_is_gone(tmp_path: Path) -> None:
    """A new agent id (a host reboot, ``--recover=cleanup`` wiping the meta dir aside) does not
    lose them: the record is not keyed on the id, and REGISTER_AGENT carries them too."""
    agent = AgentHarness().agent
    records = {
        (kind, key): value
        for (kind, key), value in _durable_with_reservations().items()
        if kind == RESOURCES
    }
    agent.recover(records, 1000.0, alive=frozenset(), cleanup=False)
    message = only(of_type(to_master(agent.connected(1000.0)), RegisterAgent))
    assert message.checkpointed_resources == RESERVED


def test_reservations_need_an_agent_id() -> None:
    h = AgentHarness()
    h.master(CheckpointResources(resources=RESERVED))  # before any registration: ignored
    assert h.agent.checkpoint() == []


def _durable_with_reservations() -> dict[tuple[str, str], bytes]:
    h = AgentHarness()
    h.register()
    h.master(CheckpointResources(resources=RESERVED))
    return h.agent.durable_records()
