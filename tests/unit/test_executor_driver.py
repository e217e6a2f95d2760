"""agora.sdk.executor: ExecutorDriver in-process against a fake agent on tcp loopback.

The driver and the fake agent (a real ZmqServer) share one event loop; the executor under test is
a small recording Executor. Also: the environment contract and the streamed-output payload.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import msgpack
import pytest
import zmq
import zmq.asyncio
from agora.sdk.codec import encode
from agora.sdk.errors import ProtocolError
from agora.sdk.executor import (
    DEFAULT_RECOVERY_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE_PERIOD,
    MAX_OUTPUT_CHUNK,
    OUTPUT_LABEL,
    Executor,
    ExecutorDriver,
    ExecutorEnvironment,
    decode_output,
    decode_output_at,
    encode_output,
)
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    ExecutorInfo,
    ExecutorRegistered,
    ExecutorToFramework,
    FrameworkInfo,
    FrameworkToExecutor,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    Ping,
    RegisterExecutor,
    ReregisterExecutor,
    ShutdownExecutor,
    StatusSource,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from support.executor_kit import (
    AGENT_ID,
    AGENT_INFO,
    EXECUTOR_ID,
    EXECUTOR_INFO,
    FRAMEWORK_ID,
    FakeAgent,
    task,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll ``condition`` (state the driver changes without telling anyone) with a deadline."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


#: What the agent would put in AGORA_EXECUTOR_SECRET.
SECRET = "the-executors-own-secret"


def environ(endpoint: str, **extra: str) -> dict[str, str]:
    env = {
        "AGORA_AGENT_ENDPOINT": endpoint,
        "AGORA_FRAMEWORK_ID": FRAMEWORK_ID,
        "AGORA_EXECUTOR_ID": EXECUTOR_ID,
        "AGORA_AGENT_ID": AGENT_ID,
        "AGORA_SANDBOX": "/tmp",
        "AGORA_EXECUTOR_SECRET": SECRET,
    }
    env.update(extra)
    return env


class Recorder(Executor):
    """Records every callback; ``launch_task`` answers RUNNING (and FINISHED when asked)."""

    def __init__(self, *, finish: bool = True, async_launch: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.finish = finish
        self.async_launch = async_launch
        self.changed = asyncio.Event()
        self.shutdown_done = False

    def note(self, name: str, value: Any = None) -> None:
        self.calls.append((name, value))
        self.changed.set()

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def registered(
        self,
        driver: ExecutorDriver,
        executor_info: ExecutorInfo,
        framework_info: FrameworkInfo,
        agent_info: AgentInfo,
    ) -> None:
        self.note("registered", (executor_info, framework_info, agent_info))

    def reregistered(self, driver: ExecutorDriver, agent_info: AgentInfo) -> None:
        self.note("reregistered", agent_info)

    def disconnected(self, driver: ExecutorDriver) -> None:
        self.note("disconnected")

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> Any:
        if self.async_launch:
            return self._launch_later(driver, task)
        self._launch(driver, task)
        return None

    async def _launch_later(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        await asyncio.sleep(0)
        self._launch(driver, task)

    def _launch(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        self.note("launch_task", task)
        if task.task_id == "boom":
            raise RuntimeError("a bug in the executor")
        for state in (
            (TaskState.RUNNING, TaskState.FINISHED) if self.finish else (TaskState.RUNNING,)
        ):
            driver.send_status_update(
                TaskStatus(task_id=task.task_id, state=state, source=StatusSource.MASTER)
            )

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> None:
        self.note("launch_task_group", group)

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        self.note("kill_task", task_id)

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        self.note("framework_message", data)
        driver.send_framework_message(b"echo:" + data)

    async def shutdown(self, driver: ExecutorDriver) -> None:
        self.note("shutdown")
        await asyncio.sleep(0.05)
        self.shutdown_done = True

    def error(self, driver: ExecutorDriver, message: str) -> None:
        self.note("error", message)

    async def wait(self, condition: Callable[[], Any], timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                self.changed.clear()
                value = condition()
                if value:
                    return value
                await self.changed.wait()


class Harness:
    """A fake agent plus a driver running the given executor, both on the current loop."""

    def __init__(self, executor: Executor, agent: FakeAgent, **env: str) -> None:
        self.executor = executor
        self.agent = agent
        self.driver = ExecutorDriver(executor, environ=environ(agent.endpoint, **env))
        self.run_task: asyncio.Task[int] = asyncio.get_running_loop().create_task(self.driver.run())

    async def result(self, timeout: float = 10.0) -> int:
        return await asyncio.wait_for(asyncio.shield(self.run_task), timeout)

    async def close(self) -> None:
        self.driver.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.run_task, 10)
        await self.agent.close()


async def harness(executor: Executor, **agent_options: Any) -> Harness:
    env = {k: agent_options.pop(k) for k in list(agent_options) if k.startswith("AGORA_")}
    return Harness(executor, FakeAgent.start(**agent_options), **env)


async def with_harness(
    executor: Executor, body: Callable[[Harness], Awaitable[None]], **agent_options: Any
) -> None:
    h = await harness(executor, **agent_options)
    try:
        await body(h)
    finally:
        await h.close()


def launch(task_id: str) -> LaunchTask:
    return LaunchTask(framework_id=FRAMEWORK_ID, task=task(task_id, "true"))


# --------------------------------------------------------------------------- registration


def test_registers_then_dispatches_launch_and_reports_filled_in_updates() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await rec.wait(lambda: "registered" in rec.names())
        executor_info, framework_info, agent_info = rec.calls[0][1]
        assert executor_info == EXECUTOR_INFO and agent_info == AGENT_INFO
        assert framework_info.framework_id == FRAMEWORK_ID
        assert h.driver.registered and h.driver.agent_id == AGENT_ID
        assert h.driver.framework_info == framework_info
        assert [m.secret for m in h.agent.messages(RegisterExecutor)] == [SECRET]

        await h.agent.send(launch("t1"))
        final = await h.agent.wait_terminal("t1")
        assert h.agent.states("t1") == [TaskState.RUNNING, TaskState.FINISHED]
        assert final.source is StatusSource.EXECUTOR  # the driver overrides the source
        assert final.executor_id == EXECUTOR_ID and final.agent_id == AGENT_ID
        assert final.uuid is not None and len(final.uuid) == 16
        assert final.timestamp > 1e9
        update = h.agent.messages(StatusUpdateMessage)[-1].update
        assert update.framework_id == FRAMEWORK_ID
        # Both updates acknowledged: nothing left to resend.
        await until(lambda: not h.driver.unacknowledged_updates)

    run(with_harness(Recorder(), body))


def test_registration_is_retried_until_the_agent_answers() -> None:
    async def body(h: Harness) -> None:
        await h.agent.wait_for(lambda: len(h.agent.messages(RegisterExecutor)) >= 2)
        assert not h.driver.registered
        h.agent.answer_registration = True
        rec = h.executor
        assert isinstance(rec, Recorder)
        await rec.wait(lambda: "registered" in rec.names())
        assert rec.names().count("registered") == 1

    run(with_harness(Recorder(), body, answer_registration=False))


def test_async_callbacks_run_as_tasks_and_callback_errors_do_not_stop_the_driver() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await until(lambda: h.driver.registered)
        await h.agent.send(launch("boom"))
        await h.agent.send(launch("t2"))
        await h.agent.wait_terminal("t2")
        assert [v.task_id for n, v in rec.calls if n == "launch_task"] == ["boom", "t2"]
        assert not h.run_task.done()

    run(with_harness(Recorder(async_launch=True), body))


def test_kill_group_and_framework_messages_reach_the_executor_and_back() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await until(lambda: h.driver.registered)
        await h.agent.send(KillTask(framework_id=FRAMEWORK_ID, task_id=TaskID("t9")))
        group = TaskGroupInfo(tasks=(task("g1", "true"), task("g2", "true")))
        await h.agent.send(
            LaunchTaskGroup(framework_id=FRAMEWORK_ID, executor=EXECUTOR_INFO, task_group=group)
        )
        await h.agent.send(
            FrameworkToExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID, data=b"hi")
        )
        # Messages for another framework and messages an executor never gets are ignored.
        await h.agent.send(KillTask(framework_id=FrameworkID("other"), task_id=TaskID("t9")))
        await h.agent.send(Ping())
        reply = await h.agent.wait_for(lambda: h.agent.messages(ExecutorToFramework))
        assert reply[0].data == b"echo:hi"
        assert reply[0].executor_id == EXECUTOR_ID and reply[0].agent_id == AGENT_ID
        assert ("kill_task", TaskID("t9")) in rec.calls
        assert ("launch_task_group", group) in rec.calls
        assert rec.names().count("kill_task") == 1

    run(with_harness(Recorder(), body))


def test_a_bad_frame_from_the_agent_is_reported_and_survived() -> None:
    async def main() -> None:
        context = zmq.asyncio.Context()
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        rec = Recorder()
        driver = ExecutorDriver(rec, environ=environ(f"tcp://127.0.0.1:{port}"))
        running = asyncio.get_running_loop().create_task(driver.run())
        try:
            peer, frame = await asyncio.wait_for(router.recv_multipart(), 10)
            assert isinstance(frame, bytes)
            await router.send_multipart([peer, b"\xc1 not msgpack"])
            registered = ExecutorRegistered(
                executor_info=EXECUTOR_INFO,
                framework_id=FRAMEWORK_ID,
                framework_info=FrameworkInfo(name="t"),
                agent_id=AGENT_ID,
                agent_info=AGENT_INFO,
            )
            await router.send_multipart([peer, encode(registered)])
            await rec.wait(lambda: "registered" in rec.names())
            assert rec.names()[0] == "error" and "bad frame" in rec.calls[0][1]
            assert not running.done()
        finally:
            driver.stop()
            await asyncio.wait_for(running, 10)
            router.close()
            context.term()

    run(main())


# --------------------------------------------------------------------------- link loss


def test_unacknowledged_updates_and_tasks_ride_in_the_reregistration() -> None:
    async def main() -> None:
        rec = Recorder()
        h = await harness(rec, acknowledge=False)
        second: FakeAgent | None = None
        try:
            await until(lambda: h.driver.registered)
            await h.agent.send(launch("t1"))
            await h.agent.wait_terminal("t1")
            sent = [s.uuid for s in h.agent.statuses("t1")]
            assert len(h.driver.unacknowledged_updates) == 2
            endpoint = h.agent.endpoint
            await h.agent.close()
            await rec.wait(lambda: "disconnected" in rec.names())
            h.driver.send_framework_message(b"while away")  # held until re-registered
            second = FakeAgent.start(endpoint)
            h.agent = second
            again = await second.wait_for(lambda: second.messages(ReregisterExecutor), 20)
            assert [u.status.uuid for u in again[0].updates] == sent
            assert [t.task_id for t in again[0].tasks] == ["t1"]
            assert again[0].secret == SECRET
            await rec.wait(lambda: "reregistered" in rec.names())
            held = await second.wait_for(lambda: second.messages(ExecutorToFramework))
            assert held[0].data == b"while away"
            await until(lambda: not h.driver.unacknowledged_updates)
            assert h.driver.registered
        finally:
            await h.close()

    run(main())


def test_agent_gone_past_the_recovery_timeout_shuts_the_executor_down() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await until(lambda: h.driver.registered)
        await h.agent.close()
        started = asyncio.get_running_loop().time()
        assert await h.result(10) == 1
        assert asyncio.get_running_loop().time() - started >= 0.4
        assert rec.shutdown_done and rec.names()[-1] == "shutdown"

    run(with_harness(Recorder(), body, AGORA_RECOVERY_TIMEOUT="0.5"))


def test_an_agent_that_never_answers_is_given_up_after_the_recovery_timeout() -> None:
    async def body(h: Harness) -> None:
        assert await h.result(10) == 1
        assert "registered" not in h.executor.names()  # type: ignore[attr-defined]

    run(with_harness(Recorder(), body, answer_registration=False, AGORA_RECOVERY_TIMEOUT="0.5"))


# --------------------------------------------------------------------------- shutdown


def test_shutdown_awaits_the_executor_and_flushes_updates_before_exit_0() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await until(lambda: h.driver.registered)
        await h.agent.send(launch("t1"))
        await h.agent.wait_state("t1", TaskState.RUNNING)
        await h.agent.send(ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID))
        assert await h.result() == 0
        assert rec.shutdown_done
        assert not h.driver.unacknowledged_updates

    run(with_harness(Recorder(finish=False), body))


def test_shutdown_for_another_executor_is_ignored_and_stop_exits_0() -> None:
    async def body(h: Harness) -> None:
        rec = h.executor
        assert isinstance(rec, Recorder)
        await until(lambda: h.driver.registered)
        await h.agent.send(
            ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=ExecutorID("other"))
        )
        await h.agent.send(launch("t1"))
        await h.agent.wait_terminal("t1")
        assert "shutdown" not in rec.names()
        h.driver.stop()
        assert await h.result() == 0
        assert "shutdown" not in rec.names()

    run(with_harness(Recorder(), body))


def test_a_status_that_breaks_its_schema_is_refused_at_the_call() -> None:
    async def body(h: Harness) -> None:
        await until(lambda: h.driver.registered)
        bad = TaskStatus(
            task_id=TaskID("t1"),
            state=TaskState.RUNNING,
            source=StatusSource.EXECUTOR,
            message="x" * 100_000,
        )
        with pytest.raises(ProtocolError):
            h.driver.send_status_update(bad)
        assert not h.driver.unacknowledged_updates

    run(with_harness(Recorder(), body))


def test_an_unusable_agent_endpoint_makes_run_return_2() -> None:
    async def main() -> None:
        driver = ExecutorDriver(Recorder(), environ=environ("no-such-transport://x"))
        assert await driver.run() == 2

    run(main())


# --------------------------------------------------------------------------- environment


def test_environment_contract() -> None:
    env = ExecutorEnvironment.from_environ(environ("tcp://127.0.0.1:1"))
    assert env.framework_id == FRAMEWORK_ID and env.executor_id == EXECUTOR_ID
    assert env.agent_id == AGENT_ID and env.sandbox == "/tmp"
    assert env.recovery_timeout == DEFAULT_RECOVERY_TIMEOUT == 900.0
    assert env.shutdown_grace_period == DEFAULT_SHUTDOWN_GRACE_PERIOD
    custom = ExecutorEnvironment.from_environ(
        environ("e", AGORA_RECOVERY_TIMEOUT="2.5", AGORA_SHUTDOWN_GRACE_PERIOD="1")
    )
    assert custom.recovery_timeout == 2.5 and custom.shutdown_grace_period == 1.0
    for missing in ("AGORA_AGENT_ENDPOINT", "AGORA_FRAMEWORK_ID", "AGORA_EXECUTOR_ID"):
        env_missing = environ("e")
        del env_missing[missing]
        with pytest.raises(ValueError, match=missing):
            ExecutorEnvironment.from_environ(env_missing)
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="AGORA_RECOVERY_TIMEOUT"):
            ExecutorEnvironment.from_environ(environ("e", AGORA_RECOVERY_TIMEOUT=bad))
    with pytest.raises(ValueError):
        ExecutorDriver(Executor(), environ={})


# --------------------------------------------------------------------------- output payload


def test_output_payload_round_trip_and_rejections() -> None:
    assert OUTPUT_LABEL == "agora.stream_output"
    data = encode_output("t1", "stderr", b"\x00oops\n")
    assert decode_output(data) == ("t1", "stderr", b"\x00oops\n")
    assert isinstance(decode_output(data)[0], TaskID)
    big = encode_output("t1", "stdout", b"x" * MAX_OUTPUT_CHUNK)
    assert decode_output(big)[2] == b"x" * MAX_OUTPUT_CHUNK
    with pytest.raises(ValueError):
        encode_output("t1", "stdin", b"")
    with pytest.raises(ValueError):
        encode_output("t1", "stdout", b"x" * (MAX_OUTPUT_CHUNK + 1))
    bad_payloads = [
        b"",
        b"\xc1",
        b"plain bytes from some other executor",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"task_id": "t", "stream": "stdout"}),
        msgpack.packb({"task_id": "t", "stream": "stdin", "data": b""}),
        msgpack.packb({"task_id": "", "stream": "stdout", "data": b""}),
        msgpack.packb({"task_id": 1, "stream": "stdout", "data": b""}),
        msgpack.packb({"task_id": "t", "stream": "stdout", "data": "text"}),
        msgpack.packb({"task_id": "t", "stream": {}, "data": b""}),
        msgpack.packb({"task_id": "t", "stream": "stdout", "data": b"x" * (MAX_OUTPUT_CHUNK + 1)}),
    ]
    bad_payloads += [
        msgpack.packb({"task_id": "t", "stream": "stdout", "data": b"", "offset": -1}),
        msgpack.packb({"task_id": "t", "stream": "stdout", "data": b"", "offset": "3"}),
        msgpack.packb({"task_id": "t", "stream": "stdout", "data": b"", "offset": True}),
    ]
    for payload in bad_payloads:
        with pytest.raises(ProtocolError):
            decode_output(payload)


def test_output_payloads_carry_their_offset_and_tolerate_newer_keys() -> None:
    assert decode_output_at(encode_output("t1", "stdout", b"abc", offset=70)) == (
        "t1",
        "stdout",
        b"abc",
        70,
    )
    assert decode_output_at(encode_output("t1", "stdout", b"abc")) == ("t1", "stdout", b"abc", None)
    newer = msgpack.packb(
        {"task_id": "t1", "stream": "stderr", "data": b"x", "offset": 1, "crc": 7},
        use_bin_type=True,
    )
    assert decode_output(newer) == ("t1", "stderr", b"x")
    with pytest.raises(ValueError):
        encode_output("t1", "stdout", b"", offset=-2)
