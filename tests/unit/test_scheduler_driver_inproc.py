"""A framework, the master daemon and an agent in one process: the scheduler driver takes its
link to the master as a parameter, so the in-process transport carries it (every message still
encoded and decoded)."""

from __future__ import annotations

import asyncio
import uuid

from agora.master.core import Master, MasterConfig
from agora.master.server.daemon import MasterDaemon
from agora.sdk import FrameworkInfo, Offer, Scheduler, SchedulerCalls, TaskSpec, TaskState
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    Message,
    RegisterAgent,
    RunTask,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskStatus,
)
from agora.sdk.resources import Resources
from agora.sdk.scheduler import SchedulerDriver
from agora.sdk.transport import InprocClient, InprocHub

DEADLINE = 10.0


class OneTask(Scheduler):
    def __init__(self) -> None:
        self.launched = False
        self.states: list[TaskState] = []

    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> None:
        for offer in offers:
            if self.launched:
                driver.decline(offer)
            else:
                self.launched = True
                driver.launch(offer, [TaskSpec("t1", "true", "cpus:1;mem:64")])

    def status_update(self, driver: SchedulerCalls, status: TaskStatus) -> None:
        self.states.append(status.state)


async def _next(client: InprocClient, kind: type[Message]) -> Message:
    async with asyncio.timeout(DEADLINE):
        while True:
            message = (await client.recv()).message
            if isinstance(message, kind):
                return message


def test_a_framework_runs_a_task_through_the_master_daemon_in_one_process() -> None:
    async def scenario() -> None:
        hub = InprocHub()
        server = hub.server("master")
        daemon = MasterDaemon(
            Master(MasterConfig(allocation_interval=0.01)),
            server,
            tick_interval=0.01,
            peer_timeout=60.0,
        )
        running = asyncio.create_task(daemon.run())
        agent = hub.client("master")
        sched = OneTask()
        driver = SchedulerDriver(
            sched,
            FrameworkInfo(name="inproc"),
            link=lambda up, down: hub.client("master", on_connected=up, on_disconnected=down),
        )
        try:
            info = AgentInfo(hostname="a1", resources=Resources.parse("cpus:2;mem:256"))
            await agent.send(RegisterAgent(agent_info=info))
            registered = await _next(agent, AgentRegistered)
            await asyncio.wait_for(driver.start(), DEADLINE)
            run = await _next(agent, RunTask)
            assert isinstance(run, RunTask) and run.task.task_id == "t1"
            status = TaskStatus(
                task_id=run.task.task_id,
                state=TaskState.FINISHED,
                source=StatusSource.EXECUTOR,
                agent_id=registered.agent_id,  # type: ignore[attr-defined]
                uuid=uuid.uuid4().bytes,
            )
            update = StatusUpdate(framework_id=run.framework_id, status=status)
            await agent.send(StatusUpdateMessage(update=update))
            ack = await _next(agent, StatusUpdateAck)  # the driver acknowledged it
            assert isinstance(ack, StatusUpdateAck) and ack.uuid == status.uuid
            assert sched.states == [TaskState.FINISHED]
        finally:
            driver.stop()
            await asyncio.wait_for(driver.join(), DEADLINE)
            agent.close()
            daemon.stop()
            assert await asyncio.wait_for(running, DEADLINE) == 0
            server.close()

    asyncio.run(asyncio.wait_for(scenario(), 30.0))
