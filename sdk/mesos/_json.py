"""Checked reads of decoded JSON: each failure is a ProtocolError naming the field."""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Collection, Mapping
from typing import NoReturn

from agora.sdk.errors import ProtocolError

#: Most items any one list in a translated message may hold.
MAX_LIST = 1024
#: Longest string accepted where Agora has no tighter bound.
MAX_STR = 1 << 20


def fail(field: str, why: str) -> NoReturn:
    raise ProtocolError(f"mesos: {field} {why}", field=field)


def obj(value: object, field: str, allowed: Collection[str]) -> Mapping[str, object]:
    """``value`` as a JSON object whose keys are all in ``allowed``."""
    if not isinstance(value, Mapping):
        fail(field, f"must be an object, not {type(value).__name__}")
    for key in value:
        if key not in allowed:
            fail(f"{field}.{key}", "is not supported by Agora")
    return value


def string(value: object, field: str, *, max_len: int = MAX_STR, empty: bool = True) -> str:
    if not isinstance(value, str):
        fail(field, f"must be a string, not {type(value).__name__}")
    if len(value) > max_len:
        fail(field, f"is longer than {max_len} characters")
    if not empty and not value:
        fail(field, "must not be empty")
    return value


def boolean(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        fail(field, f"must be a boolean, not {type(value).__name__}")
    return value


def number(value: object, field: str, *, lo: float = 0.0, hi: float = 1e15) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(field, f"must be a number, not {type(value).__name__}")
    f = float(value)
    if not math.isfinite(f) or f < lo or f > hi:
        fail(field, f"must be a finite number in [{lo:g}, {hi:g}], not {value!r}")
    return f


def integer(value: object, field: str, *, lo: int, hi: int) -> int:
    # Mesos' JSON writes 64-bit integers as strings sometimes; accept decimal strings too.
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 20:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        fail(field, f"must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        fail(field, f"must be in [{lo}, {hi}], not {value}")
    return value


def array(value: object, field: str, *, max_items: int = MAX_LIST) -> list[object]:
    if not isinstance(value, list):
        fail(field, f"must be an array, not {type(value).__name__}")
    if len(value) > max_items:
        fail(field, f"has more than {max_items} items")
    return value


def required(o: Mapping[str, object], key: str, field: str) -> object:
    if key not in o or o[key] is None:
        fail(f"{field}.{key}", "is required")
    return o[key]


def b64decode(value: object, field: str, *, max_len: int = MAX_STR) -> bytes:
    text = string(value, field, max_len=max_len * 4 // 3 + 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        fail(field, "is not valid base64")


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def duration_from_mesos(value: object, field: str, *, hi: float) -> float:
    """A Mesos DurationInfo/TimeInfo ``{"nanoseconds": n}`` as seconds."""
    o = obj(value, field, ("nanoseconds",))
    ns = integer(required(o, "nanoseconds", field), f"{field}.nanoseconds", lo=0, hi=2**63 - 1)
    seconds = ns / 1e9
    if seconds > hi:
        fail(f"{field}.nanoseconds", f"exceeds {hi:g} seconds")
    return seconds


def duration_to_mesos(seconds: float) -> dict[str, object]:
    return {"nanoseconds": round(seconds * 1e9)}


def labels_from_mesos(value: object, field: str) -> dict[str, str]:
    o = obj(value, field, ("labels",))
    out: dict[str, str] = {}
    for i, item in enumerate(array(o.get("labels", []), f"{field}.labels")):
        f = f"{field}.labels[{i}]"
        lab = obj(item, f, ("key", "value"))
        key = string(required(lab, "key", f), f"{f}.key", max_len=255, empty=False)
        if key in out:
            fail(f"{f}.key", f"repeats {key!r}")
        out[key] = string(lab.get("value", ""), f"{f}.value")
    return out


def labels_to_mesos(labels: Mapping[str, str]) -> dict[str, object]:
    return {"labels": [{"key": k, "value": v} for k, v in labels.items()]}
