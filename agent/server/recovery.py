"""Recovering an agent's executors after a restart: which survived, and what to keep of them.

The checkpoint lists the executors the previous agent process ran. Those whose process still runs
(by ``executor.pid`` in their sandbox, checked against the sandbox the process started in) are
adopted: watched again, and their containers taken back. The core then decides what becomes of
them (re-attach, or kill in ``--recover=cleanup`` mode) and of the tasks of those that died;
afterwards only the containers of live executors and of their tasks are kept.

GPU assignments are checkpointed with their tasks. An agent of an earlier version kept them in
``<work-dir>/gpus.json`` instead: that file is read once, on the first recovery, handed to the
core (which records each live task's GPUs in its checkpoint) and removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping

import structlog
from agora.agent.containers.containerizer import container_name
from agora.agent.core import Agent
from agora.agent.server.checkpointing import Checkpointer, find_alive
from agora.agent.server.containment import AgentContainment
from agora.agent.server.executor_start import LaunchError, resolve_sandbox
from agora.agent.server.processes import ExecutorProcesses
from agora.sdk.ids import ExecutorID, FrameworkID

__all__ = ["LEGACY_GPUS", "adopt_survivors", "legacy_gpus", "live_containers", "recover_agent"]

log = structlog.get_logger(__name__)

Executor = tuple[FrameworkID, ExecutorID]

#: Where agents before the core assigned GPUs kept the assignments (under the work dir).
LEGACY_GPUS = "gpus.json"


def legacy_gpus(work_dir: str) -> dict[str, list[int]]:
    """The assignments in an earlier agent's ``gpus.json`` (``"<fid>/<tid>"`` -> GPU indices);
    empty when there is none, or (logged) when it cannot be read."""
    path = os.path.join(work_dir, LEGACY_GPUS)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("gpu_assignments_unreadable", path=path, error=str(exc))
        return {}
    out: dict[str, list[int]] = {}
    for owner, indices in saved.items() if isinstance(saved, dict) else ():
        try:
            out[str(owner)] = [int(i) for i in indices]
        except (TypeError, ValueError) as exc:
            log.warning("gpu_assignment_not_restored", owner=owner, error=str(exc))
    return out


def adopt_survivors(
    work_dir: str,
    records: Mapping[tuple[str, str], bytes],
    processes: ExecutorProcesses,
    containment: AgentContainment,
) -> dict[Executor, int]:
    """Adopt the checkpointed executors still running: their pids by (framework id, executor
    id). Raises LaunchError when the checkpoint names a sandbox outside the work dir."""
    alive = find_alive(work_dir, Checkpointer.executors(records))
    for (fid, eid), pid in list(alive.items()):
        sandbox = resolve_sandbox(work_dir, f"frameworks/{fid}/executors/{eid}")
        if processes.adopt(fid, eid, pid, sandbox) is None:
            del alive[(fid, eid)]
        else:
            containment.adopt_executor(fid, eid, pid, sandbox)
    return alive


def recover_agent(
    core: Agent,
    records: Mapping[tuple[str, str], bytes],
    *,
    work_dir: str,
    processes: ExecutorProcesses,
    containment: AgentContainment,
    mode: str,
    now: float,
) -> tuple[dict[Executor, int], list[object]] | None:
    """Adopt the surviving executors and give ``core`` its state back from ``records`` (``mode``
    "cleanup": the survivors are to be killed): (the survivors' pids, the core's actions). None
    (logged) when the checkpoint cannot be read: the agent must not start."""
    try:
        alive = adopt_survivors(work_dir, records, processes, containment)
        gpus = legacy_gpus(work_dir)
        actions = core.recover(
            records, now, alive=set(alive), cleanup=mode == "cleanup", legacy_gpus=gpus
        )
    except (ValueError, LaunchError) as exc:
        log.error(
            "checkpoint_unreadable",
            error=str(exc),
            hint="move <work-dir>/meta away to start this agent afresh",
        )
        return None
    log.info(
        "agent_recovered",
        agent_id=core.agent_id,
        tasks=len(core.tasks()),
        executors_alive=len(alive),
        mode=mode,
    )
    # From now on the checkpoint holds the GPUs (committed right after this returns).
    _remove(os.path.join(work_dir, LEGACY_GPUS))
    return alive, list(actions)


def live_containers(core: Agent, alive: Collection[Executor]) -> list[str]:
    """The containers to keep: those of the live executors and of their tasks."""
    live = [
        container_name(task.framework_id, task.info.task_id)
        for task in core.tasks().values()
        if (task.framework_id, task.executor_id) in alive
    ]
    live += [container_name(fid, "executor", eid) for fid, eid in alive]
    return live


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("gpu_assignments_not_removed", path=path, error=str(exc))
