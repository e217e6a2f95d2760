"""The built-in command executor as a real process (``python -m agora.agent.executors.command``)
driven by a fake agent: a ZmqServer on tcp loopback speaking the agent <-> executor protocol.

Every test SIGKILLs, in ``finally``, the executor's process group and every process working
under its tmp dir (the tasks, which run in sessions of their own).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agora.sdk.executor import MAX_OUTPUT_CHUNK, OUTPUT_LABEL, decode_output, decode_output_at
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    ExecutorToFramework,
    FrameworkCapability,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    ReregisterExecutor,
    ShutdownExecutor,
    StatusSource,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskState,
    is_terminal,
)
from support.executor_kit import (
    AGENT_ID,
    EXECUTOR_ID,
    EXECUTOR_INFO,
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    alive,
    cleanup,
    processes_under,
    task,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Scene:
    """One fake agent and one command executor process under ``root``."""

    def __init__(self, root: Path, agent: FakeAgent, executor: ExecutorProcess) -> None:
        self.root = root
        self.agent = agent
        self.executor = executor

    async def launch(self, task_id: str, command: str | list[str], **options: Any) -> None:
        assert await self.agent.send(
            LaunchTask(framework_id=FRAMEWORK_ID, task=task(task_id, command, **options))
        )

    async def kill(self, task_id: str) -> None:
        assert await self.agent.send(KillTask(framework_id=FRAMEWORK_ID, task_id=TaskID(task_id)))

    async def shutdown(self) -> None:
        assert await self.agent.send(
            ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID)
        )

    def stdout(self, task_id: str) -> str:
        return (self.executor.task_dir(task_id) / "stdout").read_text()

    def stderr(self, task_id: str) -> str:
        return (self.executor.task_dir(task_id) / "stderr").read_text()

    async def wait_stdout(self, task_id: str, text: str, timeout: float = 15.0) -> None:
        """Poll the task's stdout file (written by the task, not by anything we can await)."""
        path = self.executor.task_dir(task_id) / "stdout"
        async with asyncio.timeout(timeout):
            while not (path.exists() and text in path.read_text()):
                await asyncio.sleep(0.01)


async def scene(
    root: Path,
    body: Callable[[Scene], Awaitable[None]],
    *,
    agent_options: dict[str, Any] | None = None,
    **executor_options: Any,
) -> None:
    agent = FakeAgent.start(**(agent_options or {}))
    executor = ExecutorProcess.start(root, agent.endpoint, **executor_options)
    s = Scene(root, agent, executor)
    try:
        await agent.wait_for(lambda: agent.peer, timeout=30)
        await body(s)
    except BaseException:
        print(executor.log())
        raise
    finally:
        cleanup(root, executor)
        await s.agent.close()


async def pid_from_stdout(s: Scene, task_id: str) -> int:
    await s.wait_stdout(task_id, "\n")
    return int(s.stdout(task_id).split()[0])


# --------------------------------------------------------------------------- outcomes


def test_echo_hello_runs_then_finishes_with_exit_code_0_and_its_sandbox(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        command = (
            'echo hello; echo "$AGORA_TASK_ID|$AGORA_SANDBOX|${AGORA_AGENT_ENDPOINT-unset}|'
            '$FOO"; pwd; echo oops >&2'
        )
        await s.launch("t1", command, environment={"FOO": "bar"})
        final = await s.agent.wait_terminal("t1")
        assert s.agent.states("t1") == [TaskState.RUNNING, TaskState.FINISHED]
        assert final.exit_code == 0 and final.message == "Command exited with status 0"
        assert final.source is StatusSource.EXECUTOR
        assert final.executor_id == EXECUTOR_ID and final.agent_id == AGENT_ID
        sandbox = s.executor.task_dir("t1")
        lines = s.stdout("t1").splitlines()
        assert lines[0] == "hello"
        assert lines[1] == f"t1|{sandbox}|unset|bar"
        assert Path(lines[2]).resolve() == sandbox.resolve()
        assert s.stderr("t1") == "oops\n"
        assert not s.agent.output_messages()  # not streaming: the files only

    run(scene(tmp_path, body))


def test_exit_3_fails_with_exit_code_3_and_signals_give_128_plus_n(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("t3", "exit 3")
        await s.launch("sig", "kill -USR1 $$")
        failed = await s.agent.wait_terminal("t3")
        assert failed.state is TaskState.FAILED
        assert failed.exit_code == 3 and failed.message == "Command exited with status 3"
        signalled = await s.agent.wait_terminal("sig")
        assert signalled.state is TaskState.FAILED
        assert signalled.exit_code == 128 + signal.SIGUSR1
        assert signalled.message == "Command terminated by signal SIGUSR1 (exit status 138)"

    run(scene(tmp_path, body))


def test_argv_commands_and_launch_failures(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("argv", ["printf", "%s|%s", "a b", "$HOME"])
        await s.launch("missing", ["no-such-program-agora"])
        await s.launch("nouser", "true", user="no-such-user-agora")
        group = TaskGroupInfo(tasks=(task("g1", "true"),))
        await s.agent.send(
            LaunchTaskGroup(framework_id=FRAMEWORK_ID, executor=EXECUTOR_INFO, task_group=group)
        )
        assert (await s.agent.wait_terminal("argv")).state is TaskState.FINISHED
        assert s.stdout("argv") == "a b|$HOME"  # no shell in between
        missing = await s.agent.wait_terminal("missing")
        assert missing.state is TaskState.FAILED and missing.exit_code is None
        assert "Failed to launch" in missing.message and "no-such-program-agora" in missing.message
        nouser = await s.agent.wait_terminal("nouser")
        assert nouser.state is TaskState.FAILED and "no such user" in nouser.message
        # A task group runs too (the default executor's job); its one task just finishes.
        assert (await s.agent.wait_terminal("g1")).state is TaskState.FINISHED
        for task_id in ("missing", "nouser"):
            assert s.agent.states(task_id) == [TaskState.FAILED]  # never RUNNING

    run(scene(tmp_path, body))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_task_runs_as_its_user_when_the_executor_is_root(tmp_path: Path) -> None:
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    tmp_path.chmod(0o755)

    async def body(s: Scene) -> None:
        s.executor.sandbox.chmod(0o755)
        for parent in s.executor.sandbox.parents:
            if parent == tmp_path:
                break
            parent.chmod(0o755)
        await s.launch("who", "id -u; touch mine", user="nobody")
        final = await s.agent.wait_terminal("who")
        assert final.state is TaskState.FINISHED, final.message
        assert s.stdout("who").strip() == str(nobody.pw_uid)
        assert (s.executor.task_dir("who") / "mine").stat().st_uid == nobody.pw_uid

    run(scene(tmp_path, body))


# --------------------------------------------------------------------------- streaming


def test_streamed_output_reaches_the_framework_before_the_terminal_update(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        size = 300_000
        command = f"head -c {size} /dev/zero | tr '\\0' a; echo; echo to-stderr >&2; echo end"
        await s.launch("st", command, labels={OUTPUT_LABEL: "1"})
        final = await s.agent.wait_terminal("st")
        assert final.state is TaskState.FINISHED
        chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        terminal_at = None
        for index, (_, _, message) in enumerate(s.agent.received):
            if isinstance(message, ExecutorToFramework):
                assert terminal_at is None, "output after the terminal update"
                task_id, stream, data, offset = decode_output_at(message.data)
                assert task_id == "st" and 0 < len(data) <= MAX_OUTPUT_CHUNK
                # Each chunk says where it starts, so a reader can tell when one was lost.
                assert offset == sum(len(c) for c in chunks[stream])
                chunks[stream].append(data)
            elif isinstance(message, StatusUpdateMessage) and is_terminal(
                message.update.status.state
            ):
                terminal_at = index
        stdout = b"".join(chunks["stdout"])
        assert stdout == b"a" * size + b"\nend\n"
        assert len(chunks["stdout"]) >= size // MAX_OUTPUT_CHUNK
        assert b"".join(chunks["stderr"]) == b"to-stderr\n"
        # ... and teed into the sandbox files too.
        assert s.stdout("st").encode() == stdout and s.stderr("st") == "to-stderr\n"

    run(scene(tmp_path, body))


def test_streaming_does_not_wait_forever_for_a_pipe_held_outside_the_task(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        # setsid -f puts a sleep in a session of its own, out of the executor's reach, holding
        # the pipes; the task waits until it has escaped, then exits.
        command = (
            "echo before; setsid -f sh -c 'touch escaped; exec sleep 30'; "
            "until [ -e escaped ]; do sleep 0.01; done; echo after"
        )
        started = time.monotonic()
        await s.launch("held", command, labels={OUTPUT_LABEL: "1"})
        final = await s.agent.wait_terminal("held")
        assert final.state is TaskState.FINISHED
        assert time.monotonic() - started < 10
        out = b"".join(decode_output(m.data)[2] for m in s.agent.output_messages())
        assert out == b"before\nafter\n"
        assert "task_output_abandoned" in s.executor.log()

    run(scene(tmp_path, body))


# --------------------------------------------------------------------------- kills


def test_kill_reports_killed_with_the_signal(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("k", "echo $$; exec sleep 30")
        pid = await pid_from_stdout(s, "k")
        await s.kill("k")
        final = await s.agent.wait_terminal("k")
        assert final.state is TaskState.KILLED and final.exit_code == 128 + signal.SIGTERM
        assert final.message == (
            "Command terminated by signal SIGTERM (exit status 143) "
            "within its 3 s kill grace period"
        )
        assert s.agent.states("k") == [TaskState.RUNNING, TaskState.KILLED]  # no capability
        assert not alive(pid)
        await s.kill("k")  # a kill for a finished task is ignored
        await s.kill("never-launched")
        await s.launch("after", "true")
        assert (await s.agent.wait_terminal("after")).state is TaskState.FINISHED
        assert len(s.agent.statuses("k")) == 2

    run(scene(tmp_path, body))


def test_kill_and_shutdown_send_task_killing_first_with_the_capability(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("k", "exec sleep 30")
        await s.launch("other", "exec sleep 30")
        await s.agent.wait_state("k", TaskState.RUNNING)
        await s.kill("k")
        await s.agent.wait_terminal("k")
        assert s.agent.states("k") == [TaskState.RUNNING, TaskState.KILLING, TaskState.KILLED]
        await s.agent.wait_state("other", TaskState.RUNNING)
        await s.shutdown()  # a shutdown kills the same way
        assert await s.executor.wait() == 0
        assert s.agent.states("other") == [
            TaskState.RUNNING,
            TaskState.KILLING,
            TaskState.KILLED,
        ]

    capability = (FrameworkCapability.TASK_KILLING_STATE,)
    run(scene(tmp_path, body, agent_options={"capabilities": capability}))


def test_a_task_ignoring_sigterm_is_sigkilled_after_its_grace_period(tmp_path: Path) -> None:
    grace = 1.5

    async def body(s: Scene) -> None:
        # The trap makes SIGTERM ignored in sh and in the sleep it starts.
        await s.launch("stubborn", "trap '' TERM; echo ready; sleep 30", kill_grace_period=grace)
        await s.wait_stdout("stubborn", "ready")
        sent = time.monotonic()
        await s.kill("stubborn")
        await s.agent.wait_terminal("stubborn")
        arrived = next(
            at
            for at, _, m in s.agent.received
            if isinstance(m, StatusUpdateMessage) and m.update.status.state is TaskState.KILLED
        )
        took = arrived - sent
        final = s.agent.terminal("stubborn")
        assert final is not None and final.exit_code == 128 + signal.SIGKILL
        assert final.message.endswith(
            "SIGKILLed: still running when its 1.5 s kill grace period ran out"
        )
        assert grace - 0.1 <= took <= grace + 1.5, took

    run(scene(tmp_path, body))


# --------------------------------------------------------------------------- agent link


def test_unacknowledged_updates_are_resent_on_reregistration(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("t1", "echo hi")
        await s.agent.wait_terminal("t1")
        uuids = [status.uuid for status in s.agent.statuses("t1")]
        endpoint = s.agent.endpoint
        await s.agent.close()  # the agent "restarts" on the same endpoint
        s.agent = FakeAgent.start(endpoint)
        again = await s.agent.wait_for(lambda: s.agent.messages(ReregisterExecutor), 30)
        assert [u.status.uuid for u in again[0].updates] == uuids
        assert [u.status.state for u in again[0].updates] == [
            TaskState.RUNNING,
            TaskState.FINISHED,
        ]
        assert [t.task_id for t in again[0].tasks] == ["t1"]
        # Re-registered and acknowledged: the executor works on and shuts down cleanly.
        await s.launch("t2", "true")
        assert (await s.agent.wait_terminal("t2")).state is TaskState.FINISHED
        await s.shutdown()
        assert await s.executor.wait() == 0
        assert len(s.agent.messages(ReregisterExecutor)) == 1

    run(scene(tmp_path, body, agent_options={"acknowledge": False}))


def test_agent_gone_past_the_recovery_timeout_kills_tasks_and_exits(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("t1", "echo $$; exec sleep 30")
        pid = await pid_from_stdout(s, "t1")
        await s.agent.close()
        gone = time.monotonic()
        assert await s.executor.wait(20) == 1
        assert time.monotonic() - gone >= 0.9
        assert not alive(pid)

    run(scene(tmp_path, body, recovery_timeout=1.0))


# --------------------------------------------------------------------------- shutdown


def test_shutdown_kills_every_task_and_exits_0(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("a", "echo $$; exec sleep 30")
        await s.launch("b", "trap '' TERM; echo $$; sleep 30", kill_grace_period=60)
        pids = [await pid_from_stdout(s, "a"), await pid_from_stdout(s, "b")]
        started = time.monotonic()
        await s.shutdown()
        assert await s.executor.wait(20) == 0
        # b ignores SIGTERM: its 60 s grace is capped by the 1 s shutdown grace period.
        assert time.monotonic() - started < 5
        assert s.agent.terminal("a").state is TaskState.KILLED  # type: ignore[union-attr]
        final_b = s.agent.terminal("b")
        assert final_b is not None and final_b.state is TaskState.KILLED
        assert final_b.exit_code == 128 + signal.SIGKILL
        assert not any(alive(pid) for pid in pids)
        assert not [p for p in processes_under(s.root) if alive(p)]

    run(scene(tmp_path, body, shutdown_grace_period=1.0))


def test_sigterm_to_the_executor_shuts_it_down_like_shutdown_executor(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        await s.launch("a", "echo $$; exec sleep 30")
        pid = await pid_from_stdout(s, "a")
        os.kill(s.executor.popen.pid, signal.SIGTERM)
        assert await s.executor.wait(20) == 0
        assert s.agent.terminal("a").state is TaskState.KILLED  # type: ignore[union-attr]
        assert not alive(pid)

    run(scene(tmp_path, body))


def test_missing_environment_exits_2(tmp_path: Path) -> None:
    async def body(s: Scene) -> None:
        assert await s.executor.wait() == 2
        assert "AGORA_AGENT_ENDPOINT" in s.executor.log()

    async def main() -> None:
        agent = FakeAgent.start()
        executor = ExecutorProcess.start(tmp_path, agent.endpoint, env={"AGORA_AGENT_ENDPOINT": ""})
        try:
            await body(Scene(tmp_path, agent, executor))
        finally:
            cleanup(tmp_path, executor)
            await agent.close()

    run(main())


# --------------------------------------------------------------------------- load


def test_200_concurrent_short_tasks_all_finish(tmp_path: Path) -> None:
    n = 200

    async def body(s: Scene) -> None:
        started = time.monotonic()
        for i in range(n):
            await s.launch(f"t{i}", "echo $AGORA_TASK_ID")
        ids = [f"t{i}" for i in range(n)]
        await s.agent.wait_for(lambda: all(s.agent.terminal(t) for t in ids), 60)
        took = time.monotonic() - started
        for task_id in ids:
            final = s.agent.terminal(task_id)
            assert final is not None and final.state is TaskState.FINISHED, final
            assert final.exit_code == 0
            assert s.agent.states(task_id) == [TaskState.RUNNING, TaskState.FINISHED]
            assert s.stdout(task_id) == f"{task_id}\n"
        print(f"{n} tasks in {took:.2f} s: {n / took:.0f} tasks/s")
        await s.shutdown()
        assert await s.executor.wait() == 0

    run(scene(tmp_path, body))
