"""Mesos ``{"value": "..."}`` id wrappers <-> Agora's string ids."""

from __future__ import annotations

from typing import TypeVar

from agora.sdk.ids import id_problem
from agora.sdk.mesos._json import fail, obj, required, string

__all__ = ["id_from_mesos", "id_to_mesos"]

_I = TypeVar("_I", bound=str)


def id_to_mesos(value: str) -> dict[str, str]:
    """An Agora id as Mesos ``{"value": ...}``."""
    return {"value": str(value)}


def id_from_mesos(value: object, cls: type[_I], field: str) -> _I:
    """A Mesos ``{"value": ...}`` as the Agora id type ``cls`` (``FrameworkID``, ``TaskID``...).

    The value must be a non-empty string of at most 255 characters with no '/', whitespace
    or control characters (Agents use ids as directory names)."""
    o = obj(value, field, ("value",))
    text = string(required(o, "value", field), f"{field}.value", max_len=255, empty=False)
    problem = id_problem(text)
    if problem is not None:
        fail(f"{field}.value", problem)
    return cls(text)
