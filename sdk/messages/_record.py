"""Base classes of wire records and the bound markers their annotations may carry.

Records are frozen msgspec Structs with keyword-only fields, deriving from ``Record``;
the ones that travel on their own derive from ``Message`` and set ``NAME`` (the wire name) and
``VERSION``. Bounds ride in ``typing.Annotated`` metadata::

    hostname: Annotated[str, MaxLen(255)]
    tasks: Annotated[tuple[TaskInfo, ...], MaxItems(100)]
    refuse_seconds: Annotated[float, Range(0, 365 * DAY)]

Unannotated fields get the defaults below. The codec enforces the bounds on encode and decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, ClassVar, Final

import msgspec

__all__ = [
    "DAY",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ID_LEN",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_MAP_ITEMS",
    "DEFAULT_MAX_STR_LEN",
    "MaxItems",
    "MaxLen",
    "Message",
    "Range",
    "Record",
    "Seconds",
    "ShortStr",
    "Timestamp",
    "Uuid",
    "build_registry",
]

DEFAULT_MAX_ID_LEN: Final = 255  # characters, for the agora.sdk.ids types
DEFAULT_MAX_STR_LEN: Final = 64 * 1024  # characters, for any other str
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
DEFAULT_MAX_ITEMS: Final = 10_000  # tuple items
DEFAULT_MAX_MAP_ITEMS: Final = 1024  # Mapping[str, str] entries
DAY: Final = 86_400.0  # seconds


class MaxLen(msgspec.Struct, frozen=True):
    """Most characters of a str, or bytes of a bytes value."""

    n: int


class MaxItems(msgspec.Struct, frozen=True):
    """Most items of a tuple, or entries of a mapping."""

    n: int


class Range(msgspec.Struct, frozen=True):
    """Inclusive bounds of an int or float (``lo_open``: the lower bound itself is excluded)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def admits(self, value: float) -> bool:
        lo, hi = self.lo, self.hi
        if lo is not None and (value <= lo if self.lo_open else value < lo):
            return False
        return hi is None or value <= hi

    def describe(self) -> str:
        lo = "-inf" if self.lo is None else _num(self.lo)
        hi = "inf" if self.hi is None else _num(self.hi)
        return f"{'(' if self.lo_open else '['}{lo}, {hi}]"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every wire record (nested or not): a frozen msgspec Struct with keyword-only
    fields. Subclasses repeat ``frozen=True, kw_only=True`` (msgspec applies kw_only per class)."""


class Message(Record, frozen=True, kw_only=True):
    """Base of every record that travels as a frame of its own."""

    NAME: ClassVar[str]
    VERSION: ClassVar[int] = 1


def build_registry(classes: Iterable[type[Message]]) -> Mapping[str, type[Message]]:
    """Map each class's NAME to the class; a NAME used twice is a programming error."""
    registry: dict[str, type[Message]] = {}
    for cls in classes:
        name = cls.NAME
        if name in registry:
            raise TypeError(
                f"message name {name!r} is used by both {registry[name].__qualname__} "
                f"and {cls.__qualname__}"
            )
        registry[name] = cls
    return registry


# Bounded aliases shared by the message modules.
ShortStr = Annotated[str, MaxLen(255)]  # host names, roles, users, principals, addresses
Uuid = Annotated[bytes, MaxLen(64)]  # status-update uuids (16 bytes in practice)
Seconds = Annotated[float, Range(0, 365 * DAY)]  # durations: up to a year
Timestamp = Annotated[float, Range(0)]  # seconds since the epoch
