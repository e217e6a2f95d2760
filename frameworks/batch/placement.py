"""From a job's task to the TaskInfo that runs it on an offer, and the gang request of a gang job.

A task runs as its job's user (``run_as``; a job stored before jobs ran as their users names none
and runs as the framework's user). A command runs through ``/bin/sh -c``; a job script travels in
the task's environment and is written into the sandbox and executed there (so its ``#!`` line
picks the interpreter), with its arguments. The working directory, when given, is entered first
(the task fails if it cannot be).
"""

from __future__ import annotations

import shlex
from functools import lru_cache

from agora.frameworks.batch.records import JobRecord, TaskRecord
from agora.frameworks.batch.spec import JobSpec
from agora.sdk.ids import GangID
from agora.sdk.messages import GangRequest, Offer, TaskInfo
from agora.sdk.messages.enums import Placement
from agora.sdk.resources import Resources
from agora.sdk.scheduler.spec import TaskSpec

__all__ = ["command_text", "gang_id_of", "gang_request", "task_info", "task_resources"]

#: How long the master may hold resources aside for a gang before telling us it expired (the
#: core asks again at once, so this only bounds how long a stale hold can last).
GANG_HOLD_SECONDS = 300.0

_SCRIPT_FILE = '"${AGORA_SANDBOX:-.}/agora-job-script"'


@lru_cache(maxsize=4096)
def _resources(text: str) -> Resources:
    return Resources.parse(text)


def task_resources(spec: JobSpec) -> Resources:
    return _resources(spec.resources_text())


def command_text(spec: JobSpec) -> str:
    """The shell text the task runs."""
    prefix = f"cd -- {shlex.quote(spec.workdir)} || exit 1\n" if spec.workdir else ""
    if not spec.script:
        return prefix + spec.command
    args = " ".join(shlex.quote(a) for a in spec.script_args)
    return (
        f"printf '%s' \"$AGORA_JOB_SCRIPT\" > {_SCRIPT_FILE} && chmod 700 {_SCRIPT_FILE} "
        "|| exit 1\nunset AGORA_JOB_SCRIPT\n" + prefix + f"exec {_SCRIPT_FILE} {args}".rstrip()
    )


def _environment(job: JobRecord, task: TaskRecord) -> dict[str, str]:
    spec = job.spec
    env = dict(spec.environment)
    env.update(
        AGORA_JOB_ID=str(job.job_id),
        AGORA_JOB_NAME=spec.name,
        AGORA_JOB_USER=spec.user,
        AGORA_ATTEMPT=str(task.attempt),
    )
    if spec.array is not None:
        env["AGORA_ARRAY_JOB_ID"] = str(job.job_id)
        env["AGORA_ARRAY_INDEX"] = str(task.index)
    if spec.is_gang:
        env["AGORA_NTASKS"] = str(spec.ntasks)
        env["AGORA_RANK"] = str(task.index)
    if spec.script:
        env["AGORA_JOB_SCRIPT"] = spec.script
    return env


def task_info(job: JobRecord, task: TaskRecord, offer: Offer, used: Resources) -> TaskInfo:
    """The TaskInfo of ``task``'s current attempt (``task.task_id``) on ``offer``."""
    spec = job.spec
    single = spec.array is None and not spec.is_gang
    name = spec.name if single else f"{spec.name}[{task.index}]"
    return TaskSpec(
        name=name,
        command=command_text(spec),
        resources=used,
        task_id=task.task_id,
        environment=_environment(job, task),
        user=job.run_as or None,
    ).to_task_info(offer, used)


def gang_id_of(job_id: int, attempt: int) -> GangID:
    return GangID(f"batch-{job_id}-{attempt}")


def gang_request(job: JobRecord, attempt: int) -> GangRequest:
    spec = job.spec
    return GangRequest(
        gang_id=gang_id_of(job.job_id, attempt),
        role=spec.role,
        count=spec.ntasks,
        shape=task_resources(spec),
        placement=Placement.ANY,
        hold_timeout=GANG_HOLD_SECONDS,
        max_per_agent=spec.ntasks_per_node,
    )
