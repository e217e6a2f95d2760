"""How the built-in executor contains its tasks: one container per task, built by the agent's
containerizer settings (passed in AGORA_CONTAINER_CONFIG).

``TaskContainers.starter(task, user)`` gives :class:`~agora.agent.executors.tasks.TaskProcesses` a
way to start the task's process inside a fresh container (or None: a plain posix spawn will do);
``finish(task_id)`` is called once the process has exited: it tells whether a container limit
ended the task and destroys the container. (The agent samples the containers' usage itself.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from agora.agent.containers.containerizer import (
    Container,
    Containerizer,
    LaunchRequest,
    container_name,
    host_name_for,
)
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.isolation import ContainerConfig
from agora.agent.containers.launch import become_subreaper
from agora.agent.executors.task_process import AsyncStarter, RunAs, Started, Starter
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import Reason, TaskInfo

__all__ = ["TaskContainers"]

log = structlog.get_logger(__name__)


class TaskContainers:
    def __init__(self, framework_id: FrameworkID, config: ContainerConfig) -> None:
        self._framework_id = framework_id
        self._forkserver: ForkServer | None = None
        if config.isolated:
            # A small fork server forks the containers (forking this much larger process costs
            # far more); their first processes are re-parented to us, and we reap them.
            become_subreaper()
            self._forkserver = ForkServer()
        self._containerizer = Containerizer.from_config(config, self._forkserver)
        self._live: dict[TaskID, Container] = {}

    @classmethod
    def from_environ(
        cls, framework_id: FrameworkID, environ: Mapping[str, str] | None = None
    ) -> TaskContainers:
        return cls(framework_id, ContainerConfig.from_environ(environ))

    @property
    def config(self) -> ContainerConfig:
        return self._containerizer.config

    def problem(self, task: TaskInfo) -> str | None:
        """Why this agent cannot contain ``task`` as it asks (None: it can)."""
        return self._containerizer.problem(task.container)

    def sandbox_path(self, task: TaskInfo, host_sandbox: str) -> str:
        """The task's sandbox as the task sees it (inside an image: /mnt/sandbox)."""
        return self._containerizer.sandbox_path(task.container, host_sandbox)

    def starter(
        self, task: TaskInfo, run_as: RunAs | None, join_network: str | None = None
    ) -> Starter | None:
        """How to start ``task`` in its container; None when a posix spawn is enough.
        ``join_network``: the network namespace to share (a task group's)."""
        if not self._containerizer.isolates(task.container):
            return None
        return self._launch(task, run_as, join_network).start

    def async_starter(self, task: TaskInfo, run_as: RunAs | None) -> AsyncStarter | None:
        """Like :meth:`starter`, but the container is set up by the fork server while the event
        loop goes on (other tasks' containers are set up at the same time); None when ``task``
        needs no container or there is no fork server."""
        if not self._containerizer.isolates(task.container):
            return None
        if not self._containerizer.launches_async:
            return None
        return self._launch(task, run_as, None).start_async

    def _launch(
        self, task: TaskInfo, run_as: RunAs | None, join_network: str | None
    ) -> _TaskLaunch:
        name = container_name(self._framework_id, task.task_id)
        return _TaskLaunch(self._containerizer, self._live, name, task, run_as, join_network)

    def network_of(self, task_id: TaskID) -> str | None:
        """The network namespace of a running task's container, for its group to join."""
        container = self._live.get(task_id)
        return f"/proc/{container.pid}/ns/net" if container is not None else None

    def enter_prefix(self, task: TaskInfo, run_as: RunAs | None) -> tuple[str, ...]:
        """The ``nsenter`` words that run a command inside the running task's container (its
        namespaces, as its user, in its sandbox); () when it has no container."""
        container = self._live.get(task.task_id)
        if container is None or not (self.config.namespaces or task.container is not None):
            return ()
        words = ["nsenter", f"--target={container.pid}", "--mount", "--uts", "--ipc", "--net"]
        words += ["--pid", f"--wdns={container.sandbox_path}"]
        if run_as is not None:
            words += [f"--setgid={run_as.gid}", f"--setuid={run_as.uid}"]
        return (*words, "--")

    def finish(self, task_id: TaskID) -> tuple[Reason, str] | None:
        """The task's process has exited: what limit ended it (if any); the container goes."""
        container = self._live.pop(task_id, None)
        if container is None:
            return None
        limitation = container.limitation()
        container.destroy()
        return limitation

    def close(self) -> None:
        """Destroy every container left (the executor is exiting)."""
        for task_id in list(self._live):
            self.finish(task_id)
        if self._forkserver is not None:
            self._forkserver.close()


@dataclass(eq=False, slots=True)
class _TaskLaunch:
    """One task's container launch: the same request whether the fork server sets the container
    up in place (:meth:`start`) or while the event loop goes on (:meth:`start_async`)."""

    containerizer: Containerizer
    #: The running tasks' containers, which the started one joins.
    live: dict[TaskID, Container]
    name: str
    task: TaskInfo
    run_as: RunAs | None
    join_network: str | None

    def start(
        self, argv: list[str], env: Mapping[str, str], sandbox: str, stdin: int, out: int, err: int
    ) -> Started:
        request = self._request(argv, env, sandbox, stdin, out, err)
        return self._started(self.containerizer.launch(self.name, **request))

    async def start_async(
        self, argv: list[str], env: Mapping[str, str], sandbox: str, stdin: int, out: int, err: int
    ) -> Started:
        request = self._request(argv, env, sandbox, stdin, out, err)
        return self._started(await self.containerizer.launch_async(self.name, **request))

    def _request(
        self, argv: list[str], env: Mapping[str, str], sandbox: str, stdin: int, out: int, err: int
    ) -> LaunchRequest:
        task = self.task
        return LaunchRequest(
            argv=argv,
            env=env,
            sandbox=sandbox,
            stdin=stdin,
            stdout=out,
            stderr=err,
            resources=task.resources,
            info=task.container,
            user=self.run_as,
            hostname=host_name_for(task.task_id),
            join_network=self.join_network,
        )

    def _started(self, container: Container) -> Started:
        self.live[self.task.task_id] = container
        # With a pid namespace the watched pid is the container's init (see launch.py).
        return Started(container.pid, init="pid" in self.containerizer.config.namespaces)
