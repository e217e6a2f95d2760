"""The built-in command executor: runs the command tasks of one framework on one agent.

``python -m agora.agent.executors.command``, started by the agent with the executor environment
(AGORA_AGENT_ENDPOINT, AGORA_FRAMEWORK_ID, AGORA_EXECUTOR_ID, AGORA_SANDBOX, ...). Per task:
sandbox ``$AGORA_SANDBOX/tasks/<task id>/`` with ``stdout`` and ``stderr``, the command spawned in
its own session with the executor's environment (minus the executor variables) plus the task's,
AGORA_TASK_ID and AGORA_SANDBOX (the task sandbox); TASK_RUNNING right after the spawn, then
TASK_FINISHED / TASK_FAILED / TASK_KILLED with the exit code. Tasks labelled
``agora.stream_output=1`` also stream their output to the framework as framework messages, all
of it before the terminal update. Kills: TASK_KILLING first when the framework has the
TASK_KILLING_STATE capability, SIGTERM to the task's process group, SIGKILL after the task's
kill_grace_period (default 3 s). Shutdown (SHUTDOWN_EXECUTOR or SIGTERM): every task killed, the
grace bounded by the executor's shutdown grace period, then exit 0.
"""

from __future__ import annotations

import os
import pwd
import signal
from typing import Final

import structlog
from agora.agent.executors.tasks import RunAs, TaskProcess, TaskProcesses
from agora.sdk.executor import (
    EXECUTOR_ENV_VARS,
    OUTPUT_LABEL,
    Executor,
    ExecutorDriver,
    encode_output,
    run_executor,
)
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    AgentInfo,
    ExecutorInfo,
    FrameworkCapability,
    FrameworkInfo,
    StatusSource,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
)

__all__ = ["DEFAULT_KILL_GRACE_PERIOD", "CommandExecutor", "main", "shutdown_kill_grace"]

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD: Final = 3.0
_BAD_TASK_IDS: Final = frozenset({"", ".", ".."})


def shutdown_kill_grace(shutdown_grace_period: float) -> float:
    """The most a task's kill grace may be during a shutdown: the executor's shutdown grace
    period minus max(0.5 s, 20 %), so the terminal updates get out before the agent's SIGKILL."""
    return max(0.0, min(shutdown_grace_period - 0.5, shutdown_grace_period * 0.8))


def exit_message(returncode: int | None) -> str:
    if returncode is None:
        return "Command exit status unknown"
    if returncode >= 0:
        return f"Command exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"Command terminated by signal {name}"


class CommandExecutor(Executor):
    """Runs each task's CommandInfo as a process; many tasks at once."""

    def __init__(self) -> None:
        hidden = set(EXECUTOR_ENV_VARS)
        self._base_env = {k: v for k, v in os.environ.items() if k not in hidden}
        self._driver: ExecutorDriver | None = None
        self._processes: TaskProcesses | None = None
        self._kill_grace: dict[TaskID, float] = {}
        self._killing_state = False
        self._user: str | None = None

    # ------------------------------------------------------------------ callbacks

    def registered(
        self,
        driver: ExecutorDriver,
        executor_info: ExecutorInfo,
        framework_info: FrameworkInfo,
        agent_info: AgentInfo,
    ) -> None:
        self._killing_state = FrameworkCapability.TASK_KILLING_STATE in framework_info.capabilities

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        processes = self._processes_of(driver)
        task_id = task.task_id
        if task_id in processes.live:
            log.warning("duplicate_launch_ignored", task_id=task_id)
            return
        problem, run_as = self._check(task)
        if problem is not None:
            self._update(task_id, TaskState.FAILED, problem)
            return
        command = task.command
        assert command is not None
        env = dict(self._base_env)
        env.update(command.environment)
        env["AGORA_TASK_ID"] = task_id
        env["AGORA_SANDBOX"] = processes.sandbox_of(task_id)
        argv = (command.value or "",) if command.shell else command.argv
        try:
            processes.spawn(
                task_id,
                argv,
                env,
                shell=command.shell,
                stream=task.labels.get(OUTPUT_LABEL) == "1",
                run_as=run_as,
            )
        except OSError as exc:
            log.warning("task_launch_failed", task_id=task_id, error=str(exc))
            self._update(task_id, TaskState.FAILED, f"Failed to launch the command: {exc}")
            return
        grace = task.kill_grace_period
        self._kill_grace[task_id] = DEFAULT_KILL_GRACE_PERIOD if grace is None else grace
        self._update(task_id, TaskState.RUNNING)

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> None:
        self._processes_of(driver)
        for task in group.tasks:
            self._update(
                task.task_id,
                TaskState.FAILED,
                "The command executor does not run task groups; give the group an executor",
            )

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        processes = self._processes_of(driver)
        process = processes.live.get(task_id)
        if process is None:
            log.info("kill_for_unknown_task", task_id=task_id)
            return
        first = not process.killed
        if first and self._killing_state and not process.reaped:
            self._update(task_id, TaskState.KILLING)
        processes.kill(task_id, self._kill_grace.get(task_id, DEFAULT_KILL_GRACE_PERIOD))

    async def shutdown(self, driver: ExecutorDriver) -> None:
        processes = self._processes_of(driver)
        cap = shutdown_kill_grace(driver.environment.shutdown_grace_period)
        live = list(processes.live)
        log.info("command_executor_shutdown", tasks=len(live), grace_cap=cap)
        for task_id in live:
            process = processes.live[task_id]
            if self._killing_state and not process.killed and not process.reaped:
                self._update(task_id, TaskState.KILLING)
            grace = min(self._kill_grace.get(task_id, DEFAULT_KILL_GRACE_PERIOD), cap)
            processes.kill(task_id, grace)
        await processes.wait_idle()

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        log.debug("framework_message_ignored", size=len(data))

    # ------------------------------------------------------------------ helpers

    def close(self) -> None:
        """Kill and reap whatever is still running (the process is about to exit)."""
        if self._processes is not None:
            self._processes.close()
            self._processes = None

    def _processes_of(self, driver: ExecutorDriver) -> TaskProcesses:
        if self._processes is None:
            self._driver = driver
            self._processes = TaskProcesses(
                os.path.join(driver.sandbox, "tasks"),
                on_output=self._output,
                on_exit=self._exited,
            )
        return self._processes

    def _check(self, task: TaskInfo) -> tuple[str | None, RunAs | None]:
        """Why ``task`` cannot run (None: it can), and whom to run it as."""
        task_id = task.task_id
        if task_id in _BAD_TASK_IDS or "/" in task_id or "\0" in task_id:
            return f"Task id {task_id!r} cannot name a sandbox directory", None
        command = task.command
        if command is None:
            return "The task has no command (the command executor runs command tasks)", None
        if command.shell and not command.value:
            return "The task's command has no value to run through the shell", None
        if not command.shell and not command.argv:
            return "The task's command has no argv", None
        if command.user is None:
            return None, None
        if self._user is None:
            self._user = pwd.getpwuid(os.geteuid()).pw_name
        if command.user == self._user:
            return None, None
        if os.geteuid() != 0:
            return (
                f"Cannot run the command as user {command.user!r}: the command executor runs as "
                f"{self._user!r}, not root",
                None,
            )
        try:
            entry = pwd.getpwnam(command.user)
        except KeyError:
            return f"Cannot run the command as user {command.user!r}: no such user", None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return None, RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

    def _output(self, process: TaskProcess, stream: str, chunk: bytes) -> None:
        assert self._driver is not None
        self._driver.send_framework_message(encode_output(process.task_id, stream, chunk))

    def _exited(self, process: TaskProcess) -> None:
        code = process.returncode
        self._kill_grace.pop(process.task_id, None)
        if process.killed:
            state = TaskState.KILLED
        elif code == 0:
            state = TaskState.FINISHED
        else:
            state = TaskState.FAILED
        log.debug("task_exited", task_id=process.task_id, state=state.value, exit_code=code)
        self._update(process.task_id, state, exit_message(code), exit_code=code)

    def _update(
        self, task_id: TaskID, state: TaskState, message: str = "", exit_code: int | None = None
    ) -> None:
        assert self._driver is not None
        self._driver.send_status_update(
            TaskStatus(
                task_id=task_id,
                state=state,
                source=StatusSource.EXECUTOR,
                message=message,
                exit_code=exit_code,
            )
        )


def main() -> None:
    """Entry point of ``python -m agora.agent.executors.command``."""
    executor = CommandExecutor()
    try:
        run_executor(executor)
    finally:
        executor.close()


if __name__ == "__main__":
    main()
