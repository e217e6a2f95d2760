"""A batch job as submitted: what to run, on what, how many times, after what.

``JobSpec`` is the one description of a job: the CLI builds it from options and ``#AGORA``
directives (:mod:`agora.frameworks.batch.parse`), it travels to the service as JSON
(:meth:`JobSpec.to_json` / :meth:`JobSpec.from_json`), and the job store keeps it as that JSON.
``from_json`` checks every field (types, ranges, sizes), so a hostile or malformed body is a
:class:`SpecError` naming the field, never a half-built job.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Final

__all__ = [
    "MAX_ARRAY_TASKS",
    "MAX_NTASKS",
    "ArraySpec",
    "Constraint",
    "DepKind",
    "Dependency",
    "JobSpec",
    "SpecError",
]

#: The most tasks one array may have (Slurm's MaxArraySize is 1001 by default; ours is larger).
MAX_ARRAY_TASKS: Final = 100_000
#: The most tasks of one gang job.
MAX_NTASKS: Final = 1024
MAX_COMMAND: Final = 64 * 1024
MAX_NAME: Final = 128
MAX_ENV: Final = 256
MAX_DEPENDENCIES: Final = 64
MAX_CONSTRAINTS: Final = 32
MAX_RETRIES: Final = 100
MAX_TIME_LIMIT: Final = 365 * 86_400.0
MAX_PRIORITY: Final = 1_000_000


class SpecError(ValueError):
    """A job that cannot be queued; the message names the problem."""


class DepKind(StrEnum):
    AFTEROK = "afterok"  # the job completed: every task exited 0
    AFTERANY = "afterany"  # the job ended, however
    AFTERNOTOK = "afternotok"  # the job ended in any state but COMPLETED


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: DepKind
    job_id: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.job_id}"


@dataclass(frozen=True, slots=True)
class Constraint:
    """``attribute=value`` (``negate``: ``attribute!=value``) on the agent's attributes; an agent
    without the attribute fails ``=`` and passes ``!=``."""

    attribute: str
    value: str
    negate: bool = False

    def allows(self, attributes: Mapping[str, str]) -> bool:
        return (attributes.get(self.attribute) == self.value) != self.negate

    def __str__(self) -> str:
        return f"{self.attribute}{'!=' if self.negate else '='}{self.value}"


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Array indices as ``(start, stop, step)`` ranges (``stop`` inclusive), at most
    ``max_running`` of them running at once (0: no cap). ``0-999%50`` is ``((0, 999, 1),), 50``."""

    ranges: tuple[tuple[int, int, int], ...]
    max_running: int = 0

    def indices(self) -> Iterator[int]:
        seen: set[int] = set()
        for start, stop, step in self.ranges:
            for i in range(start, stop + 1, step):
                if i not in seen:
                    seen.add(i)
                    yield i

    def count(self) -> int:
        return sum(1 for _ in self.indices())

    def __str__(self) -> str:
        parts = []
        for start, stop, step in self.ranges:
            text = str(start) if start == stop else f"{start}-{stop}"
            parts.append(text + (f":{step}" if step != 1 else ""))
        return ",".join(parts) + (f"%{self.max_running}" if self.max_running else "")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job. ``command`` is shell text (``/bin/sh -c``); ``script`` the text of a job script
    (run as a file, with ``script_args``), exactly one of the two. Resources are per task:
    ``cpus``, ``mem`` and ``disk`` in MiB, ``gpus``. ``array`` makes one task per index;
    ``ntasks`` > 1 makes a gang job (all tasks start together, at most ``ntasks_per_node`` on
    one agent). ``time_limit`` in seconds (None: none); ``retries``: extra attempts after a
    failure. ``queue`` is the Agora role the tasks run in ("default" is the role ``*``)."""

    name: str
    user: str
    command: str = ""
    script: str = ""
    script_args: tuple[str, ...] = ()
    cpus: float = 1.0
    mem: float = 128.0
    disk: float = 0.0
    gpus: int = 0
    array: ArraySpec | None = None
    ntasks: int = 1
    ntasks_per_node: int = 0
    dependencies: tuple[Dependency, ...] = ()
    priority: int = 0
    queue: str = "default"
    time_limit: float | None = None
    retries: int = 0
    environment: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        _check(self)

    @property
    def role(self) -> str:
        return "*" if self.queue == "default" else self.queue

    @property
    def is_gang(self) -> bool:
        return self.ntasks > 1

    def task_count(self) -> int:
        """Tasks of the job: the array's indices, else ``ntasks`` ranks (1 for a plain job)."""
        return self.array.count() if self.array is not None else self.ntasks

    def task_indices(self) -> list[int]:
        return list(self.array.indices()) if self.array is not None else list(range(self.ntasks))

    def resources_text(self) -> str:
        """One task's resources in Agora's text form, e.g. ``cpus:1;mem:128``."""
        parts = [f"cpus:{_num(self.cpus)}", f"mem:{_num(self.mem)}"]
        if self.disk:
            parts.append(f"disk:{_num(self.disk)}")
        if self.gpus:
            parts.append(f"gpus:{self.gpus}")
        return ";".join(parts)

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "user": self.user,
            "command": self.command,
            "script": self.script,
            "script_args": list(self.script_args),
            "cpus": self.cpus,
            "mem": self.mem,
            "disk": self.disk,
            "gpus": self.gpus,
            "array": None
            if self.array is None
            else {
                "ranges": [list(r) for r in self.array.ranges],
                "max_running": self.array.max_running,
            },
            "ntasks": self.ntasks,
            "ntasks_per_node": self.ntasks_per_node,
            "dependencies": [str(d) for d in self.dependencies],
            "priority": self.priority,
            "queue": self.queue,
            "time_limit": self.time_limit,
            "retries": self.retries,
            "environment": dict(self.environment),
            "workdir": self.workdir,
            "constraints": [str(c) for c in self.constraints],
        }

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        """The spec in ``data`` (from :meth:`to_json`, or a client's JSON); SpecError naming the
        first bad or unknown field."""
        if not isinstance(data, dict):
            raise SpecError("a job spec must be a JSON object")
        unknown = set(data) - _FIELDS
        if unknown:
            raise SpecError(f"unknown job field {sorted(unknown)[0]!r}")
        try:
            name = _str(data, "name", MAX_NAME)
            user = _str(data, "user", MAX_NAME)
        except KeyError as exc:
            raise SpecError(f"the job needs a {exc.args[0]!r}") from None
        return cls(
            name=name,
            user=user,
            command=_str(data, "command", MAX_COMMAND, ""),
            script=_str(data, "script", MAX_COMMAND, ""),
            script_args=tuple(_str_list(data, "script_args", 256)),
            cpus=_float(data, "cpus", 1.0),
            mem=_float(data, "mem", 128.0),
            disk=_float(data, "disk", 0.0),
            gpus=_int(data, "gpus", 0),
            array=_array(data.get("array")),
            ntasks=_int(data, "ntasks", 1),
            ntasks_per_node=_int(data, "ntasks_per_node", 0),
            dependencies=tuple(
                _dependency(d) for d in _str_list(data, "dependencies", MAX_DEPENDENCIES)
            ),
            priority=_int(data, "priority", 0),
            queue=_str(data, "queue", MAX_NAME, "default"),
            time_limit=None if data.get("time_limit") is None else _float(data, "time_limit", 0),
            retries=_int(data, "retries", 0),
            environment=_env(data.get("environment", {})),
            workdir=_str(data, "workdir", 4096, ""),
            constraints=tuple(
                parse_constraint(c) for c in _str_list(data, "constraints", MAX_CONSTRAINTS)
            ),
        )


def parse_constraint(text: str) -> Constraint:
    """``attr=value`` or ``attr!=value``."""
    negate = "!=" in text
    attribute, sep, value = text.partition("!=" if negate else "=")
    attribute, value = attribute.strip(), value.strip()
    if not sep or not attribute or not value:
        raise SpecError(f"bad constraint {text!r}: expected ATTRIBUTE=VALUE or ATTRIBUTE!=VALUE")
    return Constraint(attribute, value, negate)


def _dependency(text: str) -> Dependency:
    kind, sep, job = text.partition(":")
    try:
        dep_kind = DepKind(kind.strip().lower())
    except ValueError:
        raise SpecError(
            f"bad dependency {text!r}: the kind must be afterok, afterany or afternotok"
        ) from None
    if not sep or not job.strip().isdigit():
        raise SpecError(f"bad dependency {text!r}: expected KIND:JOB_ID")
    return Dependency(dep_kind, int(job))


_FIELDS: Final = frozenset(f.name for f in fields(JobSpec))


def _num(value: float) -> str:
    """A resource amount as Agora's text form takes it: thousandths at most, no exponent."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _str(data: dict[str, Any], key: str, limit: int, default: str | None = None) -> str:
    if key not in data:
        if default is None:
            raise KeyError(key)
        return default
    value = data[key]
    if not isinstance(value, str):
        raise SpecError(f"{key} must be a string")
    if len(value) > limit:
        raise SpecError(f"{key} is longer than {limit} characters")
    return value


def _str_list(data: dict[str, Any], key: str, limit: int) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{key} must be a list of strings")
    if len(value) > limit:
        raise SpecError(f"{key} has more than {limit} entries")
    return value


def _float(data: dict[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{key} must be a number")
    try:
        return float(value)
    except OverflowError:
        raise SpecError(f"{key} is out of range") from None


def _int(data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{key} must be a whole number")
    if abs(value) > 2**53:
        raise SpecError(f"{key} is out of range")
    return int(value)


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError("environment must map names to strings")
    return dict(value)


def _array(value: Any) -> ArraySpec | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"ranges", "max_running"}:
        raise SpecError("array must be {ranges, max_running}")
    ranges = value.get("ranges")
    if not isinstance(ranges, list) or not ranges or len(ranges) > 1024:
        raise SpecError("array ranges must be a list of 1 to 1024 [start, stop, step]")
    parsed = []
    for r in ranges:
        if (
            not isinstance(r, list)
            or len(r) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
        ):
            raise SpecError("each array range must be [start, stop, step] of whole numbers")
        parsed.append((r[0], r[1], r[2]))
    max_running = value.get("max_running", 0)
    if isinstance(max_running, bool) or not isinstance(max_running, int):
        raise SpecError("array max_running must be a whole number")
    return ArraySpec(tuple(parsed), max_running)


def _check(spec: JobSpec) -> None:
    """Every rule a job must meet on its own (the service adds what needs the cluster)."""
    if not spec.name.strip():
        raise SpecError("the job needs a name")
    if not spec.user.strip():
        raise SpecError("the job needs a user")
    if bool(spec.command) == bool(spec.script):
        raise SpecError("give a command or a script (exactly one)")
    if spec.script_args and not spec.script:
        raise SpecError("script arguments need a script")
    for key, value in (("cpus", spec.cpus), ("mem", spec.mem), ("disk", spec.disk)):
        if not math.isfinite(value) or value < 0 or value > 1e9:
            raise SpecError(f"{key} must be between 0 and 1e9, not {value}")
        if value and value < 0.001:
            raise SpecError(f"{key} must be 0 or at least 0.001 (the finest step), not {value}")
    if spec.cpus <= 0:
        raise SpecError("cpus must be more than 0")
    if spec.mem <= 0:
        raise SpecError("mem must be more than 0")
    if not 0 <= spec.gpus <= 1024:
        raise SpecError("gpus must be between 0 and 1024")
    if not 1 <= spec.ntasks <= MAX_NTASKS:
        raise SpecError(f"ntasks must be between 1 and {MAX_NTASKS}")
    if not 0 <= spec.ntasks_per_node <= MAX_NTASKS:
        raise SpecError(f"ntasks-per-node must be between 0 and {MAX_NTASKS}")
    if spec.ntasks_per_node and spec.ntasks == 1 and spec.ntasks_per_node != 1:
        raise SpecError("ntasks-per-node needs ntasks above 1")
    if spec.array is not None:
        if spec.is_gang:
            raise SpecError("a job is an array or a gang (ntasks > 1), not both")
        _check_array(spec.array)
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        raise SpecError(f"priority must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    if spec.time_limit is not None and not (0 < spec.time_limit <= MAX_TIME_LIMIT):
        raise SpecError("the time limit must be more than 0 and at most 365 days")
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise SpecError(f"retries must be between 0 and {MAX_RETRIES}")
    if len(spec.environment) > MAX_ENV:
        raise SpecError(f"at most {MAX_ENV} environment variables")
    for key in spec.environment:
        if not key or "=" in key or "\0" in key or key.startswith("AGORA_"):
            raise SpecError(f"bad environment variable name {key!r}")
    texts = [spec.name, spec.user, spec.command, spec.script, spec.workdir, *spec.script_args]
    texts += [*spec.environment.values(), *(c.attribute + c.value for c in spec.constraints)]
    if any("\0" in text for text in texts):
        raise SpecError("the job's text must not contain NUL characters")
    if spec.workdir and not spec.workdir.startswith("/"):
        raise SpecError(f"the working directory must be an absolute path, not {spec.workdir!r}")
    if len(spec.dependencies) > MAX_DEPENDENCIES:
        raise SpecError(f"at most {MAX_DEPENDENCIES} dependencies")
    if not spec.queue or any(c in spec.queue for c in "/\\ \t\n,;:") or spec.queue in (".", ".."):
        raise SpecError(f"bad queue name {spec.queue!r}")


def _check_array(array: ArraySpec) -> None:
    if not array.ranges:
        raise SpecError("an array needs at least one index")
    total = 0
    for start, stop, step in array.ranges:
        if start < 0 or stop < start:
            raise SpecError(f"bad array range {start}-{stop}: indices are 0 or more, low to high")
        if step < 1:
            raise SpecError(f"bad array step {step}: it must be 1 or more")
        if stop > 10 * MAX_ARRAY_TASKS:
            raise SpecError(f"array index {stop} is above {10 * MAX_ARRAY_TASKS}")
        total += (stop - start) // step + 1
        if total > MAX_ARRAY_TASKS:
            raise SpecError(f"an array has at most {MAX_ARRAY_TASKS} tasks")
    if array.max_running < 0:
        raise SpecError("the array's % limit must be 1 or more")
