"""Inverse offers in the scheduler SDK: the sans-IO core holds them and queues the answers; the
driver hands them to ``Scheduler.inverse_offers`` (a no-op by default) and its
``accept_inverse_offers`` reaches the master, which records the answer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from agora.sdk import Scheduler, TaskSpec
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AcceptInverseOffers,
    DeclineInverseOffers,
    FrameworkInfo,
    InverseOffer,
    MasterInfo,
    RunTask,
    ScheduleMaintenance,
    Subscribed,
    TaskState,
)
from agora.sdk.scheduler import SchedulerDriver
from agora.sdk.scheduler.core import SchedulerCore
from support.fake_master import FakeMaster, eventually
from test_scheduler_driver import Recorder, driver_for, first_offer, run

FID = FrameworkID("fw-1")


def _core() -> SchedulerCore:
    core = SchedulerCore(FrameworkInfo(name="t"))
    info = MasterInfo(master_id="m", address="tcp://m", epoch=1)
    core.on_subscribed(
        Subscribed(framework_id=FID, heartbeat_interval_seconds=15.0, master_info=info)
    )
    return core


def _io(n: int) -> InverseOffer:
    return InverseOffer(
        inverse_offer_id=f"io{n}", framework_id=FID, agent_id=AgentID("a"), start=10, duration=5
    )


def test_core_holds_inverse_offers_and_queues_answers() -> None:
    core = _core()
    core.outbox.clear()
    core.on_inverse_offers([_io(1), _io(2), _io(3)])
    assert set(core.inverse_offers) == {"io1", "io2", "io3"}
    core.answer_inverse_offers([_io(1), "io2"], True)
    core.answer_inverse_offers(["io3"], False)
    assert list(core.outbox) == [
        AcceptInverseOffers(framework_id=FID, inverse_offer_ids=("io1", "io2")),
        DeclineInverseOffers(framework_id=FID, inverse_offer_ids=("io3",)),
    ]
    assert not core.inverse_offers
    core.on_inverse_offers([_io(4)])
    core.on_rescind_inverse_offer("io4")
    assert not core.inverse_offers
    with pytest.raises(ValueError, match="no inverse offers"):
        core.answer_inverse_offers([], True)


def test_the_default_callback_does_nothing() -> None:
    assert Scheduler().inverse_offers(None, [_io(1)]) is None  # type: ignore[arg-type]
    assert Scheduler().inverse_offer_rescinded(None, "io1") is None  # type: ignore[arg-type]


class Vacating(Recorder):
    """Accepts every inverse offer it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.inverse: list[InverseOffer] = []

    def inverse_offers(self, driver: Any, inverse_offers: list[InverseOffer]) -> None:
        self.inverse.extend(inverse_offers)
        driver.accept_inverse_offers(inverse_offers)


def test_driver_delivers_inverse_offers_and_the_master_records_the_accept() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Vacating()
        driver: SchedulerDriver = driver_for(sched, master)
        try:
            await driver.start()
            offer = await first_offer(sched)
            driver.launch(offer, [TaskSpec(name="t1", command="sleep 60", resources="cpus:1")])
            await eventually(lambda: agent.of_type(RunTask), "RUN_TASK at the agent")
            assert driver.framework_id is not None
            await master.from_agent(
                agent, agent.update(driver.framework_id, "t1", TaskState.RUNNING)
            )
            call = ScheduleMaintenance(
                agent_ids=(agent.agent_id,), start=time.time() + 600, duration=60
            )
            await master.from_agent(agent, call)  # the core leaves who may call to the daemon
            await eventually(lambda: sched.inverse, "an inverse offer at the scheduler")
            [io] = sched.inverse
            assert (io.agent_id, io.framework_id) == (agent.agent_id, driver.framework_id)
            ms = master.core.state.maintenance
            await eventually(
                lambda: ms.inverse_offers[io.inverse_offer_id].answer == "ACCEPTED", "ACCEPTED"
            )
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())
