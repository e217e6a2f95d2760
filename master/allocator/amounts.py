"""Scalar quantities as ``{name: thousandths}`` dicts, and the few Resources builders on top.

The allocator keeps per-client and per-agent scalar totals as plain int dicts (cheap to add
and compare); these helpers do that arithmetic and turn quantities back into Resources
when an offer has to be cut to size (quota) or carved out of an agent (gangs).
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.sdk.resources import UNRESERVED, Resources

__all__ = [
    "EMPTY",
    "add_into",
    "carve",
    "covers",
    "from_milli",
    "is_scalar_only",
    "minus",
    "scaled",
    "shrink",
    "subtract_into",
]

EMPTY = Resources()

Milli = Mapping[str, int]


def add_into(target: dict[str, int], amounts: Milli) -> None:
    """``target += amounts`` in place."""
    get = target.get
    for name, value in amounts.items():
        target[name] = get(name, 0) + value


def subtract_into(target: dict[str, int], amounts: Milli) -> None:
    """``target -= amounts`` in place; zero entries are dropped. The caller ensures ``>= 0``."""
    for name, value in amounts.items():
        left = target.get(name, 0) - value
        if left:
            target[name] = left
        else:
            target.pop(name, None)


def minus(a: Milli, b: Milli) -> dict[str, int]:
    """``max(a - b, 0)`` per name."""
    out: dict[str, int] = {}
    for name, value in a.items():
        left = value - b.get(name, 0)
        if left > 0:
            out[name] = left
    return out


def scaled(amounts: Milli, n: int) -> dict[str, int]:
    return {name: value * n for name, value in amounts.items()}


def covers(have: Milli, need: Milli) -> bool:
    """Whether ``have >= need`` for every name of ``need``."""
    get = have.get
    return all(get(name, 0) >= value for name, value in need.items())


def is_scalar_only(res: Resources) -> bool:
    return res.names() == frozenset(res.scalar_totals_milli())


def from_milli(role: str, amounts: Milli) -> Resources:
    """Scalars from thousandths, all reserved to ``role`` (``"*"``: unreserved)."""
    out: dict[str, object] = {}
    for name, milli in amounts.items():
        if milli > 0:
            key = name if role == UNRESERVED else f"{name}({role})"
            whole, frac = divmod(milli, 1000)
            out[key] = whole if frac == 0 else milli / 1000
    return Resources.from_dict(out) if out else EMPTY


def carve(pool: Resources, role: str, need: Milli) -> Resources:
    """Exactly ``need`` of scalars out of ``pool``: reserved to ``role`` first, then unreserved.

    The caller ensures ``pool.allocatable_to(role)`` covers ``need``.
    """
    if role == UNRESERVED:
        return from_milli(UNRESERVED, need)
    reserved = pool.reserved(role)
    from_reserved: dict[str, int] = {}
    from_unreserved: dict[str, int] = {}
    for name, value in need.items():
        mine = min(value, reserved.scalar_milli(name)) if reserved else 0
        if mine:
            from_reserved[name] = mine
        if value > mine:
            from_unreserved[name] = value - mine
    return from_milli(role, from_reserved) + from_milli(UNRESERVED, from_unreserved)


def shrink(res: Resources, caps: Milli, *, unreserved_only: bool = False) -> Resources:
    """``res`` with each scalar named in ``caps`` cut down to at most its cap.

    Cuts take unreserved entries first, then reserved ones (by role name), so what only this
    role can use stays in the offer. With ``unreserved_only`` the caps bound just the
    unreserved amounts and reserved entries are never cut.
    """
    totals = res.scalar_totals_milli()
    if all(totals.get(name, 0) <= cap for name, cap in caps.items()):
        return res  # nothing to cut (unreserved amounts are within the totals)
    cut: Resources = EMPTY
    unreserved = res.unreserved()
    for name, cap in caps.items():
        have = unreserved.scalar_milli(name) if unreserved_only else res.scalar_milli(name)
        excess = have - max(cap, 0)
        if excess <= 0:
            continue
        take = min(excess, unreserved.scalar_milli(name))
        if take:
            cut = cut + from_milli(UNRESERVED, {name: take})
            excess -= take
        if excess and not unreserved_only:
            for role in sorted(res.roles() - {UNRESERVED}):
                amount = res.filter_role(role).scalar_milli(name)
                take = min(excess, amount)
                if take:
                    cut = cut + from_milli(role, {name: take})
                    excess -= take
                if not excess:
                    break
    return res - cut if cut else res
