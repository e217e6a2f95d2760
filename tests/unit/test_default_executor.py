"""The built-in executor as Mesos's default executor: task groups (all-or-nothing, a failure
kills the group), health checks, URIs fetched before the task starts, and a default executor
that exits once its group is over. A real executor process, driven by a fake agent."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from agora.sdk.messages import (
    URI,
    HealthCheck,
    HealthCheckKind,
    LaunchTaskGroup,
    Reason,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
)
from support.executor_kit import (
    EXECUTOR_INFO,
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    task,
    with_executor,
)
from support.executor_kit import (
    run_bounded as run,
)


async def launch_group(agent: FakeAgent, *tasks: TaskInfo) -> None:
    group = TaskGroupInfo(tasks=tuple(tasks))
    assert await agent.send(
        LaunchTaskGroup(framework_id=FRAMEWORK_ID, executor=EXECUTOR_INFO, task_group=group)
    )


def test_a_failing_task_kills_the_rest_of_its_group(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await launch_group(
            agent,
            task("a", "sleep 60"),
            task("b", "sleep 60", kill_grace_period=0.5),
            task("bad", "sleep 0.3; exit 1"),
        )
        bad = await agent.wait_terminal("bad")
        assert bad.state is TaskState.FAILED and bad.exit_code == 1
        for task_id in ("a", "b"):
            status = await agent.wait_terminal(task_id)
            assert status.state is TaskState.KILLED
            assert status.reason is Reason.TASK_GROUP_MEMBER_FAILED
            assert "Task bad of the group failed" in status.message
            assert agent.states(task_id) == [TaskState.RUNNING, TaskState.KILLED]

    run(with_executor(tmp_path, body))


def test_a_group_launches_all_or_nothing(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await launch_group(agent, task("ok", "sleep 60"), task("nope", ["no-such-program-agora"]))
        nope = await agent.wait_terminal("nope")
        assert nope.state is TaskState.FAILED and "no-such-program-agora" in nope.message
        ok = await agent.wait_terminal("ok")
        assert ok.state is not TaskState.FINISHED
        assert ok.reason is Reason.TASK_GROUP_MEMBER_FAILED
        # Neither ever ran as far as the framework can tell.
        assert TaskState.RUNNING not in agent.states("ok") + agent.states("nope")

    run(with_executor(tmp_path, body))


def test_a_finished_group_member_leaves_the_others_running(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await launch_group(agent, task("quick", "true"), task("slow", "sleep 0.5"))
        assert (await agent.wait_terminal("quick")).state is TaskState.FINISHED
        assert (await agent.wait_terminal("slow")).state is TaskState.FINISHED

    run(with_executor(tmp_path, body))


def test_a_default_executor_exits_once_its_group_is_over(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await launch_group(agent, task("x", "true"), task("y", "exit 2"))
        await agent.wait_terminal("x")
        assert await executor.wait(timeout=15) == 0

    run(with_executor(tmp_path, body, env={"AGORA_DEFAULT_EXECUTOR": "1"}))


def _check(command: str, **options: Any) -> HealthCheck:
    base: dict[str, Any] = {
        "kind": HealthCheckKind.COMMAND,
        "command": command,
        "delay": 0.0,
        "interval": 0.1,
        "timeout": 2.0,
        "grace_period": 0.0,
    }
    base.update(options)
    return HealthCheck(**base)


def test_a_task_failing_its_health_check_three_times_is_killed(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        probe = tmp_path / "probes"
        check = _check(f"echo x >> {probe}; exit 1", consecutive_failures=3)
        await agent.send_launch(task("sick", "sleep 60", health_check=check))
        status = await agent.wait_terminal("sick", timeout=20)
        assert status.state is TaskState.KILLED
        assert status.reason is Reason.TASK_HEALTH_CHECK_STATUS_UPDATED
        assert status.healthy is False
        assert len(probe.read_text().split()) == 3
        health = [s for s in agent.statuses("sick") if s.state is TaskState.RUNNING]
        assert [s.healthy for s in health] == [None, False]

    run(with_executor(tmp_path, body))


def test_a_healthy_task_reports_healthy_and_keeps_running(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await agent.send_launch(task("fine", "sleep 60", health_check=_check("true")))
        await agent.wait_for(
            lambda: any(s.healthy is True for s in agent.statuses("fine")), timeout=10
        )
        assert agent.terminal("fine") is None

    run(with_executor(tmp_path, body))


def test_uris_are_fetched_into_the_sandbox_before_the_task_starts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tool.sh").write_text("#!/bin/sh\necho tool-ran\n")
    (src / "data").mkdir()
    (src / "data" / "input.txt").write_text("payload\n")
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "data", arcname="data")

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        uris = (URI(value=f"file://{src / 'tool.sh'}", executable=True), URI(value=str(archive)))
        await agent.send_launch(task("fetching", "./tool.sh && cat data/input.txt", uris=uris))
        done = await agent.wait_terminal("fetching")
        assert done.state is TaskState.FINISHED, done.message
        out = (executor.task_dir("fetching") / "stdout").read_text()
        assert out == "tool-ran\npayload\n"

    run(with_executor(tmp_path, body))


def test_a_failed_fetch_fails_the_task_naming_the_uri(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        missing = f"file://{tmp_path}/no-such-file.tgz"
        await agent.send_launch(task("nofetch", "true", uris=(URI(value=missing),)))
        status = await agent.wait_terminal("nofetch")
        assert status.state is TaskState.FAILED
        assert status.reason is Reason.FETCHER_FAILED
        assert "no-such-file.tgz" in status.message
        assert agent.states("nofetch") == [TaskState.FAILED]

    run(with_executor(tmp_path, body))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: tasks run as another user")
def test_a_task_cannot_fetch_what_its_user_may_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)

    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        uris = (URI(value=str(secret)),)
        await agent.send_launch(task("snoop", "cat secret", user="nobody", uris=uris))
        status = await agent.wait_terminal("snoop")
        assert status.state is TaskState.FAILED
        assert status.reason is Reason.FETCHER_FAILED
        assert "may not read it" in status.message
        assert not (executor.task_dir("snoop") / "secret").exists()

    run(with_executor(tmp_path, body))


def test_a_malformed_uri_fails_the_task_instead_of_hanging_it(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, _: ExecutorProcess) -> None:
        await agent.send_launch(task("bad-uri", "true", uris=(URI(value="http://[::1"),)))
        status = await agent.wait_terminal("bad-uri")
        assert status.state is TaskState.FAILED
        assert status.reason is Reason.FETCHER_FAILED

    run(with_executor(tmp_path, body))
