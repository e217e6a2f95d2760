"""Launching executors: turning the core's ``LaunchExecutor`` into a started process.

The daemon knows what the core does not: its executor endpoint, the work dir on disk, the
isolators in use, whether it may switch users, and its own environment (its ``AGORA_*`` options
are not passed on). From those and the action this decides the executor's command line,
environment and user, and whether it starts in a container (a custom executor under isolation),
by a fork of the zygote (a built-in executor, once the zygote runs) or by exec; then
:class:`agora.agent.server.processes.ExecutorProcesses` starts and watches it.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Mapping

import structlog
from agora.agent.containers.isolation import CONTAINER_CONFIG_ENV, ContainerConfig
from agora.agent.core import LaunchExecutor, LinkVolumes
from agora.agent.server import volumes
from agora.agent.server.config import DaemonSettings, option_env_names
from agora.agent.server.containment import AgentContainment
from agora.agent.server.executor_start import (
    ExecutorStarter,
    LaunchError,
    executor_argv,
    executor_environment,
    resolve_sandbox,
    runs_default_executor,
)
from agora.agent.server.processes import ExecutorProcesses
from agora.agent.server.zygote import ExecutorZygote
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID

__all__ = ["ExecutorLauncher"]

log = structlog.get_logger(__name__)


class ExecutorLauncher:
    """Starts executors for one agent; :meth:`launch` never raises."""

    def __init__(
        self,
        processes: ExecutorProcesses,
        containment: AgentContainment,
        *,
        settings: DaemonSettings,
        work_dir: str,
        endpoint: str,
        containers: ContainerConfig,
        environ: Mapping[str, str],
        grace: float,
        agent_id: Callable[[], AgentID | None],
    ) -> None:
        self._processes = processes
        self._containment = containment
        self._settings = settings
        self._work_dir = work_dir
        self._endpoint = endpoint
        self._containers = containers
        self._environ = environ
        self._grace = grace
        self._agent_id = agent_id
        self._drop_env = option_env_names()
        self._zygote: ExecutorZygote | None = None
        if processes.subreaper:
            # Built-in executors are forked from a warm process (re-parented to us, a subreaper).
            base = {k: v for k, v in environ.items() if k not in self._drop_env}
            self._zygote = ExecutorZygote(base)
        #: Set at shutdown: every launch from then on fails.
        self.stopping = False

    @property
    def work_dir(self) -> str:
        return self._work_dir

    def close(self) -> None:
        """Stop the zygote, if it runs (executors it forked are not touched)."""
        if self._zygote is not None:
            self._zygote.close()

    def launch(self, action: LaunchExecutor) -> str | None:
        """Start the executor; None when it is running, else why it could not start."""
        fid, eid = action.framework_id, action.executor_id
        try:
            if self.stopping:
                raise LaunchError("the agent is shutting down")
            sandbox = resolve_sandbox(self._work_dir, action.sandbox)
            argv = executor_argv(action.info, action.builtin)
            required = {"AGORA_AGENT_ENDPOINT": self._endpoint, "AGORA_SANDBOX": sandbox}
            user = action.user
            if action.builtin or runs_default_executor(action.info):
                # Ours: it runs as the agent (it builds the tasks' containers) and starts each
                # task as the framework's user.
                required[CONTAINER_CONFIG_ENV] = self._containers.to_json()
                if user and self._settings.switch_user:
                    required["AGORA_TASK_USER"] = user
                if not self._settings.switch_user:
                    required["AGORA_SWITCH_USER"] = "0"
                if not action.builtin:
                    required["AGORA_DEFAULT_EXECUTOR"] = "1"
                user = None
            starter = None
            if not (action.builtin or runs_default_executor(action.info)):
                starter = self._containment.executor_starter(action, required)
            env = executor_environment(
                self._environ,
                drop=self._drop_env,
                info=action.info,
                given=self._executor_defaults(fid, eid) | dict(action.environment),
                required=required,
            )
            self._processes.launch(
                fid, eid, argv, sandbox, env, user, starter, self._fork_starter(action)
            )
        except LaunchError as exc:
            log.warning("executor_launch_failed", framework_id=fid, executor_id=eid, error=str(exc))
            return str(exc)
        except Exception as exc:  # the core must hear about every launch, whatever happened
            log.exception("executor_launch_crashed", framework_id=fid, executor_id=eid)
            return f"internal error: {exc!r}"
        return None

    def link_volumes(self, action: LinkVolumes) -> None:
        """The persistent volumes at ``volumes/<id>`` in the sandbox (volumes.py), owned by the
        user the tasks run as. A failure is logged: the task then finds no volume there."""
        try:
            owner = None
            if action.user and self._settings.switch_user:
                entry = pwd.getpwnam(action.user)
                owner = (entry.pw_uid, entry.pw_gid)
            sandbox = resolve_sandbox(self._work_dir, action.sandbox)
            volumes.link(self._work_dir, sandbox, action.resources, owner)
        except (KeyError, OSError, ValueError, LaunchError) as exc:
            log.error("volume_link_failed", sandbox=action.sandbox, error=str(exc))

    def _fork_starter(self, action: LaunchExecutor) -> ExecutorStarter | None:
        """The zygote's spawn for a built-in executor once the zygote runs. The first launch
        starts the zygote and is itself started by exec: it need not wait for the zygote's
        imports, and an agent that never runs a built-in executor never pays for them."""
        zygote = self._zygote
        if zygote is None or not (action.builtin or runs_default_executor(action.info)):
            return None
        if zygote.pid is None:
            try:
                zygote.start()
            except OSError as exc:  # this launch and the next go by exec; it is tried again
                log.warning("executor_zygote_start_failed", error=str(exc))
            return None
        return zygote.spawn

    def _executor_defaults(self, fid: FrameworkID, eid: ExecutorID) -> dict[str, str]:
        env = {
            "AGORA_FRAMEWORK_ID": str(fid),
            "AGORA_EXECUTOR_ID": str(eid),
            "AGORA_SHUTDOWN_GRACE_PERIOD": repr(self._grace),
            "AGORA_RECOVERY_TIMEOUT": repr(self._settings.recovery_timeout),
        }
        agent_id = self._agent_id()
        if agent_id is not None:
            env["AGORA_AGENT_ID"] = str(agent_id)
        return env
