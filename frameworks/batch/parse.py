"""From what a user types to a :class:`JobSpec`: Slurm-style option values and ``#AGORA`` lines.

Pure functions, no I/O: ``agora batch submit`` reads the script and hands its text here. The
options of the command line and of a script's ``#AGORA`` directives go through one parser
(:func:`add_submit_options`); an option given on the command line wins over the same option in a
directive (``--env`` merges by variable name, the command line winning per name). Every bad value
is a :class:`SpecError` naming it, and for a directive the file and line (``job.sh:3: ...``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pwd
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

from agora.frameworks.batch.spec import (
    MAX_ARRAY_TASKS,
    ArraySpec,
    Constraint,
    Dependency,
    DepKind,
    JobSpec,
    SpecError,
    parse_constraint,
)

__all__ = [
    "SUBMIT_OPTIONS",
    "add_submit_options",
    "build_spec",
    "parse_array",
    "parse_dependencies",
    "parse_duration",
    "parse_memory",
    "parse_when",
    "read_directives",
]

DIRECTIVE: Final = "#AGORA"

#: dest -> (flags, metavar, help) of every submit option, in --help order.
SUBMIT_OPTIONS: Final[dict[str, tuple[tuple[str, ...], str, str]]] = {
    "name": (("-J", "--name"), "NAME", "job name (default: the script's or command's name)"),
    "cpus": (("-c", "--cpus"), "N", "cpus per task (default 1)"),
    "mem": (("--mem",), "SIZE", "memory per task: 512 (MiB), 512M, 4G, 1T (default 128M)"),
    "gpus": (("--gpus",), "N", "gpus per task"),
    "disk": (("--disk",), "SIZE", "disk per task, as --mem"),
    "array": (("-a", "--array"), "INDICES", "an array job: 0-999%%50, 1,3,5-7, 0-15:4"),
    "dependency": (("-d", "--dependency"), "DEPS", "afterok:12,afterany:13 or afterok:12:13"),
    "priority": (("--priority",), "N", "priority within the queue (higher runs first)"),
    "queue": (("-p", "--queue"), "QUEUE", "the queue (an Agora role; default: default)"),
    "user": (
        ("--user",),
        "USER",
        "the Unix user the job runs as (default: you; only root may name another)",
    ),
    "time": (
        ("-t", "--time"),
        "TIME",
        "time limit: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], 90s, 1.5h, 1d",
    ),
    "retries": (("--retries",), "N", "extra attempts after a failure (default 0)"),
    "env": (("--env",), "KEY=VALUE", "an environment variable of the tasks (repeatable)"),
    "chdir": (("-D", "--chdir"), "DIR", "the tasks' working directory (an absolute path)"),
    "constraint": (("-C", "--constraint"), "ATTR=V", "agent attributes: zone=west,rack!=r1"),
    "ntasks": (("-n", "--ntasks"), "N", "a gang job of N tasks started together"),
    "ntasks_per_node": (("--ntasks-per-node",), "N", "at most N of the gang's tasks per agent"),
}
_REPEATABLE: Final = frozenset({"env", "constraint"})


def add_submit_options(parser: argparse.ArgumentParser) -> None:
    """The submit options, all kept as text (None when not given) for :func:`build_spec`."""
    for dest, (flags, metavar, text) in SUBMIT_OPTIONS.items():
        action = "append" if dest in _REPEATABLE else "store"
        parser.add_argument(*flags, dest=dest, metavar=metavar, help=text, action=action)


class _DirectiveParser(argparse.ArgumentParser):
    """The submit options for one ``#AGORA`` line: errors raise instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise SpecError(message)


def _directive_parser() -> _DirectiveParser:
    parser = _DirectiveParser(prog="#AGORA", add_help=False, allow_abbrev=False)
    add_submit_options(parser)
    return parser


# ------------------------------------------------------------------ values

_NUMBER: Final = r"(\d+(?:\.\d*)?|\.\d+)"
_ARRAY_PART: Final = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_SUFFIX_TIME: Final = re.compile(_NUMBER + r"\s*(ms|s|m|h|d)", re.IGNORECASE)
_SLURM_TIME: Final = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_MEMORY: Final = re.compile(_NUMBER + r"\s*(?:([KMGT])(?:I?B)?)?", re.IGNORECASE)
_TIME_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MEMORY_UNITS: Final = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def parse_array(text: str) -> ArraySpec:
    """Slurm's ``--array``: ``0-999%50``, ``1,3,5-7``, ``0-15:4``, ``7``."""
    body, percent, limit = text.strip().partition("%")
    if not body:
        raise SpecError(f"bad array {text!r}: no indices")
    max_running = 0
    if percent:
        if not limit.isdigit() or int(limit) < 1:
            raise SpecError(f"bad array {text!r}: the % limit must be a whole number of 1 or more")
        max_running = int(limit)
    ranges: list[tuple[int, int, int]] = []
    total = 0
    for part in body.split(","):
        part = part.strip()
        match = _ARRAY_PART.fullmatch(part)
        if match is None:
            why = "indices are 0 or more" if part.startswith("-") else f"cannot read {part!r}"
            raise SpecError(f"bad array {text!r}: {why} (expected e.g. 0-99, 1,3,5-7, 0-15:4)")
        start = int(match[1])
        stop = int(match[2]) if match[2] is not None else start
        step = int(match[3]) if match[3] is not None else 1
        if stop < start:
            raise SpecError(f"bad array {text!r}: the range {part} runs backwards")
        if step < 1:
            raise SpecError(f"bad array {text!r}: the step of {part} must be 1 or more")
        total += (stop - start) // step + 1
        if total > MAX_ARRAY_TASKS or stop > 10 * MAX_ARRAY_TASKS:
            raise SpecError(f"bad array {text!r}: an array has at most {MAX_ARRAY_TASKS} tasks")
        ranges.append((start, stop, step))
    return ArraySpec(tuple(ranges), max_running)


def parse_dependencies(text: str) -> tuple[Dependency, ...]:
    """``afterok:12,afterany:13``; ``afterok:12:13`` is two afterok dependencies."""
    deps: list[Dependency] = []
    for item in text.split(","):
        kind_text, *jobs = item.strip().split(":")
        try:
            kind = DepKind(kind_text.strip().lower())
        except ValueError:
            raise SpecError(
                f"bad dependency {item.strip()!r}: the kind must be afterok, afterany or afternotok"
            ) from None
        if not jobs or not all(j.strip().isdigit() for j in jobs):
            raise SpecError(f"bad dependency {item.strip()!r}: expected KIND:JOB_ID[:JOB_ID...]")
        deps.extend(Dependency(kind, int(j)) for j in jobs)
    return tuple(dict.fromkeys(deps))


def parse_duration(text: str) -> float:
    """Seconds of a time limit: Slurm's ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``, or a number with a unit: ``500ms``, ``90s``, ``2m``, ``1.5h``, ``1d``."""
    clean = text.strip()
    seconds: float | None = None
    suffix = _SUFFIX_TIME.fullmatch(clean)
    if suffix is not None:
        seconds = float(suffix[1]) * _TIME_UNITS[suffix[2].lower()]
    elif re.fullmatch(_NUMBER, clean):
        seconds = float(clean) * 60.0  # Slurm: a bare number is minutes
    else:
        seconds = _slurm_time(clean)
    if seconds is None:
        raise SpecError(
            f"bad time {text!r}: expected MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or 90s, 2m, 1.5h, 1d"
        )
    if seconds <= 0:
        raise SpecError(f"bad time {text!r}: it must be more than 0")
    return seconds


def _slurm_time(text: str) -> float | None:
    match = _SLURM_TIME.fullmatch(text)
    if match is None:
        return None
    days, first, second, third = match.groups()
    values = [int(v) for v in (first, second, third) if v is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*values, 0, 0][:3]
        return int(days) * 86400.0 + hours * 3600.0 + minutes * 60.0 + seconds
    if len(values) == 2:  # MM:SS
        return values[0] * 60.0 + values[1]
    if len(values) == 3:  # HH:MM:SS
        return values[0] * 3600.0 + values[1] * 60.0 + values[2]
    return None


def parse_memory(text: str) -> float:
    """MiB of ``512`` (MiB), ``512M``, ``4G``, ``1T``, ``100K`` (also ``4GB``, ``4GiB``)."""
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        raise SpecError(f"bad size {text!r}: expected e.g. 512 (MiB), 512M, 4G, 1T")
    return float(match[1]) * _MEMORY_UNITS[(match[2] or "").upper()]


def parse_when(text: str, now: float) -> float:
    """Unix seconds of a point in time: unix seconds (``1767225600``), a local ISO date or time
    (``2026-12-03``, ``2026-12-03T10:00``), or an age before ``now`` (``2h``, ``30m``, ``1d``)."""
    clean = text.strip()
    if re.fullmatch(_NUMBER, clean):
        return float(clean)
    try:
        when = dt.datetime.fromisoformat(clean)
    except ValueError:
        pass
    else:
        return when.timestamp()
    if _SUFFIX_TIME.fullmatch(clean) is None:
        raise SpecError(
            f"bad time {text!r}: expected unix seconds, a date (2026-12-03[T10:00]) or an age "
            "(2h, 30m, 1d)"
        )
    return now - parse_duration(clean)


# ------------------------------------------------------------------ scripts


def read_directives(script_text: str, source: str = "") -> list[tuple[int, list[str]]]:
    """(line number, words) of each ``#AGORA`` line of the script's header: after an optional
    ``#!`` line, among the leading comment and blank lines, as sbatch reads ``#SBATCH``.
    ``source`` (the file's name) prefixes errors."""
    found: list[tuple[int, list[str]]] = []
    for number, line in enumerate(script_text.splitlines(), start=1):
        clean = line.strip()
        if number == 1 and clean.startswith("#!"):
            continue
        if clean and not clean.startswith("#"):
            break
        if not clean.startswith(DIRECTIVE):
            continue
        rest = clean[len(DIRECTIVE) :]
        if rest and not rest[0].isspace():
            continue  # "#AGORAX": a comment
        where = f"{source}:{number}" if source else f"line {number}"
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if not words:
            raise SpecError(f"{where}: {DIRECTIVE} without options")
        found.append((number, words))
    return found


def build_spec(
    options: argparse.Namespace | Mapping[str, Any],
    *,
    command_words: Sequence[str] = (),
    script_path: str | None = None,
    script_text: str | None = None,
    script_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> JobSpec:
    """The job of a submission: ``options`` (from :func:`add_submit_options`, as text), over the
    ``#AGORA`` directives of ``script_text``; the command is ``shlex.join(command_words)`` (run by
    ``/bin/sh -c``: for shell syntax, submit ``sh -c '...'``), or else the script."""
    given = vars(options) if isinstance(options, argparse.Namespace) else dict(options)
    values: dict[str, Any] = {}
    source = os.path.basename(script_path) if script_path else "script"
    if script_text is not None:
        parser = _directive_parser()
        for number, words in read_directives(script_text, source):
            where = f"{source}:{number}"
            try:
                parsed, extra = parser.parse_known_args(words)
                if extra:
                    what = "option" if extra[0].startswith("-") else "argument"
                    raise SpecError(f"unknown {what} {extra[0]}")
                _merge(values, _convert(vars(parsed)))
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
    _merge(values, _convert({k: v for k, v in given.items() if k in SUBMIT_OPTIONS}))
    if script_text is not None:
        default_name = source
        body: dict[str, Any] = {"script": script_text, "script_args": tuple(script_args)}
    else:
        if not command_words:
            raise SpecError("nothing to run: give a command or a job script")
        default_name = os.path.basename(command_words[0]) or command_words[0]
        body = {"command": shlex.join(command_words)}
    if "user" not in values:
        values["user"] = _login()
    values.setdefault("name", default_name[:128])
    return JobSpec(**body, **values)


def _login() -> str:
    """This process's Unix user (not $USER: the service checks the caller's uid)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if key == "environment" and key in into:
            into[key] = {**into[key], **value}
        else:
            into[key] = value


def _convert(raw: Mapping[str, Any]) -> dict[str, Any]:
    """JobSpec fields of the options given (not None) in ``raw``, converted from text."""
    out: dict[str, Any] = {}
    for dest, text in raw.items():
        if text is None:
            continue
        flag = SUBMIT_OPTIONS[dest][0][-1]
        if dest in ("name", "queue", "user"):
            out[dest] = text
        elif dest == "cpus":
            out["cpus"] = _number(flag, text, float)
        elif dest in ("gpus", "priority", "retries", "ntasks", "ntasks_per_node"):
            out[dest] = _number(flag, text, int)
        elif dest in ("mem", "disk"):
            out[dest] = parse_memory(text)
        elif dest == "array":
            out["array"] = parse_array(text)
        elif dest == "dependency":
            out["dependencies"] = parse_dependencies(text)
        elif dest == "time":
            out["time_limit"] = parse_duration(text)
        elif dest == "env":
            out["environment"] = dict(_env_item(item) for item in text)
        elif dest == "chdir":
            if not text.startswith("/"):
                raise SpecError(f"--chdir needs an absolute path, not {text!r}")
            out["workdir"] = text
        elif dest == "constraint":
            out["constraints"] = _constraints(text)
    return out


def _number(flag: str, text: str, kind: type[int] | type[float]) -> Any:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SpecError(f"{flag} needs {what}, not {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SpecError(f"{flag} needs a finite number, not {text!r}")
    return value


def _env_item(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SpecError(f"bad --env {item!r}: expected KEY=VALUE")
    return key, value


def _constraints(items: Sequence[str]) -> tuple[Constraint, ...]:
    out: list[Constraint] = []
    for item in items:
        out.extend(parse_constraint(part) for part in item.split(",") if part.strip())
    return tuple(out)
