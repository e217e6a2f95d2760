"""Identifiers of the things Agora names, as distinct string types.

Each id is a ``str`` subclass so it costs nothing on the wire and in dicts,
yet a ``FrameworkID`` can never be passed where an ``AgentID`` is expected
without the type checker noticing.
"""

from __future__ import annotations

__all__ = [
    "AgentID",
    "ExecutorID",
    "FrameworkID",
    "GangID",
    "OfferID",
    "TaskID",
]


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
