"""The operator client against the real master core behind a minimal ZeroMQ shell."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from agora.sdk import Scheduler
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    ErrorCode,
    FrameworkInfo,
    KillTask,
    Offer,
    RunTask,
    Subscribe,
    Subscribed,
    TaskState,
)
from agora.sdk.operator import OperatorClient, OperatorError
from agora.sdk.scheduler import SchedulerDriver, TaskSpec
from agora.sdk.transport import ZmqClient, ZmqServer
from support.fake_master import FakeMaster, MasterThread, eventually

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Holder(Scheduler):
    def __init__(self) -> None:
        self.offers_seen: list[Offer] = []

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        self.offers_seen.extend(offers)


def test_get_state_and_kill() -> None:
    async def main() -> None:
        master = await FakeMaster.start()
        agent = await master.add_agent("a1", "cpus:4;mem:4096")
        sched = Holder()
        driver = SchedulerDriver(sched, FrameworkInfo(name="ops-test", user="me"), master.endpoint)
        client = OperatorClient(master.endpoint)
        try:
            await driver.start()
            await eventually(lambda: bool(sched.offers_seen), "an offer")
            driver.launch(sched.offers_seen[0], [TaskSpec("t1", "sleep 9", "cpus:1;mem:64")])
            await eventually(lambda: agent.of_type(RunTask), "RUN_TASK")

            state = await client.get_state(timeout=5)
            assert state.master_info.epoch == 1
            assert [(a.agent_id, a.hostname, a.status) for a in state.agents] == [
                (agent.agent_id, "a1", "ACTIVE")
            ]
            assert [(f.framework_id, f.name, f.user, f.active) for f in state.frameworks] == [
                (driver.framework_id, "ops-test", "me", True)
            ]
            [task] = state.tasks
            assert (task.task_id, task.framework_id, task.state) == (
                "t1",
                driver.framework_id,
                TaskState.STAGING,
            )

            await client.kill("t1")
            await eventually(lambda: agent.of_type(KillTask), "KILL_TASK at the agent")
            assert agent.of_type(KillTask)[0].task_id == "t1"
            await client.kill(TaskID("t1"), driver.framework_id)

            with pytest.raises(OperatorError) as info:
                await client.kill("ghost")
            assert info.value.code is ErrorCode.UNKNOWN_TASK
            with pytest.raises(OperatorError):
                await client.kill("t1", FrameworkID("no-such-framework"))
        finally:
            driver.stop()
            await driver.join()
            await master.aclose()

    run(main())


def test_answers_are_not_confused_with_other_traffic() -> None:
    """Each call has its own connection: a scheduler's events never reach an operator call."""

    async def main() -> None:
        master = await FakeMaster.start()
        # A raw client subscribes, so the master has a framework to report.
        raw = ZmqClient.connect(master.endpoint)
        try:
            await raw.send(Subscribe(framework_info=FrameworkInfo(name="raw")))
            reply = await asyncio.wait_for(raw.recv(), 5)
            assert isinstance(reply.message, Subscribed)
            client = OperatorClient(master.endpoint)
            states = await asyncio.gather(*(client.get_state() for _ in range(5)))
            assert all(len(s.frameworks) == 1 for s in states)
        finally:
            raw.close()
            await master.aclose()

    run(main())


def test_sync_wrappers() -> None:
    with MasterThread() as mt:
        agent = mt.add_agent("a1", "cpus:2;mem:256")
        client = OperatorClient(mt.endpoint)
        state = client.get_state_sync(timeout=5)
        assert [a.agent_id for a in state.agents] == [agent.agent_id]
        assert state.frameworks == () and state.tasks == ()
        with pytest.raises(OperatorError) as info:
            client.kill_sync("nothing", timeout=5)
        assert info.value.code is ErrorCode.UNKNOWN_TASK


def test_timeout_when_no_master_answers() -> None:
    async def free_endpoint() -> str:
        server = ZmqServer.bind("tcp://127.0.0.1:0")
        endpoint = server.endpoint
        server.close()
        return endpoint

    endpoint = run(free_endpoint())
    client = OperatorClient(endpoint)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        client.get_state_sync(timeout=0.3)
    assert time.monotonic() - started < 3


def test_sync_wrapper_inside_a_running_loop_is_refused() -> None:
    with MasterThread() as mt:
        client = OperatorClient(mt.endpoint)

        async def inside() -> None:
            with pytest.raises(RuntimeError):
                client.get_state_sync()

        asyncio.run(inside())


def test_the_client_prints_nothing_on_stdout_of_a_program_that_did_not_set_up_logging() -> None:
    """A library's logs never land in its user's stdout (which may be their data): unless the
    program configured structlog, only warnings and errors, on stderr."""
    script = (
        "from agora.sdk.operator import OperatorClient\n"
        "client = OperatorClient('tcp://127.0.0.1:1')\n"
        "try:\n"
        "    client.get_state_sync(timeout=0.3)\n"
        "except TimeoutError:\n"
        "    print('timed out')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "timed out\n"
