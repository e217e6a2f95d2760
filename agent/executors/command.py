"""The built-in executor: runs the command tasks of one framework on one agent, and task groups
(Mesos's default executor: an executor whose ExecutorInfo names no command).

``python -m agora.agent.executors.command``, started by the agent with the executor environment
(AGORA_AGENT_ENDPOINT, AGORA_FRAMEWORK_ID, AGORA_EXECUTOR_ID, AGORA_SANDBOX, ...). Per task:
sandbox ``$AGORA_SANDBOX/tasks/<task id>/`` with ``stdout`` and ``stderr``, the command spawned in
its own session with the executor's environment (minus the executor variables) plus the task's,
AGORA_TASK_ID and AGORA_SANDBOX (the task sandbox); TASK_RUNNING right after the spawn, then
TASK_FINISHED / TASK_FAILED / TASK_KILLED with the exit code, CPU time and peak memory (the
task container's cgroup totals, else the rusage of its process). Tasks labelled
``agora.stream_output=1`` also stream their output to the framework as framework messages, all
of it before the terminal update. Kills: TASK_KILLING first when the framework has the
TASK_KILLING_STATE capability, SIGTERM to the task's process group, SIGKILL after the task's
kill_grace_period (default 3 s) unless all of the group has exited by then (the KILLED update
says which; exit codes are 128+N for signal N). Shutdown (SHUTDOWN_EXECUTOR or SIGTERM): every
task killed, the grace bounded by the executor's shutdown grace period, then exit 0.

Containers: when the agent isolates tasks (AGORA_CONTAINER_CONFIG), each task runs in a container
of its own (cgroup limits from its resources, namespaces, an image's root filesystem); a task the
memory limit ended is TASK_FAILED with reason CONTAINER_LIMITATION_MEMORY. URIs are fetched into
the task sandbox first (failure: TASK_FAILED, reason FETCHER_FAILED). A health check runs once the
task is RUNNING; a change of health is a RUNNING update with ``healthy`` set, and a task that fails
it too often is killed (reason TASK_HEALTH_CHECK_STATUS_UPDATED). Tasks run as the command's user,
else the framework's (AGORA_TASK_USER) when the executor is root.

Task groups launch all-or-nothing: if one task cannot start, the started ones are killed and every
task of the group fails. When a task of a group fails, the others are killed with reason
TASK_GROUP_MEMBER_FAILED.
"""

from __future__ import annotations

import asyncio
import os
from typing import Final

from agora.sdk._lean import import_structlog_without_rich

# The agent starts this module as a process for every framework's first task on an agent: it
# imports only what running a plain command needs (structlog without rich, see agora.sdk._lean;
# the fetcher and the container side when a task or the agent asks for them).
import_structlog_without_rich()

import structlog  # noqa: E402
from agora.agent.containers.cgroups import Totals  # noqa: E402
from agora.agent.executors.containment import TaskContainers  # noqa: E402
from agora.agent.executors.task_admission import TaskAdmission  # noqa: E402
from agora.agent.executors.task_book import (  # noqa: E402
    LAUNCH_FAILED,
    TaskBook,
    TaskEntry,
    TaskGroup,
)
from agora.agent.executors.task_health import watch_health  # noqa: E402
from agora.agent.executors.task_launch import DEFAULT_KILL_GRACE_PERIOD, TaskLauncher  # noqa: E402
from agora.agent.executors.task_process import RunAs, TaskProcess  # noqa: E402
from agora.agent.executors.task_totals import ContainerTotals  # noqa: E402
from agora.agent.executors.tasks import TaskProcesses  # noqa: E402
from agora.agent.executors.terminal import terminal_state  # noqa: E402
from agora.sdk.executor import (  # noqa: E402
    EXECUTOR_ENV_VARS,
    OUTPUT_STREAMS,
    Executor,
    ExecutorDriver,
    encode_output,
    run_executor,
)
from agora.sdk.ids import TaskID  # noqa: E402
from agora.sdk.messages import (  # noqa: E402
    AgentInfo,
    ExecutorInfo,
    FrameworkCapability,
    FrameworkInfo,
    Reason,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
)

__all__ = ["DEFAULT_KILL_GRACE_PERIOD", "CommandExecutor", "main", "shutdown_kill_grace"]

log = structlog.get_logger(__name__)

#: The environment variable naming the user tasks run as when their command names none.
TASK_USER_ENV: Final = "AGORA_TASK_USER"
#: Set to "0" by an agent started --no-switch-user: every task runs as this executor's user.
SWITCH_USER_ENV: Final = "AGORA_SWITCH_USER"
#: Set by the agent when this process is a task group's default executor: it exits once its
#: tasks are over (and their updates acknowledged).
DEFAULT_EXECUTOR_ENV: Final = "AGORA_DEFAULT_EXECUTOR"


def shutdown_kill_grace(shutdown_grace_period: float) -> float:
    """The most a task's kill grace may be during a shutdown: the executor's shutdown grace
    period minus max(0.5 s, 20 %), so the terminal updates get out before the agent's SIGKILL."""
    return max(0.0, min(shutdown_grace_period - 0.5, shutdown_grace_period * 0.8))


class CommandExecutor(Executor):
    """Runs each task's CommandInfo as a process (in a container when the agent isolates)."""

    def __init__(self) -> None:
        hidden = set(EXECUTOR_ENV_VARS) | {TASK_USER_ENV, SWITCH_USER_ENV, DEFAULT_EXECUTOR_ENV}
        self._base_env = {k: v for k, v in os.environ.items() if k not in hidden}
        self._admission = TaskAdmission(
            os.environ.get(TASK_USER_ENV) or None, os.environ.get(SWITCH_USER_ENV) != "0"
        )
        self._book = TaskBook(exit_when_idle=os.environ.get(DEFAULT_EXECUTOR_ENV) == "1")
        self._driver: ExecutorDriver | None = None
        self._processes: TaskProcesses | None = None
        self._containers: TaskContainers | None = None
        self._launcher: TaskLauncher | None = None
        self._tasks = self._book.tasks
        #: Bytes of each task's stdout/stderr sent so far: the offset of the next chunk.
        self._streamed: dict[tuple[TaskID, str], int] = {}
        self._killing_state = False
        #: A task container's totals (with containers).
        self._totals: ContainerTotals | None = None

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
        self._processes_of(driver)
        if task.task_id in self._tasks:
            log.warning("duplicate_launch_ignored", task_id=task.task_id)
            return
        entry = TaskEntry(task)
        problem = self._admit(entry)
        if problem is not None:
            self._book.update(task.task_id, TaskState.FAILED, problem, reason=LAUNCH_FAILED)
            return
        self._tasks[task.task_id] = entry
        self._launcher_of().prepare([entry])

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> None:
        self._processes_of(driver)
        tasks = [t for t in group.tasks if t.task_id not in self._tasks]
        if len(tasks) != len(group.tasks):
            log.warning("duplicate_group_launch_ignored", tasks=len(group.tasks) - len(tasks))
        if not tasks:
            return
        members = TaskGroup([TaskEntry(t) for t in tasks])
        problems = {m.info.task_id: self._admit(m) for m in members.tasks}
        if any(problems.values()):
            self._book.fail_group_launch(members, problems)
            return
        for member in members.tasks:
            member.group = members
            self._tasks[member.info.task_id] = member
        self._launcher_of().prepare(members.tasks)

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        processes = self._processes_of(driver)
        entry = self._tasks.get(task_id)
        if entry is not None and entry.launching:
            # Its container is being set up: killed as any started task once it is up.
            entry.kill_pending = True
            return
        if entry is not None and entry.preparing is not None:
            self._launcher_of().cancel(entry)
            return
        self._kill(processes, task_id)

    def _kill(self, processes: TaskProcesses, task_id: TaskID) -> None:
        process = processes.live.get(task_id)
        if process is None:
            log.info("kill_for_unknown_task", task_id=task_id)
            return
        first = not process.killed
        if first and self._killing_state and not process.reaped:
            self._book.update(task_id, TaskState.KILLING)
        processes.kill(task_id, self._launcher_of().grace(task_id))

    async def shutdown(self, driver: ExecutorDriver) -> None:
        processes = self._processes_of(driver)
        cap = shutdown_kill_grace(driver.environment.shutdown_grace_period)
        # Containers being set up are let come up (bounded by the fork server's timeout), then
        # killed with the others.
        launches = [e.preparing for e in self._tasks.values() if e.launching and e.preparing]
        await asyncio.gather(*launches, return_exceptions=True)
        for entry in list(self._tasks.values()):
            if entry.preparing is not None:
                self._launcher_of().cancel(entry)
        live = list(processes.live)
        log.info("command_executor_shutdown", tasks=len(live), grace_cap=cap)
        for task_id in live:
            process = processes.live[task_id]
            if self._killing_state and not process.killed and not process.reaped:
                self._book.update(task_id, TaskState.KILLING)
            grace = min(self._launcher_of().grace(task_id), cap)
            processes.kill(task_id, grace)
        await processes.wait_idle()

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        log.debug("framework_message_ignored", size=len(data))

    # ------------------------------------------------------------------ launching (task_launch.py)

    def _admit(self, entry: TaskEntry) -> str | None:
        """Why the task cannot run here (None: it can); fills in whom it runs as."""
        problem, entry.run_as = self._admission.admit(entry.info, self._containers)
        return problem

    # ------------------------------------------------------------------ health

    def _watch_health(self, entry: TaskEntry) -> None:
        if entry.info.health_check is None:
            return
        processes = self._processes_of(None)
        # The check runs as the task does: in its container, as its user.
        prefix = self._containers.enter_prefix(entry.info, entry.run_as) if self._containers else ()
        watch_health(
            entry,
            self._book,
            sandbox=processes.sandbox_of(entry.info.task_id),
            env=self._launcher_of().task_env(entry.info),
            command_prefix=prefix,
            kill=lambda task_id: processes.kill(task_id, self._launcher_of().grace(task_id)),
        )

    # ------------------------------------------------------------------ helpers

    def close(self) -> None:
        """Kill and reap whatever is still running (the process is about to exit)."""
        for entry in self._tasks.values():
            if entry.health is not None:
                entry.health.stop()
            if entry.preparing is not None:
                entry.preparing.cancel()
        if self._processes is not None:
            self._processes.close()
            self._processes = None
        if self._launcher is not None:
            self._launcher.close()
        if self._containers is not None:
            self._containers.close()

    def _processes_of(self, driver: ExecutorDriver | None) -> TaskProcesses:
        if self._processes is None:
            assert driver is not None
            self._driver = self._book.driver = driver
            self._containers = TaskContainers.from_environ(driver.environment.framework_id)
            processes = self._processes = TaskProcesses(
                os.path.join(driver.sandbox, "tasks"),
                on_output=self._output,
                on_exit=self._exited,
            )
            self._launcher = TaskLauncher(
                processes,
                self._containers,
                self._book,
                base_env=self._base_env,
                fetch_dir=driver.sandbox,
                running=self._running,
                kill=lambda task_id: self._kill(processes, task_id),
            )
        return self._processes

    def _launcher_of(self) -> TaskLauncher:
        """The launcher (there is one once the executor has a driver)."""
        assert self._launcher is not None
        return self._launcher

    def _running(self, entry: TaskEntry) -> None:
        self._book.update(entry.info.task_id, TaskState.RUNNING)
        self._watch_health(entry)

    def _check(self, task: TaskInfo) -> tuple[str | None, RunAs | None]:
        """Why ``task``'s command cannot run (None: it can), and whom to run it as."""
        return self._admission.check(task)

    def _output(self, process: TaskProcess, stream: str, chunk: bytes) -> None:
        assert self._driver is not None
        key = (process.task_id, stream)
        offset = self._streamed.get(key, 0)
        self._streamed[key] = offset + len(chunk)
        message = encode_output(process.task_id, stream, chunk, offset)
        self._driver.send_framework_message(message)

    def _exited(self, process: TaskProcess) -> None:
        code = process.exit_code  # 128+N for signal N, in every isolation
        task_id = process.task_id
        for stream in OUTPUT_STREAMS:
            self._streamed.pop((task_id, stream), None)
        self._launcher_of().forget(task_id)
        entry = self._tasks.get(task_id)
        limitation = None
        totals = Totals(process.cpu_seconds, process.max_rss_bytes)
        if self._containers is not None:
            if self._totals is None:
                assert self._driver is not None
                self._totals = ContainerTotals(self._containers.config, self._driver.framework_id)
            # read before the container is destroyed
            totals = self._totals.final(task_id, totals)
            limitation = self._containers.finish(task_id)
        self._launcher_of().reap_strays()
        kill_reason = entry.kill_reason if entry is not None else None
        state, reason, message = terminal_state(process, limitation, kill_reason)
        log.debug("task_exited", task_id=task_id, state=state.value, exit_code=code)
        if entry is None:
            self._book.update(task_id, state, message, exit_code=code, reason=reason, totals=totals)
            return
        self._book.end(entry, state, message, exit_code=code, reason=reason, totals=totals)
        group = entry.group
        failed = state is TaskState.FAILED or (reason is Reason.TASK_HEALTH_CHECK_STATUS_UPDATED)
        if group is not None and failed and not group.failed:
            group.failed = True
            self._kill_group(group, entry)

    def _kill_group(self, group: TaskGroup, culprit: TaskEntry) -> None:
        processes = self._processes_of(None)
        why = f"Task {culprit.info.task_id} of the group failed"
        for member in group.tasks:
            if member is culprit or member.done:
                continue
            member.kill_reason = (Reason.TASK_GROUP_MEMBER_FAILED, why)
            if member.preparing is not None:
                self._launcher_of().cancel(member)
            elif (
                not processes.kill(
                    member.info.task_id,
                    self._launcher_of().grace(member.info.task_id),
                )
                and not member.started
            ):
                self._book.end(
                    member, TaskState.KILLED, why, reason=Reason.TASK_GROUP_MEMBER_FAILED
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
