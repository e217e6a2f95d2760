"""What :mod:`agora.sdk.resources` and its parser share: the error, the limits,
the kinds of resource, fixed-point thousandths and range normalisation.

Private: import the public names from :mod:`agora.sdk.resources`. This module
imports neither of them, so both can import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

UNRESERVED: Final = "*"

MAX_ENTRIES: Final = 1024
MAX_NAME_LENGTH: Final = 64
MAX_ROLE_LENGTH: Final = 64
MAX_ITEM_LENGTH: Final = 256
MAX_RANGES_PER_NAME: Final = 1024
MAX_ITEMS_PER_NAME: Final = 1024
MAX_SCALAR: Final = 10**12
MAX_PORT: Final = 2**32 - 1

# the kinds of resource, as stored in a value's table of custom kinds
SCALAR: Final = 0
RANGES: Final = 1
SET: Final = 2
KIND_NAMES: Final = ("scalar", "ranges", "set")
WELL_KNOWN: Final[dict[str, int]] = {
    "cpus": SCALAR,
    "mem": SCALAR,
    "disk": SCALAR,
    "gpus": SCALAR,
    "ports": RANGES,
}

_ROLE_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")

# (name, role), and normalized ranges: sorted, merged, inclusive
Key = tuple[str, str]
Ranges = tuple[tuple[int, int], ...]


class ResourceError(ValueError):
    """Bad resource text/dict or an impossible operation (subtracting what is not there)."""

    # where it has always been public (tracebacks, pickles); defined here to avoid a cycle
    __module__ = "agora.sdk.resources"

    position: int | None

    def __init__(self, message: str, position: int | None = None) -> None:
        if position is not None:
            message = f"{message} at position {position}"
        super().__init__(message)
        self.position = position


# --------------------------------------------------------------------------- thousandths


def decimal_to_milli(digits: str, scale: int) -> int:
    """int(digits) / 10**scale in thousandths, rounded half-even."""
    value = int(digits)
    shift = scale - 3
    if shift <= 0:
        up: int = 10**-shift
        return value * up
    down: int = 10**shift
    q, r = divmod(value, down)
    half = down // 2
    if r > half or (r == half and q & 1):
        q += 1
    return q


def float_to_milli(value: float) -> int:
    """A finite, non-negative float in thousandths, rounded half-even on its decimal repr."""
    if value == 0:
        return 0
    text = repr(value)
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    return decimal_to_milli(whole + frac, len(frac) - (int(exp) if exp else 0))


def milli_to_text(milli: int) -> str:
    whole, frac = divmod(milli, 1000)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


# --------------------------------------------------------------------------- the rest


def normalize_ranges(intervals: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def valid_role(role: str) -> bool:
    if role == UNRESERVED:
        return True
    return (
        len(role) <= MAX_ROLE_LENGTH
        and role not in (".", "..")
        and _ROLE_RE.fullmatch(role) is not None
    )


def custom_kinds(
    s: Mapping[Key, int], r: Mapping[Key, Ranges], t: Mapping[Key, frozenset[str]]
) -> dict[str, int]:
    """Kinds of the names that are not well known (empty in the common case)."""
    out: dict[str, int] = {}
    for kind, entries in ((SCALAR, s), (RANGES, r), (SET, t)):
        for name, _ in entries:
            if name not in WELL_KNOWN:
                out[name] = kind
    return out
