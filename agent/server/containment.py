"""The agent daemon's containers: custom executors' own containers, the cleanup of task
containers their executor left, GPUs handed to tasks, and container usage on the heartbeat.

The built-in executor builds its tasks' containers itself (agora.agent.executors.containment);
the agent builds those of custom executors, destroys whatever a dead executor left behind (task
containers are named by :func:`container_name` of framework and task id), and at start destroys
containers no recovered task owns.
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
from agora.agent.core import Agent
from agora.agent.core.state import is_final
from agora.agent.server.gpu_assign import GpuAssignments
from agora.agent.server.isolation import destroy_orphan_containers, release_agent_cgroups
from agora.agent.server.processes import Account, ExecutorStarter
from agora.agent.server.usage import sample_usage
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import (
    ContainerUsage,
    ExecutorInfo,
    LaunchTask,
    LaunchTaskGroup,
    Message,
    Pong,
    Reason,
)
from agora.sdk.resources import Resources

__all__ = ["AgentContainment"]

log = structlog.get_logger(__name__)


class AgentContainment:
    """``core`` returns the agent core (it is replaced once at start)."""

    def __init__(
        self,
        containerizer: Containerizer,
        core: Callable[[], Agent],
        gpus: GpuAssignments | None = None,
    ) -> None:
        self._containerizer = containerizer
        self._core = core
        self._gpus = gpus
        self._executors: dict[tuple[FrameworkID, ExecutorID], Container] = {}

    @property
    def cgroups(self) -> Cgroups | None:
        return self._containerizer.cgroups

    # ---- messages on their way out ---------------------------------------------------------

    def to_master(self, message: Message) -> Message:
        """A PONG gets the containers' usage; a terminal update frees its task's GPUs."""
        if isinstance(message, Pong) and self.cgroups is not None:
            return Pong(usage=self.usage())
        if self._gpus is not None:
            self._gpus.to_master(message)
        return message

    def to_executor(self, message: Message) -> Message:
        """Launches get their GPUs, and a contained executor's limits grow to cover them."""
        if self._gpus is not None:
            message = self._gpus.outgoing(message)
        if self._executors:
            self._resize(message)
        return message

    # ---- custom executors --------------------------------------------------------------------

    def executor_starter(
        self,
        fid: FrameworkID,
        eid: ExecutorID,
        info: ExecutorInfo,
        required: dict[str, str],
    ) -> ExecutorStarter | None:
        """How to start a custom executor in a container of its own (None: no isolation). Its
        limits cover the executor's resources and its tasks'. Raises LaunchError for a container
        the agent cannot give it; fills in ``required`` (its environment) for an image."""
        config = self._containerizer.config
        spec = info.container
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
        resources = self.executor_resources(fid, eid)

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

    def executor_resources(self, fid: FrameworkID, eid: ExecutorID) -> Resources:
        """An executor's own resources plus those of its tasks that are not over."""
        state = self._core().state
        executor = state.executors.get((fid, eid))
        if executor is None:
            return Resources()
        total = executor.info.resources
        for task_id in sorted(executor.live):
            task = state.tasks.get((fid, task_id))
            if task is not None:
                total = total + task.info.resources
        return total

    def _resize(self, message: Message) -> None:
        if isinstance(message, LaunchTaskGroup):
            fid, eid = message.framework_id, message.executor.executor_id
        elif isinstance(message, LaunchTask) and message.task.executor is not None:
            fid, eid = message.framework_id, message.task.executor.executor_id
        else:
            return
        container = self._executors.get((fid, eid))
        if container is None:
            return
        limits = limits_of(self.executor_resources(fid, eid), self._containerizer.config)
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
        executor = self._core().state.executors.get((fid, eid))
        if cgroups is None or executor is None:
            return limitation
        for task_id in sorted(executor.tasks):
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
            for task in self._core().state.tasks.values()
            if task.launched and not is_final(task.state)
        ]
        try:
            return sample_usage(cgroups, live, time.time())
        except Exception:  # a report is never worth the heartbeat
            log.exception("usage_sampling_failed")
            return ()
