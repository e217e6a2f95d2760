"""Identifiers of the things Agora names, as distinct string types.

Each id is a ``str`` subclass so it costs nothing on the wire and in dicts,
yet a ``FrameworkID`` can never be passed where an ``AgentID`` is expected
without the type checker noticing.
"""

from __future__ import annotations

import secrets

__all__ = [
    "AgentID",
    "ExecutorID",
    "FrameworkID",
    "GangID",
    "OfferID",
    "TaskID",
    "id_problem",
    "new_kill_id",
]

_MAX_ID = 255


class _ID(str):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str.__repr__(self)})"


class FrameworkID(_ID):
    __slots__ = ()


class AgentID(_ID):
    __slots__ = ()


class OfferID(_ID):
    __slots__ = ()


class TaskID(_ID):
    __slots__ = ()


class ExecutorID(_ID):
    __slots__ = ()


class GangID(_ID):
    """Names one gang REQUEST of a framework (chosen by the framework)."""

    __slots__ = ()


def new_kill_id() -> str:
    """A short random id for one KILL, carried to the agent and the executor and logged at
    each hop as ``kill_id`` so that one kill can be followed through every log."""
    return secrets.token_hex(6)


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot name a task or executor (None if it can).

    Agents use these ids as directory names, so (as in Mesos) they must be non-empty, at most 255
    characters, free of '/', whitespace and control characters, and neither '.' nor '..'.
    """
    if not value:
        return "must not be empty"
    if len(value) > _MAX_ID:
        return f"is longer than {_MAX_ID} characters"
    if value in (".", ".."):
        return f"must not be {value!r}"
    for ch in value:
        if ch == "/" or ch.isspace() or not ch.isprintable():
            return f"must not contain {ch!r}"
    return None
