"""Starting the command executor's tasks: their URIs fetched into their sandboxes first, then
their processes spawned in place (a task group all or nothing, its network-isolated members
sharing the first one's network) or, for a lone task in a container, through the fork server
while the executor goes on with other tasks. A task that could not start fails (a group's other
members with it); a task the executor killed while it was being prepared is KILLED."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

import structlog
from agora.agent.executors.containment import TaskContainers
from agora.agent.executors.task_book import LAUNCH_FAILED, TaskBook, TaskEntry
from agora.agent.executors.task_process import AsyncStarter
from agora.agent.executors.tasks import SpawnArgs, TaskProcesses
from agora.sdk.executor import OUTPUT_LABEL
from agora.sdk.ids import TaskID
from agora.sdk.messages import Reason, TaskInfo, TaskState

if TYPE_CHECKING:
    from agora.agent.containers.fetcher import Fetcher

__all__ = ["DEFAULT_KILL_GRACE_PERIOD", "TaskLauncher"]

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD: Final = 3.0


class TaskLauncher:
    """Starts tasks as :class:`TaskProcesses` (in ``containers`` when the agent isolates them).
    ``running(entry)`` is called once a task has started (its RUNNING update is the caller's);
    ``kill(task_id)`` kills one that was asked to die while its container was being set up.
    ``fetch_dir``: where the fetch cache goes when the agent's settings name none."""

    def __init__(
        self,
        processes: TaskProcesses,
        containers: TaskContainers | None,
        book: TaskBook,
        *,
        base_env: Mapping[str, str],
        fetch_dir: str,
        running: Callable[[TaskEntry], None],
        kill: Callable[[TaskID], None],
    ) -> None:
        self._processes = processes
        self._containers = containers
        self._book = book
        self._base_env = base_env
        self._fetch_dir = fetch_dir
        self._running = running
        self._kill = kill
        self._fetcher: Fetcher | None = None
        #: Containers being set up by the fork server (see _start_async).
        self._launching = 0
        self._kill_grace: dict[TaskID, float] = {}
        self._closed = False

    def grace(self, task_id: TaskID) -> float:
        """The kill grace period of a started task."""
        return self._kill_grace.get(task_id, DEFAULT_KILL_GRACE_PERIOD)

    def forget(self, task_id: TaskID) -> None:
        """The task's process has exited."""
        self._kill_grace.pop(task_id, None)

    def task_env(self, task: TaskInfo) -> dict[str, str]:
        """The environment of the task's command (and of its health check)."""
        assert task.command is not None
        env = dict(self._base_env)
        env.update(task.command.environment)
        env["AGORA_TASK_ID"] = task.task_id
        return env

    def prepare(self, entries: list[TaskEntry]) -> None:
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

    def cancel(self, entry: TaskEntry) -> None:
        """Stop preparing the task (and the rest of its group): KILLED before it started."""
        job = entry.preparing
        assert job is not None
        job.cancel()
        members = entry.group.tasks if entry.group is not None else [entry]
        for member in members:
            member.preparing = None
            if not member.done:
                self._book.end(member, TaskState.KILLED, "Task killed before it started")

    def reap_strays(self) -> None:
        """Reap what was re-parented to us and has exited (not the health checks' probes)."""
        if self._closed or self._containers is None:
            return
        if self._launching:
            # A container being set up may have been re-parented to us already (and even have
            # exited): its pid is not known yet. Reaped once no launch is in flight.
            return
        tasks = self._book.tasks.values()
        probes = {pid for e in tasks if e.health for pid in e.health.pids}
        self._processes.reap_strays(probes)

    def close(self) -> None:
        """The task processes are closed: nothing more is reaped."""
        self._closed = True

    async def _fetch_then_start(self, entries: list[TaskEntry]) -> None:
        # only a task with URIs needs it (and urllib's HTTP client, tarfile, zipfile)
        from agora.agent.executors.task_fetch import FetchError, fetch_into, fetcher_for

        if self._fetcher is None:
            config = self._containers.config if self._containers is not None else None
            self._fetcher = fetcher_for(config, self._fetch_dir)
        for entry in entries:
            command = entry.info.command
            if command is None or not command.uris:
                continue
            try:
                sandbox = self._processes.sandbox_of(entry.info.task_id)
                await fetch_into(self._fetcher, sandbox, command.uris, entry.run_as)
            except Exception as exc:  # FetchError, an unreadable source, a sandbox problem
                for other in entries:
                    other.preparing = None
                message = str(exc) if isinstance(exc, FetchError) else f"Fetch failed: {exc}"
                self._book.fail_before_start(entries, entry, message, Reason.FETCHER_FAILED)
                return
        for entry in entries:
            entry.preparing = None
        self._start(entries)

    def _start(self, entries: list[TaskEntry]) -> None:
        """Spawn every task; for a group, all or nothing."""
        processes = self._processes
        started: list[TaskEntry] = []
        network: str | None = None  # a group's isolated tasks share the first one's network
        for entry in entries:
            isolated = entry.info.container is not None and entry.info.container.network_isolation
            error = self._spawn(entry, network if isolated else None)
            if error is None and isolated and network is None and entry.group is not None:
                assert self._containers is not None
                network = self._containers.network_of(entry.info.task_id)
            if error is not None:
                for running in started:
                    running.kill_reason = (Reason.TASK_GROUP_MEMBER_FAILED, error)
                    processes.kill(running.info.task_id, 0.0)
                self._book.fail_before_start(entries, entry, error, LAUNCH_FAILED, spawned=started)
                return
            started.append(entry)
        for entry in entries:
            self._running(entry)

    def _async_starter(self, entries: list[TaskEntry]) -> AsyncStarter | None:
        """How to start a lone task's container without blocking (None: start it in place)."""
        if len(entries) != 1 or entries[0].group is not None or self._containers is None:
            return None
        return self._containers.async_starter(entries[0].info, entries[0].run_as)

    async def _start_async(self, entry: TaskEntry, starter: AsyncStarter) -> None:
        args = self._spawn_args(entry)
        self._launching += 1
        try:
            await self._processes.spawn_async(**args, starter=starter)
        except Exception as exc:  # OSError, the launcher's error: the task fails, we go on
            entry.preparing, entry.launching = None, False
            self._launching -= 1
            error = self._launch_failed(entry, exc)
            self._book.fail_before_start([entry], entry, error, LAUNCH_FAILED, spawned=[])
            return
        except BaseException:  # cancelled (the executor is closing)
            self._launching -= 1
            raise
        entry.preparing, entry.launching = None, False
        self._launching -= 1
        if not self._launching:
            self.reap_strays()
        self._started(entry)
        self._running(entry)
        if entry.kill_pending:
            self._kill(entry.info.task_id)

    def _spawn(self, entry: TaskEntry, network: str | None = None) -> str | None:
        """Start the task's process in place; why it could not start (None: it did)."""
        args = self._spawn_args(entry)
        starter = None
        if self._containers is not None:
            starter = self._containers.starter(entry.info, entry.run_as, network)
        try:
            self._processes.spawn(**args, starter=starter)
        except Exception as exc:  # OSError, the launcher's error: the task fails, we go on
            return self._launch_failed(entry, exc)
        self._started(entry)
        return None

    def _spawn_args(self, entry: TaskEntry) -> SpawnArgs:
        """How the task's process is started (in place or not): its command and environment."""
        task = entry.info
        command = task.command
        assert command is not None
        env = self.task_env(task)
        host_sandbox = self._processes.sandbox_of(task.task_id)
        if self._containers is not None:
            env["AGORA_SANDBOX"] = self._containers.sandbox_path(task, host_sandbox)
        else:
            env["AGORA_SANDBOX"] = host_sandbox
        return SpawnArgs(
            task_id=task.task_id,
            argv=(command.value or "",) if command.shell else command.argv,
            env=env,
            shell=command.shell,
            stream=task.labels.get(OUTPUT_LABEL) == "1",
            run_as=entry.run_as,
        )

    def _launch_failed(self, entry: TaskEntry, exc: Exception) -> str:
        """The task's process could not start: why, for its failure."""
        log.warning("task_launch_failed", task_id=entry.info.task_id, error=str(exc))
        self.reap_strays()
        return f"Failed to launch the command: {exc}"

    def _started(self, entry: TaskEntry) -> None:
        entry.started = True
        grace = entry.info.kill_grace_period
        self._kill_grace[entry.info.task_id] = DEFAULT_KILL_GRACE_PERIOD if grace is None else grace
