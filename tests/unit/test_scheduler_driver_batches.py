"""The scheduler driver and batches: it announces that it reads UPDATES, hands each status in
one to the scheduler in order, and acknowledges a run of updates with one ACKNOWLEDGEMENTS, but
only to a master that announced it reads that."""

from __future__ import annotations

from typing import Any

import pytest
from agora.sdk.messages import (
    Acknowledge,
    Acknowledgements,
    Revive,
    StatusUpdateAck,
    Subscribe,
    TaskState,
    TaskStatus,
    Updates,
)
from agora.sdk.messages.batching import BATCHES
from support.fake_master import FakeAgent, FakeMaster, eventually
from test_scheduler_driver import Recorder, run, subscribed

TASKS = ("t1", "t2", "t3")


async def _send_updates(master: FakeMaster, agent: FakeAgent, framework_id: str) -> Updates:
    """Three RUNNING updates, sent to the framework as one UPDATES."""
    (peer,) = [p for p, m in master.received if isinstance(m, Subscribe)]
    statuses = tuple(
        agent.update(framework_id, t, TaskState.RUNNING).update.status  # type: ignore[arg-type]
        for t in TASKS
    )
    batch = Updates(statuses=statuses)
    await master.server.send(peer, batch, master.core.epoch)
    return batch


async def _all_acked(agent: FakeAgent) -> None:
    await eventually(lambda: len(agent.of_type(StatusUpdateAck)) == len(TASKS), "acks")


def test_updates_reach_the_scheduler_in_order_and_are_acknowledged_in_one_message() -> None:
    async def main() -> None:
        sched = Recorder()
        async with subscribed(sched) as (master, agent, driver):
            assert driver.framework_id is not None
            (subscribe,) = master.of_type(Subscribe)
            assert BATCHES in subscribe.features
            batch = await _send_updates(master, agent, driver.framework_id)
            await eventually(lambda: len(sched.statuses) == len(TASKS), "three statuses")
            assert [s.task_id for s in sched.statuses] == list(TASKS)
            await _all_acked(agent)
            (acks,) = master.of_type(Acknowledgements)
            assert [(a.task_id, a.uuid) for a in acks.acks] == [
                (s.task_id, s.uuid) for s in batch.statuses
            ]
            assert not master.of_type(Acknowledge)

    run(main())


def test_a_master_that_does_not_read_batches_gets_one_acknowledge_per_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agora.master.core.state as master_state

    monkeypatch.setattr(master_state, "FEATURES", ())  # a master from before batches

    async def main() -> None:
        async with subscribed(Recorder()) as (master, agent, driver):
            assert driver.framework_id is not None
            await _send_updates(master, agent, driver.framework_id)
            await _all_acked(agent)
            assert [a.task_id for a in master.of_type(Acknowledge)] == list(TASKS)
            assert not master.of_type(Acknowledgements)

    run(main())


class Reviver(Recorder):
    """Calls the master from its status callback, as a scheduler launching as tasks end does."""

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        driver.revive()


def test_acknowledgements_are_gathered_past_calls_queued_between_them() -> None:
    async def main() -> None:
        async with subscribed(Reviver()) as (master, agent, driver):
            assert driver.framework_id is not None
            await _send_updates(master, agent, driver.framework_id)
            await _all_acked(agent)
            await eventually(lambda: len(master.of_type(Revive)) == len(TASKS), "the revives")
            (acks,) = master.of_type(Acknowledgements)
            assert [a.task_id for a in acks.acks] == list(TASKS)
            assert not master.of_type(Acknowledge)

    run(main())
