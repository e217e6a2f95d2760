"""The executor driver takes how to reach its agent as a parameter: over the in-process transport
it registers with an agent-side server in the same process (no socket, no port), and a status
update it sends is acknowledged and leaves its unacknowledged list."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agora.sdk.executor import Executor, ExecutorDriver
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    ExecutorRegistered,
    FrameworkInfo,
    Message,
    RegisterExecutor,
    StatusSource,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from agora.sdk.transport import InprocClient, InprocHub, InprocServer
from support.executor_kit import AGENT_ID, AGENT_INFO, EXECUTOR_ID, EXECUTOR_INFO, FRAMEWORK_ID

DEADLINE = 10.0
SECRET = "the-executors-own-secret"
ENVIRON = {
    "AGORA_AGENT_ENDPOINT": "inproc-hub://agent-executors",
    "AGORA_FRAMEWORK_ID": FRAMEWORK_ID,
    "AGORA_EXECUTOR_ID": EXECUTOR_ID,
    "AGORA_AGENT_ID": AGENT_ID,
    "AGORA_SANDBOX": "/tmp",
    "AGORA_EXECUTOR_SECRET": SECRET,
}


class Registered(Executor):
    """Sends one TASK_RUNNING once the agent has accepted the registration."""

    def registered(self, driver: ExecutorDriver, *_: object) -> None:
        driver.send_status_update(
            TaskStatus(task_id=TaskID("t1"), state=TaskState.RUNNING, source=StatusSource.EXECUTOR)
        )


async def next_message(agent: InprocServer) -> Message:
    """The next frame the agent side receives, decoded, within the deadline."""
    async with asyncio.timeout(DEADLINE):
        frame = await agent.recv()
    assert frame.message is not None, frame
    return frame.message


def test_the_driver_registers_and_has_its_update_acknowledged_in_process() -> None:
    async def main() -> None:
        hub = InprocHub()
        agent = hub.server("agent-executors")
        dialled: list[str] = []

        def dial(endpoint: str, up: Callable[[], None], down: Callable[[], None]) -> InprocClient:
            dialled.append(endpoint)
            return hub.client(endpoint.split("://", 1)[1], on_connected=up, on_disconnected=down)

        driver = ExecutorDriver(Registered(), environ=ENVIRON, dial=dial)
        running = asyncio.create_task(driver.run())
        try:
            register = await next_message(agent)
            assert isinstance(register, RegisterExecutor)
            assert (register.framework_id, register.executor_id) == (FRAMEWORK_ID, EXECUTOR_ID)
            assert register.secret == SECRET
            (peer,) = agent.peers
            await agent.send(
                peer,
                ExecutorRegistered(
                    executor_info=EXECUTOR_INFO,
                    framework_id=FRAMEWORK_ID,
                    framework_info=FrameworkInfo(name="test", framework_id=FRAMEWORK_ID),
                    agent_id=AGENT_ID,
                    agent_info=AGENT_INFO,
                ),
            )
            update = await next_message(agent)
            assert isinstance(update, StatusUpdateMessage)
            status = update.update.status
            assert (status.task_id, status.state) == ("t1", TaskState.RUNNING)
            assert status.uuid is not None
            assert driver.registered
            assert [u.status.uuid for u in driver.unacknowledged_updates] == [status.uuid]
            ack = StatusUpdateAck(framework_id=FRAMEWORK_ID, task_id=TaskID("t1"), uuid=status.uuid)
            await agent.send(peer, ack)
            async with asyncio.timeout(DEADLINE):
                while driver.unacknowledged_updates:
                    await asyncio.sleep(0.005)
            assert dialled == ["inproc-hub://agent-executors"]
        finally:
            driver.stop()
            assert await asyncio.wait_for(running, DEADLINE) == 0
            assert agent.peers == frozenset()  # the driver closed its link on the way out
            agent.close()

    asyncio.run(asyncio.wait_for(main(), 30.0))
