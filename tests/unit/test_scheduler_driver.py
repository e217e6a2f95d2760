"""The scheduler drivers against the real master core behind a minimal ZeroMQ shell.

Every test runs a ``FakeMaster`` (support/fake_master.py): a real ``ZmqServer`` on an ephemeral
loopback port in front of ``agora.master.core.Master``, with agents living inside the shell. So
the driver is exercised over real sockets against real master behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
from agora.sdk import (
    BlockingSchedulerDriver,
    Filters,
    FrameworkInfo,
    Offer,
    Scheduler,
    SchedulerDriver,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    Acknowledge,
    CommandInfo,
    ErrorCode,
    ExecutorInfo,
    ExecutorToFramework,
    ExitedExecutor,
    FrameworkToExecutor,
    GangRequest,
    Heartbeat,
    KillTask,
    Launch,
    MasterInfo,
    Reason,
    RunTask,
    RunTaskGroup,
    ShutdownExecutor,
    StatusUpdateAck,
    Subscribe,
    TaskInfo,
    Teardown,
)
from agora.sdk.resources import Resources
from agora.sdk.scheduler import DriverError
from agora.sdk.transport import CurveClient, CurveServer, generate_keypair
from support.fake_master import FakeAgent, FakeMaster, MasterThread, eventually, eventually_sync

T = TypeVar("T")
FAST = (0.05, 0.5)  # subscribe backoff floor/cap for tests


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Recorder(Scheduler):
    """Records every callback as (name, *args)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.offers_seen: list[Offer] = []
        self.statuses: list[TaskStatus] = []

    def names(self) -> list[str]:
        return [e[0] for e in self.events]

    def registered(self, driver: Any, framework_id: FrameworkID, master_info: MasterInfo) -> None:
        self.events.append(("registered", framework_id, master_info))

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self.events.append(("reregistered", master_info))

    def offers(self, driver: Any, offers: list[Offer]) -> Awaitable[None] | None:
        self.offers_seen.extend(offers)
        self.events.append(("offers", [o.offer_id for o in offers]))
        return None

    def offer_rescinded(self, driver: Any, offer_id: OfferID) -> None:
        self.events.append(("offer_rescinded", offer_id))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        self.statuses.append(status)
        self.events.append(("status_update", status.task_id, status.state))

    def framework_message(
        self, driver: Any, agent_id: AgentID, executor_id: ExecutorID, data: bytes
    ) -> None:
        self.events.append(("framework_message", agent_id, executor_id, data))

    def agent_lost(self, driver: Any, agent_id: AgentID) -> None:
        self.events.append(("agent_lost", agent_id))

    def executor_lost(
        self, driver: Any, agent_id: AgentID, executor_id: ExecutorID, status: int | None
    ) -> None:
        self.events.append(("executor_lost", agent_id, executor_id, status))

    def gang_expired(self, driver: Any, gang_id: GangID, message: str) -> None:
        self.events.append(("gang_expired", gang_id, message))

    def error(self, driver: Any, message: str) -> None:
        self.events.append(("error", message))

    def disconnected(self, driver: Any) -> None:
        self.events.append(("disconnected",))

    def states(self, task_id: str) -> list[TaskState]:
        return [s.state for s in self.statuses if s.task_id == task_id]


def framework(name: str = "test", **kw: Any) -> FrameworkInfo:
    return FrameworkInfo(name=name, failover_timeout=kw.pop("failover_timeout", 60.0), **kw)


def driver_for(
    sched: Scheduler, master: FakeMaster, info: FrameworkInfo | None = None, **kw: Any
) -> SchedulerDriver:
    kw.setdefault("subscribe_backoff", FAST)
    return SchedulerDriver(sched, info or framework(), master.endpoint, **kw)


@contextlib.asynccontextmanager
async def subscribed(
    sched: Scheduler, **kw: Any
) -> AsyncIterator[tuple[FakeMaster, FakeAgent, SchedulerDriver]]:
    """A FakeMaster with one agent (cpus:4;mem:4096) and ``sched``'s driver subscribed to it;
    all stopped on the way out."""
    master = await FakeMaster.start()
    agent = await master.add_agent("a1", "cpus:4;mem:4096")
    driver = driver_for(sched, master, **kw)
    try:
        await driver.start()
        yield master, agent, driver
    finally:
        driver.stop()
        await driver.join()
        await master.aclose()


async def first_offer(sched: Recorder, agent_id: AgentID | None = None) -> Offer:
    def found() -> Offer | None:
        held = [o for o in sched.offers_seen if agent_id is None or o.agent_id == agent_id]
        return held[-1] if held else None

    await eventually(lambda: found() is not None, "an offer")
    offer = found()
    assert offer is not None
    return offer


# --------------------------------------------------------------------------- subscription


def test_subscribe_registers_and_receives_offers() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            assert driver.subscribed and driver.framework_id is not None
            assert sched.events[0][0] == "registered"
            assert sched.events[0][1] == driver.framework_id
            assert sched.events[0][2].epoch == 1
            offer = await first_offer(sched)
            assert offer.agent_id == agent.agent_id
            assert offer.resources == agent.resources
            assert offer.framework_id == driver.framework_id
            assert driver.framework_id in master.core.state.frameworks
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_launch_task_spec_update_and_implicit_acknowledgement() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            offer = await first_offer(sched)
            spec = TaskSpec(
                name="t1",
                command="echo hi",
                resources="cpus:1;mem:128",
                environment={"A": "1"},
                labels={"k": "v"},
                kill_grace_period=2.0,
            )
            driver.launch(offer, [spec], Filters(refuse_seconds=0))
            await eventually(lambda: agent.of_type(RunTask), "RUN_TASK at the agent")
            run_task = agent.of_type(RunTask)[0]
            task = run_task.task
            assert run_task.framework_id == driver.framework_id
            assert (task.task_id, task.name, task.agent_id) == ("t1", "t1", agent.agent_id)
            assert task.command is not None and task.command.value == "echo hi"
            assert task.command.shell and dict(task.command.environment) == {"A": "1"}
            assert dict(task.labels) == {"k": "v"} and task.kill_grace_period == 2.0
            assert str(task.resources) == "cpus:1;mem:128"

            assert driver.framework_id is not None
            update = agent.update(driver.framework_id, "t1", TaskState.RUNNING)
            await master.from_agent(agent, update)
            await eventually(lambda: sched.states("t1") == [TaskState.RUNNING], "RUNNING")
            status = sched.statuses[0]
            assert status.uuid == update.update.status.uuid and status.agent_id == agent.agent_id
            await eventually(lambda: agent.of_type(StatusUpdateAck), "the ACK at the agent")
            ack = agent.of_type(StatusUpdateAck)[0]
            assert (ack.task_id, ack.uuid) == ("t1", status.uuid)
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_explicit_acknowledgements() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master, implicit_acknowledgements=False)
        try:
            await driver.start()
            offer = await first_offer(sched)
            driver.launch(offer, [TaskSpec("t1", ["/bin/true"], "cpus:1;mem:64")])
            await eventually(lambda: agent.of_type(RunTask), "RUN_TASK")
            task = agent.of_type(RunTask)[0].task
            assert task.command is not None and task.command.argv == ("/bin/true",)
            assert not task.command.shell
            assert driver.framework_id is not None
            await master.from_agent(
                agent, agent.update(driver.framework_id, "t1", TaskState.RUNNING)
            )
            await eventually(lambda: sched.statuses, "the update")
            # No automatic ACK: prove it by a round trip after which it would have arrived.
            driver.reconcile(["t1"])
            await eventually(lambda: len(sched.statuses) == 2, "the reconciliation answer")
            assert not master.of_type(Acknowledge) and not agent.of_type(StatusUpdateAck)
            with pytest.raises(ValueError):
                driver.acknowledge(sched.statuses[1])  # reconciliation answers carry no uuid
            driver.acknowledge(sched.statuses[0])
            await eventually(lambda: agent.of_type(StatusUpdateAck), "the explicit ACK")
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_decline_with_filters_and_revive() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        a1 = await master.add_agent("a1", "cpus:4;mem:4096")
        a2 = await master.add_agent("a2", "cpus:2;mem:1024")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            o1 = await first_offer(sched, a1.agent_id)
            o2 = await first_offer(sched, a2.agent_id)
            driver.decline(o1, Filters(refuse_seconds=3600))
            driver.decline(o2.offer_id, Filters(refuse_seconds=0))
            # a2 comes back at the next batch allocation; a1 stays filtered.
            await eventually(
                lambda: sum(o.agent_id == a2.agent_id for o in sched.offers_seen) >= 2,
                "a2 offered again",
            )
            assert sum(o.agent_id == a1.agent_id for o in sched.offers_seen) == 1
            driver.revive()
            await eventually(
                lambda: sum(o.agent_id == a1.agent_id for o in sched.offers_seen) >= 2,
                "a1 offered again after REVIVE",
            )
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_kill_and_reconcile() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            offer = await first_offer(sched)
            driver.launch(
                [offer.offer_id],
                [TaskSpec("t1", "sleep 100", "cpus:1;mem:64"), TaskSpec("t2", "x", "cpus:1")],
            )
            await eventually(lambda: len(agent.of_type(RunTask)) == 2, "two RUN_TASKs")
            fid = driver.framework_id
            assert fid is not None
            await master.from_agent(agent, agent.update(fid, "t1", TaskState.RUNNING))
            await eventually(lambda: sched.states("t1") == [TaskState.RUNNING], "RUNNING")

            kill_id = driver.kill("t1")
            await eventually(lambda: agent.of_type(KillTask), "KILL_TASK at the agent")
            assert agent.of_type(KillTask)[0].task_id == "t1"
            assert agent.of_type(KillTask)[0].kill_id == kill_id != ""  # one id, every hop
            driver.kill("nope", agent.agent_id)  # unknown: the master answers as reconciliation
            await eventually(lambda: sched.states("nope") == [TaskState.LOST], "LOST for unknown")

            sched.statuses.clear()
            driver.reconcile()  # implicit: every live task
            await eventually(lambda: len(sched.statuses) == 2, "implicit reconciliation")
            by_id = {s.task_id: s for s in sched.statuses}
            assert by_id[TaskID("t1")].state is TaskState.RUNNING
            assert by_id[TaskID("t2")].state is TaskState.STAGING
            assert all(s.reason is Reason.RECONCILIATION and s.uuid is None for s in by_id.values())

            sched.statuses.clear()
            status_t1 = by_id[TaskID("t1")]
            driver.reconcile([status_t1, "ghost"])
            await eventually(lambda: len(sched.statuses) == 2, "explicit reconciliation")
            assert sched.states("t1") == [TaskState.RUNNING]
            assert sched.states("ghost") == [TaskState.LOST]
            # Reconciliation answers carry no uuid: nothing was acknowledged for them.
            assert len(agent.of_type(StatusUpdateAck)) == 1
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_launch_checks_offers_locally() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        await master.add_agent("a1", "cpus:1;mem:128")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            with pytest.raises(RuntimeError):
                driver.kill("t")  # no framework id before SUBSCRIBED
            await driver.start()
            offer = await first_offer(sched)
            with pytest.raises(ValueError, match="does not fit"):
                driver.launch(offer, [TaskSpec("big", "x", "cpus:2")])
            with pytest.raises(ValueError, match="unknown offer"):
                driver.launch(OfferID("O-unknown"), [TaskSpec("t", "x", "cpus:1")])
            # Nothing was sent for the refused launches: the offer is still usable.
            driver.launch(offer, [TaskSpec("ok", "x", "cpus:1")])
            await eventually(
                lambda: (
                    any(s.task_id == "ok" for s in sched.statuses) or bool(master.core.state.tasks)
                ),
                "the launch",
            )
            assert (driver.framework_id, TaskID("ok")) in master.core.state.tasks
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_framework_messages_and_executor_failure_reach_the_scheduler() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            fid = driver.framework_id
            assert fid is not None
            msg = ExecutorToFramework(framework_id=fid, executor_id=ExecutorID("e1"), data=b"hi")
            await master.from_agent(agent, msg)
            await eventually(lambda: "framework_message" in sched.names(), "framework message")
            assert ("framework_message", agent.agent_id, "e1", b"hi") in sched.events
            # An executor the master does not know exiting is not reported; launch one first.
            offer = await first_offer(sched)
            executor = ExecutorInfo(
                executor_id=ExecutorID("e1"),
                framework_id=FrameworkID(""),
                command=CommandInfo(value="my-executor"),
            )
            driver.launch(offer, [TaskSpec("t1", "", "cpus:1", executor=executor)])
            await eventually(lambda: agent.of_type(RunTask), "RUN_TASK")
            sent_executor = agent.of_type(RunTask)[0].task.executor
            assert sent_executor is not None and sent_executor.framework_id == fid
            exited = ExitedExecutor(framework_id=fid, executor_id=ExecutorID("e1"), status=-9)
            await master.from_agent(agent, exited)
            await eventually(lambda: "executor_lost" in sched.names(), "executor lost")
            assert ("executor_lost", agent.agent_id, "e1", -9) in sched.events
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


# --------------------------------------------------------------------------- failures


class Raising(Recorder):
    """Every callback raises on its first call; offers is a coroutine."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def _boom(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] == 1:
            raise RuntimeError(f"boom in {name}")

    def registered(self, driver: Any, framework_id: FrameworkID, master_info: MasterInfo) -> None:
        super().registered(driver, framework_id, master_info)
        self._boom("registered")

    async def offers(self, driver: Any, offers: list[Offer]) -> None:
        await asyncio.sleep(0)
        Recorder.offers(self, driver, offers)
        driver.decline(offers, Filters(refuse_seconds=0))
        self._boom("offers")

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        self._boom("status_update")


def test_raising_callbacks_do_not_kill_the_driver() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Raising()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            # The first (async) offers callback raised after declining: offers keep coming.
            await eventually(lambda: sched.calls.get("offers", 0) >= 3, "offers after a raise")
            fid = driver.framework_id
            assert fid is not None
            for state in (TaskState.RUNNING, TaskState.FINISHED):
                await master.from_agent(agent, agent.update(fid, "t9", state))
            await eventually(lambda: len(sched.states("t9")) == 2, "both updates")
            # Acknowledged even though the first status_update raised.
            await eventually(lambda: len(agent.of_type(StatusUpdateAck)) == 2, "two ACKs")
            assert driver.subscribed and not driver.stopped
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_forbidden_subscribe_stops_the_driver_with_the_error() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        master.forbid_subscribe = True
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            with pytest.raises(DriverError) as info:
                await driver.run()
            assert info.value.code is ErrorCode.FORBIDDEN
            assert sched.events == [("error", "SUBSCRIBE forbidden")]
            assert driver.stopped
        finally:
            await master.aclose()

    run(main())


def test_invalid_first_subscribe_is_fatal() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        sched = Recorder()
        driver = driver_for(sched, master, framework(roles=("bad role",)))
        try:
            with pytest.raises(DriverError) as info:
                await driver.start()
            assert info.value.code is ErrorCode.BAD_REQUEST
            assert sched.names() == ["error"]
            with pytest.raises(DriverError):
                await driver.join()
        finally:
            await master.aclose()

    run(main())


def test_scheduler_failover_replaces_the_old_driver() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        old_sched, new_sched = Recorder(), Recorder()
        old = driver_for(old_sched, master)
        new: SchedulerDriver | None = None
        try:
            await old.start()
            fid = old.framework_id
            new = driver_for(new_sched, master, framework(framework_id=fid))
            await new.start()
            assert new_sched.events[0][:2] == ("registered", fid)
            with pytest.raises(DriverError) as info:
                await old.join()
            assert info.value.code is ErrorCode.FORBIDDEN
            assert old_sched.names()[-1] == "error"
            # The old driver stopped without tearing the framework down.
            assert fid in master.core.state.frameworks and new.subscribed
        finally:
            if new is not None:
                new.stop()
                await new.join()
            await master.aclose()

    run(main())


def test_resubscribes_after_master_restart_on_the_same_port() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            fid = driver.framework_id
            await first_offer(sched)
            endpoint = master.endpoint
            await master.aclose()
            await eventually(lambda: "disconnected" in sched.names(), "disconnected")
            assert not driver.subscribed
            # Calls made while disconnected are held and sent once subscribed again.
            driver.reconcile(["held"])
            master = await FakeMaster.start(endpoint, epoch=2)
            await eventually(lambda: "reregistered" in sched.names(), "reregistered", 10.0)
            assert driver.framework_id == fid
            assert fid in master.core.state.frameworks
            names = sched.names()
            assert names.index("registered") < names.index("disconnected")
            assert names.index("disconnected") < names.index("reregistered")
            assert "registered" not in names[names.index("registered") + 1 :]
            # The offer held from the old master was reported rescinded.
            assert "offer_rescinded" in names
            await eventually(lambda: sched.states("held") == [TaskState.LOST], "held call answered")
            reregistered = next(e for e in sched.events if e[0] == "reregistered")
            assert reregistered[1].epoch == 2
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_silent_master_triggers_resubscription() -> None:
    async def main() -> None:
        master = await FakeMaster.start(heartbeat_interval=0.1)
        sched = Recorder()
        driver = driver_for(sched, master, heartbeat_interval=0.05)
        try:
            await driver.start()
            fid = driver.framework_id
            await eventually(lambda: len(master.of_type(Heartbeat)) >= 2, "driver heartbeats")
            master.paused = True  # sockets open, but nothing answered and no heartbeats
            await eventually(lambda: "disconnected" in sched.names(), "silence detected")
            subscribes = len(master.of_type(Subscribe))
            await eventually(lambda: len(master.of_type(Subscribe)) > subscribes, "SUBSCRIBE retry")
            master.paused = False
            await eventually(lambda: "reregistered" in sched.names(), "reregistered")
            assert driver.framework_id == fid and driver.subscribed
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_stop_tears_down_and_failover_stop_keeps_the_framework() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        kept = driver_for(Recorder(), master)
        torn = driver_for(Recorder(), master, framework("torn"))
        try:
            await kept.start()
            await torn.start()
            started = time.monotonic()
            torn.stop()
            await torn.join()
            assert time.monotonic() - started < 1.5  # the TEARDOWN was confirmed, not timed out
            assert master.of_type(Teardown)
            assert torn.framework_id in master.core.state.removed_frameworks
            kept.stop(failover=True)
            await kept.join()
            assert kept.framework_id in master.core.state.frameworks
            assert len(master.of_type(Teardown)) == 1
        finally:
            await master.aclose()

    run(main())


# --------------------------------------------------------------------------- blocking driver


class FinishOne(Recorder):
    """Launches one task on the first offer and stops once it finished."""

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        super().offers(driver, offers)
        if not any(s.task_id == "job" for s in self.statuses) and len(self.offers_seen) == 1:
            driver.launch(offers[0], [TaskSpec("job", "echo done", "cpus:1;mem:32")])
        else:
            driver.decline(offers)

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        super().status_update(driver, status)
        if status.state is TaskState.FINISHED:
            driver.stop()


def test_blocking_driver_runs_a_scheduler_from_sync_code() -> None:
    with MasterThread() as mt:
        agent = mt.add_agent("a1", "cpus:2;mem:256", auto=True)
        sched = FinishOne()
        driver = BlockingSchedulerDriver(
            sched, framework("blocking"), mt.endpoint, subscribe_backoff=FAST
        )
        driver.run(timeout=20)
        assert sched.states("job") == [TaskState.RUNNING, TaskState.FINISHED]
        assert sched.names()[0] == "registered"
        assert isinstance(sched.events[0][1], FrameworkID)
        assert len(agent.of_type(StatusUpdateAck)) == 2
        # stop() without failover tore the framework down.
        assert driver.framework_id in mt.master.core.state.removed_frameworks


def test_blocking_driver_calls_from_the_calling_thread() -> None:
    with MasterThread() as mt:
        agent = mt.add_agent("a1", "cpus:2;mem:256", auto=True)
        sched = Recorder()
        with BlockingSchedulerDriver(
            sched, framework("calls"), mt.endpoint, subscribe_backoff=FAST
        ) as driver:
            assert driver.subscribed and driver.framework_id is not None
            eventually_sync(lambda: bool(sched.offers_seen), "an offer")
            driver.launch(sched.offers_seen[0], [TaskSpec("t1", "true", "cpus:1")])
            eventually_sync(lambda: TaskState.FINISHED in sched.states("t1"), "t1 finished")
            driver.reconcile(["t1"])
            eventually_sync(lambda: len(sched.states("t1")) == 3, "reconciliation answer")
        assert len(agent.of_type(StatusUpdateAck)) == 2
        assert driver.framework_id in mt.master.core.state.removed_frameworks


def test_blocking_driver_timeout_and_refusal() -> None:
    with MasterThread() as mt:
        sched = Recorder()
        driver = BlockingSchedulerDriver(sched, framework(), mt.endpoint, subscribe_backoff=FAST)
        with pytest.raises(TimeoutError):
            driver.run(timeout=0.3)
        assert driver.framework_id in mt.master.core.state.removed_frameworks

        mt.master.forbid_subscribe = True
        refused = BlockingSchedulerDriver(Recorder(), framework(), mt.endpoint)
        with pytest.raises(DriverError):
            refused.run(timeout=10)


# --------------------------------------------------------------------------- throughput


class Throughput(Scheduler):
    """Launches ``total`` tiny tasks as offers come and counts FINISHED updates."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.launched = 0
        self.finished = 0

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        for offer in offers:
            n = min(int(offer.resources.scalar("cpus") * 10), self.total - self.launched)
            specs = [TaskSpec(f"t{self.launched + i}", "true", "cpus:0.1") for i in range(n)]
            self.launched += n
            driver.launch(offer, specs, Filters(refuse_seconds=0))

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        if status.state is TaskState.FINISHED:
            self.finished += 1
            if self.finished == self.total:
                driver.stop()


def test_end_to_end_task_rate() -> None:
    total = 2000

    async def main() -> float:
        master = await FakeMaster.start(allocation_interval=0.01, tick=0.005)
        for i in range(4):
            await master.add_agent(f"a{i}", "cpus:50;mem:100000", auto=True)
        sched = Throughput(total)
        driver = SchedulerDriver(sched, framework("rate"), master.endpoint)
        try:
            started = time.monotonic()
            await driver.run()
            return total / (time.monotonic() - started)
        finally:
            await master.aclose()

    rate = run(main(), timeout=60)
    print(f"scheduler driver end-to-end: {rate:.0f} tasks/s")
    assert rate > 0


def test_cancelled_start_aborts_the_driver() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        endpoint = master.endpoint
        await master.aclose()  # nobody answers on this port any more
        sched = Recorder()
        driver = SchedulerDriver(sched, framework(), endpoint, subscribe_backoff=FAST)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await driver.start()
        assert driver.stopped
        await driver.join()  # returns: stopped, no error
        assert sched.events == []

    run(main())


def test_bad_master_address_fails_start_and_join_returns() -> None:
    async def main() -> None:
        driver = SchedulerDriver(Recorder(), framework(), "not-an-endpoint")
        with pytest.raises(Exception):  # noqa: B017 - whatever ZeroMQ says about the address
            await driver.start()
        assert driver.stopped
        await driver.join()

    run(main())


class _BrokenLogger:
    """Every log call fails, as printing to a closed stream does."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> None:
            raise ValueError("I/O operation on closed file.")

        return fail


def test_a_failing_logger_does_not_stop_the_driver() -> None:
    def factory(*args: Any) -> Any:
        if args and args[0] == "agora.sdk.scheduler.driver":
            return _BrokenLogger()
        return structlog.PrintLogger(io.StringIO())

    saved = structlog.get_config()
    structlog.configure(logger_factory=factory, cache_logger_on_first_use=False)
    try:
        test_raising_callbacks_do_not_kill_the_driver()
        test_forbidden_subscribe_stops_the_driver_with_the_error()
    finally:
        structlog.configure(**saved)


def test_group_launch_raw_accept_messages_and_executor_shutdown() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        a1 = await master.add_agent("a1", "cpus:4;mem:4096")
        a2 = await master.add_agent("a2", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            fid = driver.framework_id
            assert fid is not None
            o1 = await first_offer(sched, a1.agent_id)
            o2 = await first_offer(sched, a2.agent_id)
            executor = ExecutorInfo(
                executor_id=ExecutorID("gx"),
                framework_id=FrameworkID(""),
                command=CommandInfo(value="group-executor"),
                resources=Resources.parse("cpus:0.5"),
            )
            group = [TaskSpec("g1", "w 1", "cpus:1"), TaskSpec("g2", "w 2", "cpus:1")]
            driver.launch_group(o1, executor, group)
            await eventually(lambda: a1.of_type(RunTaskGroup), "RUN_TASK_GROUP")
            run_group = a1.of_type(RunTaskGroup)[0]
            assert run_group.executor.framework_id == fid
            assert [t.task_id for t in run_group.task_group.tasks] == ["g1", "g2"]

            raw = TaskInfo(
                task_id=TaskID("raw"),
                name="raw",
                agent_id=o2.agent_id,
                resources=Resources.parse("cpus:1"),
                command=CommandInfo(value="raw"),
            )
            driver.accept([o2.offer_id], [Launch(task_infos=(raw,))])
            await eventually(lambda: a2.of_type(RunTask), "RUN_TASK from a raw ACCEPT")
            assert a2.of_type(RunTask)[0].task == raw

            driver.message(a1.agent_id or "", "gx", b"ping")
            await eventually(lambda: a1.of_type(FrameworkToExecutor), "FRAMEWORK_TO_EXECUTOR")
            assert a1.of_type(FrameworkToExecutor)[0].data == b"ping"
            driver.shutdown_executor(a1.agent_id or "", "gx")
            await eventually(lambda: a1.of_type(ShutdownExecutor), "SHUTDOWN_EXECUTOR")
            assert a1.of_type(ShutdownExecutor)[0].executor_id == "gx"
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_gang_expiry_agent_loss_and_master_rescinds() -> None:
    async def main() -> None:
        master = await FakeMaster.start(agent_ping_interval=0.05, max_agent_ping_timeouts=2)
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master)
        try:
            await driver.start()
            offer = await first_offer(sched)
            gang = GangRequest(
                gang_id=GangID("huge"),
                role="*",
                count=2,
                shape=Resources.parse("cpus:100"),
                hold_timeout=0.1,
            )
            driver.request([gang])
            await eventually(lambda: "gang_expired" in sched.names(), "gang expiry")
            assert next(e for e in sched.events if e[0] == "gang_expired")[1] == "huge"

            agent.mute = True  # no more PONGs: the master marks the agent unreachable
            await eventually(lambda: "agent_lost" in sched.names(), "agent lost")
            assert ("agent_lost", agent.agent_id) in sched.events
            assert ("offer_rescinded", offer.offer_id) in sched.events
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_suppressed_roles_ride_along_on_resubscription() -> None:
    async def main() -> None:
        master = await FakeMaster.start(heartbeat_interval=0.1)
        await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Recorder()
        driver = driver_for(sched, master, heartbeat_interval=0.05)
        try:
            await driver.start()
            offer = await first_offer(sched)
            driver.suppress()
            driver.decline(offer, Filters(refuse_seconds=0))

            async def resubscribe() -> Subscribe:
                before = len(master.of_type(Subscribe))
                master.paused = True
                await eventually(lambda: len(master.of_type(Subscribe)) > before, "SUBSCRIBE")
                master.paused = False
                await eventually(lambda: driver.subscribed, "subscribed again")
                return master.of_type(Subscribe)[-1]

            assert (await resubscribe()).suppressed_roles == ("*",)
            offers_before = len(sched.offers_seen)
            driver.revive()
            await eventually(lambda: len(sched.offers_seen) > offers_before, "offers after REVIVE")
            assert (await resubscribe()).suppressed_roles == ()
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_curve_admitted_scheduler_subscribes_and_a_stranger_is_refused(tmp_path: Path) -> None:
    authorized = tmp_path / "authorized"
    _, master_secret = generate_keypair(tmp_path / "master", "master")
    master_public = tmp_path / "master" / "master.key"
    framework_public, framework_secret = generate_keypair(tmp_path / "fw", "fw")
    _, stranger_secret = generate_keypair(tmp_path / "stranger", "stranger")
    authorized.mkdir()
    (authorized / "fw.key").write_bytes(framework_public.read_bytes())

    async def main() -> None:
        master = await FakeMaster.start(curve=CurveServer(master_secret, authorized))
        admitted = driver_for(
            Recorder(), master, curve=CurveClient(framework_secret, master_public)
        )
        refused_sched = Recorder()
        refused = driver_for(
            refused_sched, master, curve=CurveClient(stranger_secret, master_public)
        )
        try:
            await admitted.start()
            assert admitted.subscribed
            with pytest.raises(DriverError) as info:
                await refused.start()
            assert info.value.code is ErrorCode.FORBIDDEN
            assert refused_sched.names() == ["error"]
        finally:
            admitted.stop()
            await admitted.join()
            await master.aclose()

    run(main())
