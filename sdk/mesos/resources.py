"""Mesos ``Resource`` lists <-> Agora :class:`~agora.sdk.resources.Resources`.

A Mesos resource is ``{name, type: SCALAR|RANGES|SET, scalar: {value}, ranges: {range: [{begin,
end}]}, set: {item: [...]}, role, reservations: [{type, role, principal}]}``. Agora keeps one
role per entry and no reservation stack, so at most one reservation is accepted (its
``principal`` and ``type`` are not kept); ``allocation_info`` is accepted and ignored (the
offer carries the role). Disk info, shared, revocable and provider ids are refused. Entries
with the same name and role are summed (scalars) or unioned (ranges, sets), as in Mesos.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agora.sdk.mesos._json import array, fail, integer, number, obj, required, string
from agora.sdk.resources import (
    MAX_ENTRIES,
    MAX_ITEM_LENGTH,
    MAX_ITEMS_PER_NAME,
    MAX_NAME_LENGTH,
    MAX_PORT,
    MAX_RANGES_PER_NAME,
    MAX_ROLE_LENGTH,
    MAX_SCALAR,
    UNRESERVED,
    ResourceError,
    Resources,
)

__all__ = ["resources_from_mesos", "resources_to_mesos"]

_RESOURCE_KEYS = (
    "name",
    "type",
    "scalar",
    "ranges",
    "set",
    "role",
    "reservations",
    "allocation_info",
)
_RESERVATION_TYPES = ("STATIC", "DYNAMIC")


def resources_to_mesos(
    resources: Resources, *, allocation_role: str | None = None
) -> list[dict[str, object]]:
    """Agora resources as a Mesos ``Resource`` list, sorted by name then role.

    Reserved entries carry both the pre-refinement ``role`` and a one-element ``reservations``
    (type STATIC); ``allocation_role``, when given, is set as ``allocation_info.role``."""
    out: list[dict[str, object]] = []
    for key, value in resources.to_dict().items():
        name, role = _split_key(key)
        entry: dict[str, object] = {"name": name}
        if isinstance(value, list) and value and isinstance(value[0], list):
            entry["type"] = "RANGES"
            entry["ranges"] = {"range": [{"begin": lo, "end": hi} for lo, hi in value]}
        elif isinstance(value, list):
            entry["type"] = "SET"
            entry["set"] = {"item": list(value)}
        else:
            entry["type"] = "SCALAR"
            entry["scalar"] = {"value": value}
        entry["role"] = role
        if role != UNRESERVED:
            entry["reservations"] = [{"type": "STATIC", "role": role}]
        if allocation_role is not None:
            entry["allocation_info"] = {"role": allocation_role}
        out.append(entry)
    return out


def resources_from_mesos(value: object, field: str = "resources") -> Resources:
    """A Mesos ``Resource`` list as Agora resources; refuses what Agora cannot hold."""
    items = array(value, field, max_items=MAX_ENTRIES)
    total = Resources()
    for i, item in enumerate(items):
        f = f"{field}[{i}]"
        one = _one_from_mesos(item, f)
        try:
            total = total + one
        except ResourceError as e:
            fail(f, str(e))
    return total


def _split_key(key: str) -> tuple[str, str]:
    if key.endswith(")") and "(" in key:
        name, _, role = key[:-1].partition("(")
        return name, role
    return key, UNRESERVED


def _one_from_mesos(item: object, f: str) -> Resources:
    o = obj(item, f, _RESOURCE_KEYS)
    name = string(required(o, "name", f), f"{f}.name", max_len=MAX_NAME_LENGTH, empty=False)
    if "(" in name or ")" in name:
        fail(f"{f}.name", "must not contain '(' or ')'")
    kind = string(required(o, "type", f), f"{f}.type", max_len=16)
    role = _role(o, f)
    amount: object
    if kind == "SCALAR":
        _only(o, f, "scalar")
        s = obj(required(o, "scalar", f), f"{f}.scalar", ("value",))
        amount = number(required(s, "value", f"{f}.scalar"), f"{f}.scalar.value", hi=MAX_SCALAR)
    elif kind == "RANGES":
        _only(o, f, "ranges")
        amount = list(_ranges(o.get("ranges", {}), f"{f}.ranges"))
    elif kind == "SET":
        _only(o, f, "set")
        amount = list(_set_items(o.get("set", {}), f"{f}.set"))
    else:
        fail(f"{f}.type", f"must be SCALAR, RANGES or SET, not {kind!r}")
    key = name if role == UNRESERVED else f"{name}({role})"
    try:
        return Resources.from_dict({key: amount})
    except ResourceError as e:
        fail(f, str(e))


def _only(o: Mapping[str, object], f: str, keep: str) -> None:
    for other in ("scalar", "ranges", "set"):
        if other != keep and other in o:
            fail(f"{f}.{other}", f"is set on a resource whose type needs {keep!r}")


def _role(o: Mapping[str, object], f: str) -> str:
    role: str | None = None
    if o.get("role") is not None:
        role = string(o["role"], f"{f}.role", max_len=MAX_ROLE_LENGTH, empty=False)
    res = o.get("reservations")
    if res is not None:
        reservations = array(res, f"{f}.reservations")
        if len(reservations) > 1:
            fail(f"{f}.reservations", "has more than one reservation (refinement is unsupported)")
        if reservations:
            rf = f"{f}.reservations[0]"
            r = obj(reservations[0], rf, ("type", "role", "principal"))
            rtype = string(r.get("type", "STATIC"), f"{rf}.type", max_len=16)
            if rtype not in _RESERVATION_TYPES:
                fail(f"{rf}.type", f"must be STATIC or DYNAMIC, not {rtype!r}")
            rrole = string(required(r, "role", rf), f"{rf}.role", max_len=MAX_ROLE_LENGTH)
            if "principal" in r:
                string(r["principal"], f"{rf}.principal", max_len=255)
            if role is not None and role != UNRESERVED and role != rrole:
                fail(f"{f}.role", f"{role!r} disagrees with reservations role {rrole!r}")
            role = rrole
    if "allocation_info" in o:
        a = obj(o["allocation_info"], f"{f}.allocation_info", ("role",))
        if "role" in a:
            string(a["role"], f"{f}.allocation_info.role", max_len=MAX_ROLE_LENGTH)
    return UNRESERVED if role is None else role


def _ranges(value: object, f: str) -> Iterable[list[int]]:
    o = obj(value, f, ("range",))
    for i, r in enumerate(array(o.get("range", []), f"{f}.range", max_items=MAX_RANGES_PER_NAME)):
        rf = f"{f}.range[{i}]"
        ro = obj(r, rf, ("begin", "end"))
        begin = integer(required(ro, "begin", rf), f"{rf}.begin", lo=0, hi=MAX_PORT)
        end = integer(required(ro, "end", rf), f"{rf}.end", lo=0, hi=MAX_PORT)
        if end < begin:
            fail(rf, f"ends ({end}) before it begins ({begin})")
        yield [begin, end]


def _set_items(value: object, f: str) -> Iterable[str]:
    o = obj(value, f, ("item",))
    for i, item in enumerate(array(o.get("item", []), f"{f}.item", max_items=MAX_ITEMS_PER_NAME)):
        yield string(item, f"{f}.item[{i}]", max_len=MAX_ITEM_LENGTH)
