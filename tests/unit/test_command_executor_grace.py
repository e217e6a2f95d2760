"""The kill grace period with posix isolation (no containers): the built-in executor as a real
process, killed tasks driven by a fake agent (see support/grace_kit.py for the scenarios)."""

from __future__ import annotations

from pathlib import Path

from support import grace_kit
from support.executor_kit import ExecutorProcess, FakeAgent, run_bounded, with_executor


def test_a_trap_clean_up_completes_and_the_task_ends_killed(tmp_path: Path) -> None:
    run_bounded(with_executor(tmp_path, grace_kit.trap_cleanup_completes), timeout=40)


def test_the_group_is_waited_for_when_the_shell_dies_first(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await grace_kit.group_outlives_its_shell(agent, executor, init=False)

    run_bounded(with_executor(tmp_path, body), timeout=40)


def test_a_task_ignoring_sigterm_is_sigkilled_after_the_grace_and_told(tmp_path: Path) -> None:
    run_bounded(with_executor(tmp_path, grace_kit.deaf_task_is_sigkilled), timeout=40)


def test_a_child_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path: Path) -> None:
    async def body(agent: FakeAgent, executor: ExecutorProcess) -> None:
        await grace_kit.deaf_child_is_sigkilled(agent, executor, init=False)

    run_bounded(with_executor(tmp_path, body), timeout=40)
