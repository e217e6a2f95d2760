"""Kill-grace scenarios for the built-in executor, run by a fake agent through the real kill path
(KILL_TASK -> executor -> SIGTERM -> grace -> SIGKILL), the same in every isolation.

Each scenario launches one task that writes ``ready`` when its SIGTERM handling is in place,
kills it and checks the terminal update, the task's clean-up and that nothing of it is left.
``init`` says whether the task runs under a pid namespace's init (whose own exit status the
executor sees when it has to SIGKILL it).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import dataclass

from agora.sdk.ids import TaskID
from agora.sdk.messages import KillTask, TaskState, TaskStatus

from support.executor_kit import (
    FRAMEWORK_ID,
    ExecutorProcess,
    FakeAgent,
    alive,
    processes_under,
    task,
)
from support.polling import until

#: Cleans up for a second on SIGTERM, then exits 0; until then loops.
TRAP_SCRIPT = (
    "trap 'sleep 1; echo cleaned > cleaned; exit 0' TERM; echo ready; while :; do sleep 0.1; done"
)
#: Ignores SIGTERM (and so do the sleeps it starts).
DEAF_SCRIPT = "trap '' TERM; echo ready; while :; do sleep 0.1; done"


@dataclass(frozen=True)
class Killed:
    status: TaskStatus
    #: Seconds from the kill to the terminal update.
    took: float


async def launch_and_kill(
    agent: FakeAgent, executor: ExecutorProcess, task_id: str, command: str, grace: float
) -> Killed:
    """Launch ``command`` (shell) with ``grace``, kill it once it wrote ``ready``, wait for its
    end; afterwards no process of it is alive."""
    await agent.send_launch(task(task_id, command, kill_grace_period=grace))
    stdout = executor.task_dir(task_id) / "stdout"
    await until(lambda: stdout.exists() and "ready" in stdout.read_text(), 15, "ready")
    # (Inside a mount namespace the sandbox's path may not show: the container's cgroup and its
    # destruction are checked by the containers' tests.)
    pids = processes_under(executor.task_dir(task_id))
    sent = time.monotonic()
    assert await agent.send(KillTask(framework_id=FRAMEWORK_ID, task_id=TaskID(task_id)))
    status = await agent.wait_terminal(task_id, timeout=grace + 15)
    took = time.monotonic() - sent
    await until(lambda: not any(alive(p) for p in pids), 5, "the task's processes to be gone")
    return Killed(status, took)


async def trap_cleanup_completes(agent: FakeAgent, executor: ExecutorProcess) -> None:
    """``sh -c '<trap script>'`` as one command (``agora run -- sh -c …``): the trap's clean-up
    completes, the task ends KILLED with the trap's exit status, within its grace."""
    command = f"sh -c {shlex.quote(TRAP_SCRIPT)}"
    killed = await launch_and_kill(agent, executor, "trap", command, grace=5.0)
    status = killed.status
    assert status.state is TaskState.KILLED, status
    assert (executor.task_dir("trap") / "cleaned").read_text() == "cleaned\n"
    assert status.exit_code == 0, status
    assert status.message == "Command exited with status 0 within its 5 s kill grace period"
    assert 0.9 <= killed.took < 4.5, killed.took


async def group_outlives_its_shell(
    agent: FakeAgent, executor: ExecutorProcess, *, init: bool
) -> None:
    """A compound command: the outer shell dies on the SIGTERM at once, its child's clean-up
    still completes, and the task ends only then (exit status: the shell's, 143)."""
    command = f"sh -c {shlex.quote(TRAP_SCRIPT)}; echo never"
    killed = await launch_and_kill(agent, executor, "compound", command, grace=5.0)
    status = killed.status
    assert status.state is TaskState.KILLED, status
    assert (executor.task_dir("compound") / "cleaned").read_text() == "cleaned\n"
    assert status.exit_code == 143, status
    how = "exited with status 143" if init else "terminated by signal SIGTERM (exit status 143)"
    assert status.message == f"Command {how} within its 5 s kill grace period", status.message
    assert 0.9 <= killed.took < 4.5, killed.took
    assert "never" not in (executor.task_dir("compound") / "stdout").read_text()


async def deaf_task_is_sigkilled(agent: FakeAgent, executor: ExecutorProcess) -> None:
    """A task ignoring SIGTERM is SIGKILLed when its grace runs out, and its update says so."""
    command = f"sh -c {shlex.quote(DEAF_SCRIPT)}"
    killed = await launch_and_kill(agent, executor, "deaf", command, grace=1.0)
    status = killed.status
    assert status.state is TaskState.KILLED, status
    assert status.exit_code == 137, status
    assert status.message.endswith(
        "; SIGKILLed: still running when its 1 s kill grace period ran out"
    ), status.message
    assert 0.9 <= killed.took < 4.0, killed.took


async def deaf_child_is_sigkilled(
    agent: FakeAgent, executor: ExecutorProcess, *, init: bool
) -> None:
    """The shell dies on the SIGTERM, its child ignores it: the executor waits for the child
    until the grace runs out, then SIGKILLs it, and says so."""
    command = f"sh -c {shlex.quote(DEAF_SCRIPT)}; echo never"
    killed = await launch_and_kill(agent, executor, "deafchild", command, grace=1.0)
    status = killed.status
    assert status.state is TaskState.KILLED, status
    # Under an init the executor SIGKILLs the init; without one it saw the shell die of SIGTERM.
    assert status.exit_code == (137 if init else 143), status
    assert status.message.endswith(
        "; SIGKILLed: still running when its 1 s kill grace period ran out"
    ), status.message
    assert 0.9 <= killed.took < 4.0, killed.took


async def all_scenarios(agent: FakeAgent, executor: ExecutorProcess, *, init: bool) -> None:
    """Every scenario, concurrently (they are independent tasks of one executor)."""
    await asyncio.gather(
        trap_cleanup_completes(agent, executor),
        group_outlives_its_shell(agent, executor, init=init),
        deaf_task_is_sigkilled(agent, executor),
        deaf_child_is_sigkilled(agent, executor, init=init),
    )
