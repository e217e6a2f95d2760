"""``TaskSpec``: a task as a framework author writes it, and its ``TaskInfo`` on one offer.

Resources are matched to the offer's role: a spec written with unreserved amounts
(``cpus:1;mem:128``) takes what the offer has reserved to its role first and the rest from
unreserved resources, so the same spec works on reserved and unreserved offers alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agora.sdk.ids import ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    URI,
    CommandInfo,
    ContainerInfo,
    ExecutorInfo,
    HealthCheck,
    Offer,
    TaskInfo,
)
from agora.sdk.resources import UNRESERVED, Resources
from msgspec.structs import replace

__all__ = ["TaskSpec", "default_executor", "fit_resources", "task_infos_for"]


def default_executor(executor_id: str, *, name: str = "") -> ExecutorInfo:
    """An executor that names no command: the agent runs its built-in default executor, which
    launches a task group's command tasks together (Mesos's DEFAULT executor). Give each group
    its own id; ``framework_id`` is filled in at launch."""
    return ExecutorInfo(
        executor_id=ExecutorID(executor_id),
        framework_id=FrameworkID(""),
        command=CommandInfo(),
        name=name or "Default Executor",
    )


@dataclass(frozen=True)
class TaskSpec:
    """One task to launch.

    ``command``: a string runs through ``/bin/sh -c``; a sequence of strings is an argv run
    directly. It must be empty (``""``) when ``executor`` is given: the task then goes to that
    custom executor (whose ``framework_id`` may be left ``""``: it is filled from the offer).
    ``resources``: a :class:`Resources` or its text form. ``task_id`` defaults to ``name``.
    ``environment`` is added to the command's environment; ``labels`` travel with the task
    (``agora.stream_output="1"`` asks the command executor to stream output back).
    ``uris`` are fetched into the sandbox first (a str is a URI with the defaults);
    ``health_check`` is run by the executor once the task runs; ``container`` asks for an image,
    volumes, network isolation or a host name; ``user`` overrides the framework's user.
    """

    name: str
    command: str | Sequence[str]
    resources: Resources | str
    task_id: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    kill_grace_period: float | None = None
    executor: ExecutorInfo | None = None
    data: bytes = b""
    uris: Sequence[URI | str] = ()
    health_check: HealthCheck | None = None
    container: ContainerInfo | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.resources, str):
            object.__setattr__(self, "resources", Resources.parse(self.resources))
        elif not isinstance(self.resources, Resources):
            raise TypeError(f"resources must be Resources or str, not {type(self.resources)}")
        if not isinstance(self.command, str):
            argv = tuple(self.command)
            if not all(isinstance(a, str) for a in argv):
                raise TypeError("command argv items must be strings")
            object.__setattr__(self, "command", argv)
        has_command = bool(self.command)
        if self.executor is None and not has_command:
            raise ValueError(f"task {self.name!r}: a command or an executor is required")
        if self.executor is not None and has_command:
            raise ValueError(f"task {self.name!r}: give a command or an executor, not both")
        if not self.name and not self.task_id:
            raise ValueError("a task needs a name or a task_id")

    @property
    def id(self) -> TaskID:
        return TaskID(self.task_id if self.task_id is not None else self.name)

    @property
    def needs(self) -> Resources:
        """The resources asked for, as written (before matching them to an offer's role)."""
        res = self.resources
        assert isinstance(res, Resources)
        return res

    def command_info(self) -> CommandInfo | None:
        cmd = self.command
        if self.executor is not None:
            return None
        env = dict(self.environment)
        uris = tuple(u if isinstance(u, URI) else URI(value=u) for u in self.uris)
        if isinstance(cmd, str):
            return CommandInfo(value=cmd, shell=True, environment=env, uris=uris, user=self.user)
        return CommandInfo(argv=tuple(cmd), shell=False, environment=env, uris=uris, user=self.user)

    def to_task_info(self, offer: Offer, resources: Resources | None = None) -> TaskInfo:
        """The TaskInfo of this spec on ``offer``.

        ``resources`` overrides what the task uses (normally :func:`fit_resources`'s answer);
        without it the spec's resources are matched to the whole offer. Raises ValueError when
        they do not fit.
        """
        if resources is None:
            resources = fit_resources(self.needs, offer.resources, offer.role)
            if resources is None:
                raise ValueError(
                    f"task {self.id}: {self.needs} does not fit offer {offer.offer_id} "
                    f"({offer.resources})"
                )
        executor = self.executor
        if executor is not None and not executor.framework_id:
            executor = replace(executor, framework_id=offer.framework_id)
        return TaskInfo(
            task_id=self.id,
            name=self.name or str(self.id),
            agent_id=offer.agent_id,
            resources=resources,
            command=self.command_info(),
            executor=executor,
            labels=dict(self.labels),
            data=self.data,
            kill_grace_period=self.kill_grace_period,
            health_check=self.health_check,
            container=self.container,
        )


def fit_resources(need: Resources, available: Resources, role: str) -> Resources | None:
    """The role-annotated resources that satisfy ``need`` out of ``available``, or None.

    ``need`` as written when ``available`` holds it; otherwise, for an unreserved ``need`` on
    an offer of a role, scalars come from the role's reservation first and from unreserved
    resources for the rest, and each range or set entry comes whole from one or the other.
    """
    if available.contains(need):
        return need
    if role == UNRESERVED or need.roles() != {UNRESERVED}:
        return None
    reserved = available.reserved(role)
    parts: dict[str, object] = {}
    for name, value in need.to_dict().items():
        if isinstance(value, int | float):
            want = need.scalar_milli(name)
            from_role = min(reserved.scalar_milli(name), want)
            if from_role:
                parts[f"{name}({role})"] = from_role / 1000
            if want - from_role:
                parts[name] = (want - from_role) / 1000
        else:
            entry = Resources.from_dict({name: value})
            in_role = reserved.contains(entry.flatten(role))
            parts[f"{name}({role})" if in_role else name] = value
    fitted = Resources.from_dict(parts)
    return fitted if available.contains(fitted) else None


def task_infos_for(
    offers: Sequence[Offer], tasks: Sequence[TaskSpec | TaskInfo]
) -> tuple[tuple[OfferID, ...], list[TaskInfo]]:
    """Place ``tasks`` on ``offers`` (all of one agent) the way the master checks an ACCEPT.

    Each TaskSpec takes its resources from the first offer whose remainder holds them; a
    TaskInfo is passed through unchanged (its resources are still counted). Raises ValueError
    when the offers span agents or a spec does not fit what is left.
    """
    if not offers:
        raise ValueError("launch needs at least one offer")
    agent_ids = {o.agent_id for o in offers}
    if len(agent_ids) != 1:
        raise ValueError("offers from different agents cannot be combined")
    remaining = [o.resources for o in offers]
    infos: list[TaskInfo] = []
    for task in tasks:
        if isinstance(task, TaskInfo):
            infos.append(task)
            for i, left in enumerate(remaining):
                if left.contains(task.resources):
                    remaining[i] = left - task.resources
                    break
            continue
        for i, offer in enumerate(offers):
            used = fit_resources(task.needs, remaining[i], offer.role)
            if used is not None:
                remaining[i] = remaining[i] - used
                infos.append(task.to_task_info(offer, used))
                break
        else:
            left_text = "; ".join(str(r) for r in remaining)
            raise ValueError(
                f"task {task.id}: {task.needs} does not fit what is left of the offers "
                f"({left_text})"
            )
    return tuple(o.offer_id for o in offers), infos
