"""The agent daemon's containers: custom executors' own containers (sized as the core says), the
cleanup of task containers their executor left, and container usage on the heartbeat.

The built-in executor builds its tasks' containers itself (agora.agent.executors.containment);
the agent builds those of custom executors, destroys whatever a dead executor left behind (task
containers are named by :func:`container_name` of framework and task id), and at start destroys
containers no recovered task owns. Which GPUs a task gets, and how big an executor's container
is, the core decides (agora.agent.core.gpus, ``ResizeExecutor``); this module only applies it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import structlog
from agora.agent.containers.cgroups import CgroupError, Cgroups
from agora.agent.containers.containerizer import (
    SANDBOX_IN_IMAGE,
    Container,
    Containerizer,
    LaunchError,
    container_name,
    endpoint_in_image,
    host_name_for,
    limits_of,
)
from agora.agent.core import Agent, LaunchExecutor, is_final
from agora.agent.server.isolation import destroy_orphan_containers, release_agent_cgroups
from agora.agent.server.processes import Account, ExecutorStarter
from agora.agent.server.usage import sample_usage
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import ContainerUsage, Message, Pong, Reason
from agora.sdk.resources import Resources

__all__ = ["AgentContainment"]

log = structlog.get_logger(__name__)


class AgentContainment:
    """``core`` returns the agent core (it is replaced once at start)."""

    def __init__(self, containerizer: Containerizer, core: Callable[[], Agent]) -> None:
        self._containerizer = containerizer
        self._core = core
        self._executors: dict[tuple[FrameworkID, ExecutorID], Container] = {}

    @property
    def cgroups(self) -> Cgroups | None:
        return self._containerizer.cgroups

    def assignable_gpus(self) -> tuple[int, ...] | None:
        """The GPUs the core hands to tasks (``AgentConfig.gpus``): with ``gpu/nvidia``, every
        GPU of the host; else None (tasks' environments are left alone)."""
        config = self._containerizer.config
        if "gpu/nvidia" not in config.isolators:
            return None
        return tuple(index for index, _minor in config.gpus)

    # ---- messages on their way out ---------------------------------------------------------

    def to_master(self, message: Message) -> Message:
        """A PONG gets the containers' usage."""
        if isinstance(message, Pong) and self.cgroups is not None:
            return Pong(usage=self.usage())
        return message

    # ---- custom executors --------------------------------------------------------------------

    def executor_starter(
        self, action: LaunchExecutor, required: dict[str, str]
    ) -> ExecutorStarter | None:
        """How to start a custom executor in a container of its own (None: no isolation). Its
        limits cover ``action.resources`` (the core's size: the executor's and its tasks').
        Raises LaunchError for a container the agent cannot give it; fills in ``required`` (its
        environment) for an image."""
        fid, eid, resources = action.framework_id, action.executor_id, action.resources
        config = self._containerizer.config
        spec = action.info.container
        if not config.isolated and spec is None:
            return None
        if spec is not None and spec.network_isolation:
            raise LaunchError("a custom executor cannot be network-isolated: it talks to its agent")
        problem = self._containerizer.problem(spec)
        if problem is not None:
            raise LaunchError(problem)
        if spec is not None and spec.image is not None:
            required["AGORA_SANDBOX"] = SANDBOX_IN_IMAGE
            required["AGORA_AGENT_ENDPOINT"] = endpoint_in_image(required["AGORA_AGENT_ENDPOINT"])
        name = container_name(fid, "executor", eid)

        def start(
            argv: list[str],
            env: Mapping[str, str],
            sandbox: str,
            stdin: int,
            stdout: int,
            stderr: int,
            account: Account | None,
        ) -> int:
            container = self._containerizer.launch(
                name,
                argv=argv,
                env=env,
                sandbox=sandbox,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                resources=resources,
                info=spec,
                user=account,
                hostname=host_name_for(eid),
            )
            self._executors[(fid, eid)] = container
            return container.pid

        return start

    def adopt_executor(self, fid: FrameworkID, eid: ExecutorID, pid: int, sandbox: str) -> None:
        """A custom executor an earlier agent started in a container (found alive at start):
        its container is ours again, to grow and to destroy."""
        cgroups = self.cgroups
        name = container_name(fid, "executor", eid)
        if cgroups is not None and cgroups.open(name) is not None:
            self._executors[(fid, eid)] = self._containerizer.recover(name, pid, sandbox)

    def resize(self, fid: FrameworkID, eid: ExecutorID, resources: Resources) -> None:
        """The core sized a custom executor's container (ResizeExecutor): apply it, if the
        executor has a container of its own."""
        container = self._executors.get((fid, eid))
        if container is None:
            return
        limits = limits_of(resources, self._containerizer.config)
        try:
            container.update(limits)
        except (OSError, CgroupError, ValueError) as exc:
            log.warning("executor_container_resize_failed", executor_id=eid, error=str(exc))

    # ---- cleanup -----------------------------------------------------------------------------

    def executor_exited(self, fid: FrameworkID, eid: ExecutorID) -> tuple[Reason, str] | None:
        """An executor is gone: its container and its tasks' go too (the built-in executor
        destroys its tasks' containers itself, but not if it was killed). Returns the limit that
        ended the executor's own container, if one did."""
        limitation = None
        own = self._executors.pop((fid, eid), None)
        if own is not None:
            limitation = own.limitation()
            own.destroy()
        cgroups = self.cgroups
        if cgroups is None:
            return limitation
        for task in self._core().tasks_of(fid, eid):
            task_id = task.info.task_id
            cgroup = cgroups.open(container_name(fid, task_id))
            if cgroup is None:
                continue
            try:
                cgroup.destroy()
            except (OSError, CgroupError) as exc:
                log.error("task_container_destroy_failed", task_id=task_id, error=str(exc))
        return limitation

    def keep_only(self, live: Iterable[str]) -> None:
        """Destroy every container under the agent's root but ``live`` ones (at start)."""
        if self.cgroups is not None:
            destroy_orphan_containers(self.cgroups, live)

    def tidy(self) -> None:
        """The agent exits leaving its executors: remove its cgroup root if no container is in
        it (nothing runs), else keep it for the next agent."""
        cgroups = self.cgroups
        if cgroups is None or cgroups.names():
            return
        release_agent_cgroups(cgroups)

    def release(self) -> None:
        """The agent drains: every container goes, and the agent's cgroup root."""
        for container in self._executors.values():
            container.destroy()
        self._executors.clear()
        if self.cgroups is not None:
            release_agent_cgroups(self.cgroups)

    # ---- usage -------------------------------------------------------------------------------

    def usage(self) -> tuple[ContainerUsage, ...]:
        """Each live task's container usage (tasks of the built-in executor)."""
        cgroups = self.cgroups
        if cgroups is None:
            return ()
        live = [
            (task.framework_id, task.executor_id, task.info.task_id)
            for task in self._core().tasks().values()
            if task.launched and not is_final(task.state)
        ]
        try:
            return sample_usage(cgroups, live, time.time())
        except Exception:  # a report is never worth the heartbeat
            log.exception("usage_sampling_failed")
            return ()
