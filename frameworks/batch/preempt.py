"""Priority preemption within a queue, as Slurm's ``PreemptMode`` (per queue: requeue, cancel
or off).

In a queue whose mode is not ``off``, a job that has waited ``preempt_after`` seconds with tasks
ready to run and none of its tasks running (nothing in the offers fit it) may stop running tasks
of *lower-priority* jobs of the same queue: lowest priority first, newest first, never a task
that started less than ``preempt_min_runtime`` ago, never one already being stopped, and only
enough of them for what the waiting job needs: its tasks (by cpus and memory) must fit in what
the victims free, one agent each (what is free already is not counted: nothing fitted), and a
victim on an agent where none of them would fit is spared. A gang job preempts whole gangs only
(every rank of a victim gang), and only when all its ranks would then fit; a gang victim is
always stopped whole. A victim gets the normal kill (SIGTERM, then the grace period). When it
has ended, mode ``requeue`` requeues it without using a retry or a loss, mode ``cancel`` ends it
CANCELLED; its reason says ``PREEMPTED by job N (priority P)`` either way. Until the waiting
job's victims have ended it preempts nothing more, and then it waits ``preempt_after`` again (the
offers of what they freed come first).

Functions over a :class:`~agora.frameworks.batch.core.BatchCore`, pure: time is an argument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agora.frameworks.batch.actions import Action
from agora.frameworks.batch.records import JobRecord, TaskRecord, TaskState

if TYPE_CHECKING:
    from agora.frameworks.batch.core import BatchCore

__all__ = ["MODES", "by_whom", "preempt"]

MODES = ("off", "requeue", "cancel")
_PREFIX = "preempt:"
_MANY = float(1 << 30)  # a claimant that asks for none of a resource fits any amount of it


def by_whom(kill_reason: str) -> tuple[int, int] | None:
    """(job, priority) that preempted a task whose kill reason this is; None if none did."""
    if not kill_reason.startswith(_PREFIX):
        return None
    job, priority = kill_reason.removeprefix(_PREFIX).split(":")
    return int(job), int(priority)


def preempt(core: BatchCore, now: float) -> list[Action]:
    """Stop what higher-priority waiting jobs need, in the queues where preemption is on."""
    config = core.config
    actions: list[Action] = []
    waiting = _waiting(core, now)
    for queue, mode in sorted(config.preempt.items()):
        if mode == "off":
            continue
        for job in sorted(
            (j for j in waiting if j.spec.role == queue),
            key=lambda j: (-j.spec.priority, j.submit_time, j.job_id),
        ):
            actions += _for(core, job, now)
    return actions


def _waiting(core: BatchCore, now: float) -> list[JobRecord]:
    """Jobs with tasks ready and none running that have waited long enough (``ready_since``)."""
    out = []
    for job in core._schedulable():
        job_id = job.job_id
        if core.active_per_job.get(job_id, 0):
            core.ready_since.pop(job_id, None)  # some of it runs: it is not starved
            continue
        victims = core.preempted_for.get(job_id)
        if victims is not None:
            if any(t.task_id in core.active for t in victims):
                continue  # its victims are still stopping
            # They have stopped: what they freed is offered first; wait ``preempt_after`` again
            # before stopping more (else a tick between their end and that offer would).
            del core.preempted_for[job_id]
            core.ready_since[job_id] = now
            continue
        since = core.ready_since.setdefault(job_id, now)
        if now - since < core.config.preempt_after:
            continue
        out.append(job)
    return out


def _placeable(freed: dict[str, list[float]], cpus: float, mem: float) -> int:
    """How many tasks of ``cpus`` and ``mem`` each fit in what is freed on each agent."""
    count = 0
    for free_cpus, free_mem in freed.values():
        fits = [free_cpus / cpus if cpus > 0 else _MANY, free_mem / mem if mem > 0 else _MANY]
        count += int(min(fits) + 1e-9)
    return count


def _for(core: BatchCore, claimant: JobRecord, now: float) -> list[Action]:
    config = core.config
    queue, priority = claimant.spec.role, claimant.spec.priority
    victims: list[list[TaskRecord]] = []  # gangs whole, other tasks one by one
    for job_id, job in core.jobs.items():
        if job.spec.role != queue or job.spec.priority >= priority:
            continue
        running = [
            t
            for t in core.tasks[job_id]
            if t.task_id in core.active
            and t.state is TaskState.RUNNING
            and not t.kill_reason
            and t.start_time is not None
            and now - t.start_time >= config.preempt_min_runtime
        ]
        if job.spec.is_gang:
            if running and len(running) == sum(t.state.active for t in core.tasks[job_id]):
                victims.append(running)
        else:
            victims.extend([t] for t in running)
    victims.sort(
        key=lambda group: (core.jobs[group[0].job_id].spec.priority, -(group[0].start_time or 0))
    )
    # Victims in that order until the claimant's tasks would fit on the agents they free.
    cpus, mem = claimant.spec.cpus, claimant.spec.mem
    need = claimant.spec.ntasks if claimant.spec.is_gang else len(core.ready[claimant.job_id])
    freed: dict[str, list[float]] = {}
    groups: list[list[TaskRecord]] = []
    for group in victims:
        if _placeable(freed, cpus, mem) >= need:
            break
        groups.append(group)
        spec = core.jobs[group[0].job_id].spec
        for task in group:
            room = freed.setdefault(task.agent_id, [0.0, 0.0])
            room[0] += spec.cpus
            room[1] += spec.mem
    if claimant.spec.is_gang and _placeable(freed, cpus, mem) < need:
        return []  # a gang preempts only when it would then fit
    # A task on an agent where what is freed fits none of the claimant's would die for nothing.
    useful = {agent for agent, room in freed.items() if _placeable({agent: room}, cpus, mem)}
    chosen = [t for g in groups if any(t.agent_id in useful for t in g) for t in g]
    if not chosen:
        return []
    reason = f"{_PREFIX}{claimant.job_id}:{priority}"
    actions: list[Action] = []
    for task in chosen:
        task.kill_reason = reason
        core._mark(task)
        actions.append(core._kill(task, now))
    core.preempted_for[claimant.job_id] = chosen
    return actions
