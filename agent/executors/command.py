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
import pwd
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agora.sdk._lean import import_structlog_without_rich

# The agent starts this module as a process for every framework's first task on an agent: it
# imports only what running a plain command needs (structlog without rich, see agora.sdk._lean;
# the fetcher and the container side when a task or the agent asks for them).
import_structlog_without_rich()

import structlog  # noqa: E402
from agora.agent.containers.cgroups import CgroupError, Cgroups, Totals  # noqa: E402
from agora.agent.containers.containerizer import container_name  # noqa: E402
from agora.agent.executors.containment import TaskContainers  # noqa: E402
from agora.agent.executors.health import HealthChecker, health_check_problem  # noqa: E402
from agora.agent.executors.outcome import exit_message, kill_message  # noqa: E402
from agora.agent.executors.task_process import AsyncStarter, RunAs, TaskProcess  # noqa: E402
from agora.agent.executors.tasks import TaskProcesses  # noqa: E402
from agora.sdk.executor import (  # noqa: E402
    EXECUTOR_ENV_VARS,
    OUTPUT_LABEL,
    OUTPUT_STREAMS,
    Executor,
    ExecutorDriver,
    encode_output,
    run_executor,
)
from agora.sdk.ids import TaskID  # noqa: E402
from agora.sdk.messages import (  # noqa: E402
    URI,
    AgentInfo,
    ExecutorInfo,
    FrameworkCapability,
    FrameworkInfo,
    HealthCheckKind,
    Reason,
    StatusSource,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
)

if TYPE_CHECKING:
    from agora.agent.containers.fetcher import Fetcher

__all__ = ["DEFAULT_KILL_GRACE_PERIOD", "CommandExecutor", "main", "shutdown_kill_grace"]

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD: Final = 3.0
_BAD_TASK_IDS: Final = frozenset({"", ".", ".."})
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


@dataclass(eq=False, slots=True)
class _Task:
    """What the executor knows of one of its tasks."""

    info: TaskInfo
    group: _Group | None = None
    run_as: RunAs | None = None
    #: Fetching its URIs (before the spawn).
    preparing: asyncio.Task[None] | None = None
    health: HealthChecker | None = None
    healthy: bool | None = None
    #: Why the executor itself killed it (health, group failure), for its terminal update.
    kill_reason: tuple[Reason, str] | None = None
    #: ``preparing`` is its container's launch (not a fetch): a kill waits for its end.
    launching: bool = False
    #: A kill came while it was launching: it is killed (with its grace) once started.
    kill_pending: bool = False
    started: bool = False
    done: bool = False


@dataclass(eq=False, slots=True)
class _Group:
    tasks: list[_Task] = field(default_factory=list)
    failed: bool = False


class CommandExecutor(Executor):
    """Runs each task's CommandInfo as a process (in a container when the agent isolates)."""

    def __init__(self) -> None:
        hidden = set(EXECUTOR_ENV_VARS) | {TASK_USER_ENV, SWITCH_USER_ENV, DEFAULT_EXECUTOR_ENV}
        self._base_env = {k: v for k, v in os.environ.items() if k not in hidden}
        self._default_user = os.environ.get(TASK_USER_ENV) or None
        self._switch_user = os.environ.get(SWITCH_USER_ENV) != "0"
        self._exit_when_idle = os.environ.get(DEFAULT_EXECUTOR_ENV) == "1"
        self._driver: ExecutorDriver | None = None
        self._processes: TaskProcesses | None = None
        self._containers: TaskContainers | None = None
        self._fetcher: Fetcher | None = None
        self._tasks: dict[TaskID, _Task] = {}
        #: Containers being set up by the fork server (see _start_async).
        self._launching = 0
        self._kill_grace: dict[TaskID, float] = {}
        #: Bytes of each task's stdout/stderr sent so far: the offset of the next chunk.
        self._streamed: dict[tuple[TaskID, str], int] = {}
        self._killing_state = False
        self._user: str | None = None
        #: The containers' cgroup hierarchy, to read a task's totals (found on first use).
        self._cgroups: Cgroups | None = None
        self._cgroups_detected = False

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
        entry = _Task(task)
        problem = self._admit(entry)
        if problem is not None:
            self._update(task.task_id, TaskState.FAILED, problem, reason=_LAUNCH_FAILED)
            return
        self._tasks[task.task_id] = entry
        self._prepare([entry])

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> None:
        self._processes_of(driver)
        tasks = [t for t in group.tasks if t.task_id not in self._tasks]
        if len(tasks) != len(group.tasks):
            log.warning("duplicate_group_launch_ignored", tasks=len(group.tasks) - len(tasks))
        if not tasks:
            return
        members = _Group([_Task(t) for t in tasks])
        problems = {m.info.task_id: self._admit(m) for m in members.tasks}
        if any(problems.values()):
            self._fail_group_launch(members, problems)
            return
        for member in members.tasks:
            member.group = members
            self._tasks[member.info.task_id] = member
        self._prepare(members.tasks)

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        processes = self._processes_of(driver)
        entry = self._tasks.get(task_id)
        if entry is not None and entry.launching:
            # Its container is being set up: killed as any started task once it is up.
            entry.kill_pending = True
            return
        if entry is not None and entry.preparing is not None:
            self._cancel_preparation(entry)
            return
        self._kill(processes, task_id)

    def _kill(self, processes: TaskProcesses, task_id: TaskID) -> None:
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
        # Containers being set up are let come up (bounded by the fork server's timeout), then
        # killed with the others.
        launches = [e.preparing for e in self._tasks.values() if e.launching and e.preparing]
        await asyncio.gather(*launches, return_exceptions=True)
        for entry in list(self._tasks.values()):
            if entry.preparing is not None:
                self._cancel_preparation(entry)
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

    # ------------------------------------------------------------------ launching

    def _admit(self, entry: _Task) -> str | None:
        """Why the task cannot run here (None: it can); fills in whom it runs as."""
        task = entry.info
        problem, run_as = self._check(task)
        if problem is None and self._containers is not None:
            problem = self._containers.problem(task)
        if problem is None and task.health_check is not None:
            problem = health_check_problem(task.health_check)
            isolated = task.container is not None and task.container.network_isolation
            if (
                problem is None
                and isolated
                and task.health_check.kind is not HealthCheckKind.COMMAND
            ):
                problem = (
                    "HTTP and TCP health checks cannot reach a network-isolated task yet: "
                    "use a COMMAND check (it runs inside the task's container)"
                )
        entry.run_as = run_as
        return problem

    def _prepare(self, entries: list[_Task]) -> None:
        """Fetch the tasks' URIs (if any), then start them together."""
        if not any(e.info.command is not None and e.info.command.uris for e in entries):
            starter = self._async_starter(entries)
            if starter is None:
                self._start(entries)
                return
            # The container is set up by the fork server while this executor goes on with the
            # next tasks (whose containers are set up at the same time).
            entry = entries[0]
            entry.launching = True
            entry.preparing = asyncio.get_running_loop().create_task(
                self._start_async(entry, starter)
            )
            return
        job = asyncio.get_running_loop().create_task(self._fetch_then_start(entries))
        for entry in entries:
            entry.preparing = job

    async def _fetch_then_start(self, entries: list[_Task]) -> None:
        processes = self._processes_of(None)
        fetcher = self._fetcher_of()
        for entry in entries:
            command = entry.info.command
            if command is None or not command.uris:
                continue
            try:
                await self._fetch(processes, fetcher, entry, command.uris)
            except Exception as exc:  # FetchError, an unreadable source, a sandbox problem
                from agora.agent.containers.fetcher import FetchError  # loaded by _fetcher_of

                for other in entries:
                    other.preparing = None
                message = str(exc) if isinstance(exc, FetchError) else f"Fetch failed: {exc}"
                self._fail_before_start(entries, entry, message, Reason.FETCHER_FAILED)
                return
        for entry in entries:
            entry.preparing = None
        self._start(entries)

    @staticmethod
    async def _fetch(
        processes: TaskProcesses, fetcher: Fetcher, entry: _Task, uris: Sequence[URI]
    ) -> None:
        from agora.agent.containers.fetcher import FetchError, local_source_problem

        run_as = entry.run_as
        if run_as is not None:
            for uri in uris:
                problem = local_source_problem(uri, run_as.uid, run_as.gid, run_as.groups)
                if problem is not None:
                    raise FetchError(problem)
        sandbox = processes.sandbox_of(entry.info.task_id)
        os.makedirs(sandbox, exist_ok=True)
        if run_as is not None:
            os.chown(sandbox, run_as.uid, run_as.gid)
        await fetcher.fetch_all(uris, sandbox)
        if run_as is not None:
            for root, dirs, files in os.walk(sandbox):
                for name in dirs + files:
                    os.lchown(os.path.join(root, name), run_as.uid, run_as.gid)

    def _cancel_preparation(self, entry: _Task) -> None:
        job = entry.preparing
        assert job is not None
        job.cancel()
        members = entry.group.tasks if entry.group is not None else [entry]
        for member in members:
            member.preparing = None
            if not member.done:
                self._end(member, TaskState.KILLED, "Task killed before it started")

    def _start(self, entries: list[_Task]) -> None:
        """Spawn every task; for a group, all or nothing."""
        processes = self._processes_of(None)
        started: list[_Task] = []
        network: str | None = None  # a group's isolated tasks share the first one's network
        for entry in entries:
            isolated = entry.info.container is not None and entry.info.container.network_isolation
            error = self._spawn(processes, entry, network if isolated else None)
            if error is None and isolated and network is None and entry.group is not None:
                assert self._containers is not None
                network = self._containers.network_of(entry.info.task_id)
            if error is not None:
                for running in started:
                    running.kill_reason = (Reason.TASK_GROUP_MEMBER_FAILED, error)
                    processes.kill(running.info.task_id, 0.0)
                self._fail_before_start(entries, entry, error, _LAUNCH_FAILED, spawned=started)
                return
            started.append(entry)
        for entry in entries:
            self._update(entry.info.task_id, TaskState.RUNNING)
            self._watch_health(entry)

    def _async_starter(self, entries: list[_Task]) -> AsyncStarter | None:
        """How to start a lone task's container without blocking (None: start it in place)."""
        if len(entries) != 1 or entries[0].group is not None or self._containers is None:
            return None
        return self._containers.async_starter(entries[0].info, entries[0].run_as)

    async def _start_async(self, entry: _Task, starter: AsyncStarter) -> None:
        processes = self._processes_of(None)
        task = entry.info
        command = task.command
        assert command is not None
        env = self._env_of(processes, task)
        argv = (command.value or "",) if command.shell else command.argv
        self._launching += 1
        try:
            await processes.spawn_async(
                task.task_id,
                argv,
                env,
                shell=command.shell,
                stream=task.labels.get(OUTPUT_LABEL) == "1",
                run_as=entry.run_as,
                starter=starter,
            )
        except Exception as exc:  # OSError, the launcher's error: the task fails, we go on
            entry.preparing, entry.launching = None, False
            self._launching -= 1
            log.warning("task_launch_failed", task_id=task.task_id, error=str(exc))
            self._reap_strays()
            error = f"Failed to launch the command: {exc}"
            self._fail_before_start([entry], entry, error, _LAUNCH_FAILED, spawned=[])
            return
        except BaseException:  # cancelled (the executor is closing)
            self._launching -= 1
            raise
        entry.preparing, entry.launching = None, False
        self._launching -= 1
        if not self._launching:
            self._reap_strays()
        entry.started = True
        grace = task.kill_grace_period
        self._kill_grace[task.task_id] = DEFAULT_KILL_GRACE_PERIOD if grace is None else grace
        self._update(task.task_id, TaskState.RUNNING)
        self._watch_health(entry)
        if entry.kill_pending:
            self._kill(processes, task.task_id)

    def _env_of(self, processes: TaskProcesses, task: TaskInfo) -> dict[str, str]:
        command = task.command
        assert command is not None
        env = dict(self._base_env)
        env.update(command.environment)
        env["AGORA_TASK_ID"] = task.task_id
        host_sandbox = processes.sandbox_of(task.task_id)
        if self._containers is not None:
            env["AGORA_SANDBOX"] = self._containers.sandbox_path(task, host_sandbox)
        else:
            env["AGORA_SANDBOX"] = host_sandbox
        return env

    def _spawn(
        self, processes: TaskProcesses, entry: _Task, network: str | None = None
    ) -> str | None:
        task = entry.info
        command = task.command
        assert command is not None
        env = self._env_of(processes, task)
        starter = None
        if self._containers is not None:
            starter = self._containers.starter(task, entry.run_as, network)
        argv = (command.value or "",) if command.shell else command.argv
        try:
            processes.spawn(
                task.task_id,
                argv,
                env,
                shell=command.shell,
                stream=task.labels.get(OUTPUT_LABEL) == "1",
                run_as=entry.run_as,
                starter=starter,
            )
        except Exception as exc:  # OSError, the launcher's error: the task fails, we go on
            log.warning("task_launch_failed", task_id=task.task_id, error=str(exc))
            self._reap_strays()
            return f"Failed to launch the command: {exc}"
        entry.started = True
        grace = task.kill_grace_period
        self._kill_grace[task.task_id] = DEFAULT_KILL_GRACE_PERIOD if grace is None else grace
        return None

    def _fail_before_start(
        self,
        entries: list[_Task],
        culprit: _Task,
        error: str,
        reason: Reason,
        *,
        spawned: list[_Task] | None = None,
    ) -> None:
        """``culprit`` could not start: it fails, and so does the rest of its group (the ones
        already spawned end when their processes exit, killed)."""
        self._end(culprit, TaskState.FAILED, error, reason=reason)
        for entry in entries:
            if entry is culprit or entry.done or (spawned and entry in spawned):
                continue
            self._end(
                entry,
                TaskState.FAILED,
                f"Task {culprit.info.task_id} of the group could not start: {error}",
                reason=Reason.TASK_GROUP_MEMBER_FAILED,
            )

    def _fail_group_launch(self, group: _Group, problems: dict[TaskID, str | None]) -> None:
        bad = next(tid for tid, problem in problems.items() if problem)
        for member in group.tasks:
            problem = problems[member.info.task_id]
            if problem:
                self._update(member.info.task_id, TaskState.FAILED, problem, reason=_LAUNCH_FAILED)
            else:
                self._update(
                    member.info.task_id,
                    TaskState.FAILED,
                    f"Task {bad} of the group cannot run: {problems[bad]}",
                    reason=Reason.TASK_GROUP_MEMBER_FAILED,
                )
        self._stop_if_idle()

    def _stop_if_idle(self) -> None:
        """A default executor's work is over once its group is: stop (the driver returns once
        the agent has acknowledged every update)."""
        if self._exit_when_idle and not self._tasks and self._driver is not None:
            log.info("default_executor_done")
            self._driver.stop()

    # ------------------------------------------------------------------ health

    def _watch_health(self, entry: _Task) -> None:
        check = entry.info.health_check
        if check is None:
            return
        processes = self._processes_of(None)
        task_id = entry.info.task_id
        env = dict(self._base_env)
        assert entry.info.command is not None
        env.update(entry.info.command.environment)
        env["AGORA_TASK_ID"] = task_id

        def changed(healthy: bool) -> None:
            if entry.done or entry.healthy is healthy:
                return
            entry.healthy = healthy
            self._update(
                task_id,
                TaskState.RUNNING,
                "healthy" if healthy else "unhealthy",
                reason=Reason.TASK_HEALTH_CHECK_STATUS_UPDATED,
                healthy=healthy,
            )

        def unhealthy(why: str) -> None:
            if entry.done:
                return
            entry.healthy = False
            entry.kill_reason = (Reason.TASK_HEALTH_CHECK_STATUS_UPDATED, why)
            log.info("task_unhealthy", task_id=task_id, why=why)
            processes.kill(task_id, self._kill_grace.get(task_id, DEFAULT_KILL_GRACE_PERIOD))

        # The check runs as the task does: in its container, as its user.
        prefix = self._containers.enter_prefix(entry.info, entry.run_as) if self._containers else ()
        entry.health = HealthChecker(
            check,
            sandbox=processes.sandbox_of(task_id),
            env=env,
            on_change=changed,
            on_unhealthy=unhealthy,
            command_prefix=prefix,
            user=entry.run_as,
        )
        entry.health.start()

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
        if self._containers is not None:
            self._containers.close()

    def _processes_of(self, driver: ExecutorDriver | None) -> TaskProcesses:
        if self._processes is None:
            assert driver is not None
            self._driver = driver
            self._containers = TaskContainers.from_environ(driver.environment.framework_id)
            self._processes = TaskProcesses(
                os.path.join(driver.sandbox, "tasks"),
                on_output=self._output,
                on_exit=self._exited,
            )
        return self._processes

    def _fetcher_of(self) -> Fetcher:
        if self._fetcher is None:
            # only a task with URIs needs it (and urllib's HTTP client, tarfile, zipfile)
            from agora.agent.containers.fetcher import Fetcher

            assert self._driver is not None
            config = self._containers.config if self._containers is not None else None
            cache = config.fetch_cache if config is not None else None
            cache = cache or os.path.join(self._driver.sandbox, ".fetch-cache")
            limit = config.fetch_cache_max if config is not None else 2 * 1024**3
            self._fetcher = Fetcher(cache, limit)
        return self._fetcher

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
        wanted = (command.user or self._default_user) if self._switch_user else None
        if wanted is None:
            return None, None
        if self._user is None:
            self._user = pwd.getpwuid(os.geteuid()).pw_name
        if wanted == self._user:
            return None, None
        if os.geteuid() != 0:
            return (
                f"Cannot run the command as user {wanted!r}: the command executor runs as "
                f"{self._user!r}, not root",
                None,
            )
        try:
            entry = pwd.getpwnam(wanted)
        except KeyError:
            return f"Cannot run the command as user {wanted!r}: no such user", None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return None, RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

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
        self._kill_grace.pop(task_id, None)
        entry = self._tasks.get(task_id)
        limitation = None
        totals = Totals(process.cpu_seconds, process.max_rss_bytes)
        if self._containers is not None:
            totals = self._final_totals(task_id, totals)
            limitation = self._containers.finish(task_id)
        self._reap_strays()
        reason: Reason | None = None
        if process.killed:
            message = kill_message(process.returncode, process.grace, process.escalated)
        else:
            message = exit_message(process.returncode)
        if limitation is not None:
            state = TaskState.FAILED
            reason, message = limitation
        elif entry is not None and entry.kill_reason is not None:
            state = TaskState.KILLED if process.killed else TaskState.FAILED
            reason, why = entry.kill_reason
            message = f"{why} ({message})"
        elif process.killed:
            state = TaskState.KILLED
        elif code == 0:
            state = TaskState.FINISHED
        else:
            state = TaskState.FAILED
        log.debug("task_exited", task_id=task_id, state=state.value, exit_code=code)
        if entry is None:
            self._update(task_id, state, message, exit_code=code, reason=reason, totals=totals)
            return
        self._end(entry, state, message, exit_code=code, reason=reason, totals=totals)
        group = entry.group
        failed = state is TaskState.FAILED or (reason is Reason.TASK_HEALTH_CHECK_STATUS_UPDATED)
        if group is not None and failed and not group.failed:
            group.failed = True
            self._kill_group(group, entry)

    def _final_totals(self, task_id: TaskID, measured: Totals) -> Totals:
        """The totals of the task's container cgroup, if it has one, read before the container
        is destroyed; what the cgroup does not tell is taken from ``measured`` (rusage)."""
        assert self._containers is not None and self._driver is not None
        config = self._containers.config
        if not config.cgroup_controllers:
            return measured
        if not self._cgroups_detected:
            self._cgroups_detected = True
            try:
                self._cgroups = Cgroups.detect(config.cgroups_root)
            except CgroupError as exc:
                log.warning("task_totals_unavailable", error=str(exc))
        if self._cgroups is None:
            return measured
        try:
            cgroup = self._cgroups.open(container_name(self._driver.framework_id, task_id))
            totals = cgroup.totals() if cgroup is not None else None
        except (OSError, CgroupError) as exc:
            log.warning("task_totals_unreadable", task_id=task_id, error=str(exc))
            totals = None
        if totals is None:
            return measured
        return Totals(
            measured.cpu_seconds if totals.cpu_seconds is None else totals.cpu_seconds,
            measured.max_rss_bytes if totals.max_rss_bytes is None else totals.max_rss_bytes,
        )

    def _reap_strays(self) -> None:
        """Reap what was re-parented to us and has exited (not the health checks' probes)."""
        if self._processes is None or self._containers is None:
            return
        if self._launching:
            # A container being set up may have been re-parented to us already (and even have
            # exited): its pid is not known yet. Reaped once no launch is in flight.
            return
        probes = {pid for e in self._tasks.values() if e.health for pid in e.health.pids}
        self._processes.reap_strays(probes)

    def _kill_group(self, group: _Group, culprit: _Task) -> None:
        processes = self._processes_of(None)
        why = f"Task {culprit.info.task_id} of the group failed"
        for member in group.tasks:
            if member is culprit or member.done:
                continue
            member.kill_reason = (Reason.TASK_GROUP_MEMBER_FAILED, why)
            if member.preparing is not None:
                self._cancel_preparation(member)
            elif (
                not processes.kill(
                    member.info.task_id,
                    self._kill_grace.get(member.info.task_id, DEFAULT_KILL_GRACE_PERIOD),
                )
                and not member.started
            ):
                self._end(member, TaskState.KILLED, why, reason=Reason.TASK_GROUP_MEMBER_FAILED)

    def _end(
        self,
        entry: _Task,
        state: TaskState,
        message: str,
        *,
        exit_code: int | None = None,
        reason: Reason | None = None,
        totals: Totals | None = None,
    ) -> None:
        """The task's terminal update; the executor forgets it."""
        if entry.done:
            return
        entry.done = True
        if entry.health is not None:
            entry.health.stop()
            entry.health = None
        self._tasks.pop(entry.info.task_id, None)
        self._update(
            entry.info.task_id,
            state,
            message,
            exit_code=exit_code,
            reason=reason,
            healthy=entry.healthy,
            totals=totals,
        )
        self._stop_if_idle()

    def _update(
        self,
        task_id: TaskID,
        state: TaskState,
        message: str = "",
        exit_code: int | None = None,
        *,
        reason: Reason | None = None,
        healthy: bool | None = None,
        totals: Totals | None = None,
    ) -> None:
        assert self._driver is not None
        self._driver.send_status_update(
            TaskStatus(
                task_id=task_id,
                state=state,
                source=StatusSource.EXECUTOR,
                message=message,
                exit_code=exit_code,
                reason=reason,
                healthy=healthy,
                cpu_seconds=None if totals is None else totals.cpu_seconds,
                max_rss_bytes=None if totals is None else totals.max_rss_bytes,
            )
        )


_LAUNCH_FAILED: Final = Reason.CONTAINER_LAUNCH_FAILED


def main() -> None:
    """Entry point of ``python -m agora.agent.executors.command``."""
    executor = CommandExecutor()
    try:
        run_executor(executor)
    finally:
        executor.close()


if __name__ == "__main__":
    main()
