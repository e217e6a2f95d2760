"""GPU assignment: each command task that asks for ``gpus`` gets exactly that many of the agent's
GPUs (``AgentConfig.gpus``), named to it in CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES; a task
asking for none sees none.

A task's GPUs are chosen when it is handed to its executor (the lowest free indices), held in
``Task.gpus`` (so checkpointed with the task and back after a restart), and free again as soon as
the task is over. The free GPUs are those of the config that no task in the state holds. A task
that asks for more than are free is handed over with none, and the shell hears
``GpusUnavailable`` (the master's accounting makes this rare: it offers only the GPUs the agent
advertises). With ``AgentConfig.gpus`` None (no GPU isolation) tasks go out untouched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from agora.agent.core.actions import GpusUnavailable
from agora.agent.core.state import AgentState, Task, is_final
from agora.sdk.messages import TaskInfo
from msgspec.structs import replace

__all__ = ["adopt_legacy", "free_gpus", "handed_over", "visible_devices", "wanted"]


def wanted(info: TaskInfo) -> int:
    """How many GPUs the task asks for (a fraction rounds up)."""
    return math.ceil(info.resources.scalar("gpus") - 1e-9)


def free_gpus(st: AgentState) -> list[int]:
    """The agent's GPUs no task holds, lowest first."""
    if st.config.gpus is None:
        return []
    held = {g for task in st.tasks.values() for g in task.gpus}
    return [g for g in sorted(set(st.config.gpus)) if g not in held]


def visible_devices(gpus: Sequence[int]) -> dict[str, str]:
    """The environment that shows a process exactly ``gpus``: ``"0,2"``; ``""`` for none."""
    indices = ",".join(str(g) for g in sorted(gpus))
    return {
        "CUDA_VISIBLE_DEVICES": indices,
        "NVIDIA_VISIBLE_DEVICES": indices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def handed_over(st: AgentState, task: Task) -> TaskInfo:
    """The TaskInfo to give the executor: a command task gets its GPUs (chosen now, unless it
    holds some already) in its environment."""
    info = task.info
    if st.config.gpus is None or info.command is None:
        return info
    count = wanted(info)
    if not task.gpus and count > 0:
        free = free_gpus(st)
        if count > len(free):
            owner = f"{task.framework_id}/{info.task_id}"
            total = len(set(st.config.gpus))
            error = f"{owner} wants {count} GPUs, {len(free)} of {total} are free"
            st.outbox.append(GpusUnavailable(task.framework_id, info.task_id, error))
        else:
            task.gpus = tuple(free[:count])
            st.touch(task)
    env = dict(info.command.environment)
    env.update(visible_devices(task.gpus))
    return replace(info, command=replace(info.command, environment=env))


def adopt_legacy(st: AgentState, assigned: Mapping[str, Sequence[int]]) -> None:
    """Recovery from an agent that kept assignments in ``gpus.json`` (``"<fid>/<tid>"`` ->
    indices): live tasks that hold none in the checkpoint take theirs, as far as they are the
    agent's GPUs and no other task holds them."""
    if st.config.gpus is None or not assigned:
        return
    known = set(st.config.gpus)
    for key in sorted(st.tasks):
        task = st.tasks[key]
        indices = assigned.get(f"{task.framework_id}/{task.info.task_id}")
        if task.gpus or indices is None or is_final(task.state):
            continue
        free = set(free_gpus(st))
        mine = tuple(sorted({i for i in indices if i in known and i in free}))
        if mine:
            task.gpus = mine
            st.touch(task)
