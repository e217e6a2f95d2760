"""The agent keeps the dynamic reservations the master sends (CHECKPOINT_RESOURCES): it
checkpoints them in its journal and reports them in every (re-)registration, also after a
restart from that journal."""

from __future__ import annotations

from pathlib import Path

from agora.agent.core import (
    Agent,
    CreateVolume,
    Delete,
    DestroyVolume,
    LinkVolumes,
    Put,
    ToExecutor,
)
from agora.agent.core.checkpoint import RESOURCES
from agora.agent.server.journal import Journal
from agora.sdk.messages import (
    CheckpointResources,
    LaunchTask,
    PersistentVolume,
    RegisterAgent,
    ReregisterAgent,
)
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


DATA = PersistentVolume(volume_id="data1", role="gold", disk=100)


def test_a_new_volume_gets_a_directory_and_a_dropped_one_is_deleted() -> None:
    h = AgentHarness()
    h.register()
    h.agent.checkpoint()
    actions = h.master(CheckpointResources(resources=Resources(), volumes=(DATA,)))
    assert of_type(actions, CreateVolume) == [CreateVolume("gold", "data1")]
    assert [r.kind for r in h.agent.checkpoint()] == [RESOURCES]
    actions = h.master(CheckpointResources(resources=Resources(), volumes=(DATA,)))
    assert of_type(actions, CreateVolume) == [], "the same set again: nothing to do"
    actions = h.master(CheckpointResources(resources=Resources()))
    assert of_type(actions, DestroyVolume) == [DestroyVolume("gold", "data1")]


def test_volumes_survive_a_restart_and_are_reported(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "journal"))
    journal.load()
    h = AgentHarness()
    h.register()
    h.master(CheckpointResources(resources=RESERVED, volumes=(DATA,)))
    _commit(h.agent, journal)
    journal.close()
    journal = Journal(str(tmp_path / "journal"))
    saved = journal.load()
    journal.close()
    fresh = AgentHarness()
    actions = fresh.agent.recover(saved, fresh.now, alive=frozenset(), cleanup=False)
    assert of_type(actions, CreateVolume) == [], "the directory is on disk already"
    message = only(of_type(to_master(fresh.connected()), ReregisterAgent))
    assert message.checkpointed_volumes == (DATA,)
    assert message.checkpointed_resources == RESERVED


def test_a_task_holding_a_volume_gets_it_linked_into_its_sandbox_before_launch() -> None:
    h = AgentHarness()
    h.register()
    h.run("t1", role="gold", resources="cpus:1;volumes(gold):{data1}")
    actions = h.start_executor("e")
    link = only(of_type(actions, LinkVolumes))
    assert link.sandbox.endswith("/tasks/t1") and link.sandbox.startswith("frameworks/")
    assert link.resources == Resources.parse("volumes(gold):{data1}")
    assert link.user == "alice"
    launch = next(
        i
        for i, a in enumerate(actions)
        if isinstance(a, ToExecutor) and isinstance(a.message, LaunchTask)
    )
    assert actions.index(link) < launch, "linked before the launch"
