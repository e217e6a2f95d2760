"""Resources: what agents have, what offers carry and what tasks use.

A :class:`Resources` value maps ``(name, role)`` entries to an amount of one of
three kinds:

* **scalars** (``cpus:4``, ``mem:4096.5``) — stored as integer thousandths, so
  arithmetic is exact (``0.1 + 0.2 == 0.3``). Input is rounded half-even to three
  decimals. Amounts are never negative; entries that reach zero are dropped.
* **ranges** (``ports:[31000-32000,32005-32010]``) — inclusive integer
  intervals in ``[0, 2**32)``, always sorted and merged (adjacent ones too).
* **sets** (``zones:{a,b}``) — sets of strings.

``cpus``, ``mem``, ``disk`` and ``gpus`` are always scalars and ``ports`` is
always ranges; any other name takes its kind from its syntax, and one value may
not use a name with two kinds.

A role is ``"*"`` (unreserved, the default) or a name made of
``[A-Za-z0-9_.-]`` (not ``.`` or ``..``): ``cpus(batch):2`` is reserved to
``batch``.

Text form::

    cpus:4;mem:4096;ports:[31000-32000,32005-32010];zones:{a,b};cpus(batch):2

Whitespace around tokens is allowed, empty entries (``;;``) are skipped and empty
text is the empty value. The same ``name(role)`` given twice is **summed**
(scalars) or **unioned** (ranges, sets). :meth:`Resources.to_text` emits the
canonical form, sorted by name then role, and ``parse(to_text(r)) == r``.

Dict form (for messages)::

    {"cpus": 4, "mem": 4096.5, "ports": [[31000, 32000]], "zones": ["a", "b"],
     "cpus(batch)": 2}

Input is bounded: at most 1024 entries, names and roles of at most 64 characters,
set items of at most 256 characters, at most 1024 ranges and 1024 set items per
name, and scalar amounts of at most 10**12 (so every amount survives the float in
:meth:`Resources.to_dict` exactly). Results of arithmetic are not bounded.

Values are immutable and hashable. The scalar path is plain ``dict[str, int]``
work so the allocator can do tens of thousands of operations per cycle.

The three input forms are parsed and checked by :mod:`agora.sdk._resources_parse`;
what both modules share lives in :mod:`agora.sdk._resources_base`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, NoReturn

from agora.sdk._resources_base import (
    KIND_NAMES,
    UNRESERVED,
    Key,
    Ranges,
    ResourceError,
    custom_kinds,
    milli_to_text,
    normalize_ranges,
    valid_role,
)

# the limits, public here as they always were
from agora.sdk._resources_base import MAX_ENTRIES as MAX_ENTRIES
from agora.sdk._resources_base import MAX_ITEM_LENGTH as MAX_ITEM_LENGTH
from agora.sdk._resources_base import MAX_ITEMS_PER_NAME as MAX_ITEMS_PER_NAME
from agora.sdk._resources_base import MAX_NAME_LENGTH as MAX_NAME_LENGTH
from agora.sdk._resources_base import MAX_PORT as MAX_PORT
from agora.sdk._resources_base import MAX_RANGES_PER_NAME as MAX_RANGES_PER_NAME
from agora.sdk._resources_base import MAX_ROLE_LENGTH as MAX_ROLE_LENGTH
from agora.sdk._resources_base import MAX_SCALAR as MAX_SCALAR
from agora.sdk._resources_parse import parse_dict, parse_scalars, parse_text

__all__ = ["UNRESERVED", "ResourceError", "Resources"]


# --------------------------------------------------------------------------- range arithmetic


def _ranges_contain(a: Ranges, b: Ranges) -> bool:
    """Whether normalized ``a`` covers every value of normalized ``b``."""
    i = 0
    n = len(a)
    for lo, hi in b:
        while i < n and a[i][1] < lo:
            i += 1
        if i == n or a[i][0] > lo or a[i][1] < hi:
            return False
    return True


def _ranges_subtract(a: Ranges, b: Ranges) -> Ranges:
    """Normalized ``a`` minus normalized ``b``."""
    out: list[tuple[int, int]] = []
    j = 0
    nb = len(b)
    for lo, hi in a:
        cur = lo
        while j < nb and b[j][1] < cur:
            j += 1
        k = j
        while k < nb and b[k][0] <= hi:
            blo, bhi = b[k]
            if blo > cur:
                out.append((cur, blo - 1))
            if bhi + 1 > cur:
                cur = bhi + 1
            if cur > hi:
                break
            k += 1
        if cur <= hi:
            out.append((cur, hi))
    return tuple(out)


# --------------------------------------------------------------------------- the value


def _make(
    s: dict[Key, int],
    r: dict[Key, Ranges],
    t: dict[Key, frozenset[str]],
    c: dict[str, int],
) -> Resources:
    obj = _new(Resources)
    _set_s(obj, s)
    _set_r(obj, r)
    _set_t(obj, t)
    _set_c(obj, c)
    return obj


def _restore(s: dict[Key, int], r: dict[Key, Ranges], t: dict[Key, frozenset[str]]) -> Resources:
    return _make(dict(s), dict(r), dict(t), custom_kinds(s, r, t))


def _conflict(name: str, a: int, b: int) -> NoReturn:
    raise ResourceError(f"resource {name!r} is both {KIND_NAMES[a]} and {KIND_NAMES[b]}")


class Resources:
    """An immutable, hashable bag of scalar, range and set resources, per role."""

    __slots__ = ("_c", "_hash", "_json", "_milli", "_r", "_s", "_t")

    # scalars in thousandths / normalized ranges / sets, keyed by (name, role); never empty
    _s: dict[Key, int]
    _r: dict[Key, Ranges]
    _t: dict[Key, frozenset[str]]
    # kinds of names that are not well known: lets + detect a kind clash cheaply
    _c: dict[str, int]
    _hash: int
    _json: dict[str, object]
    _milli: dict[str, int]

    def __init__(self) -> None:
        """The empty value; use :meth:`parse`, :meth:`from_dict` or :meth:`scalars`."""
        _set(self, "_s", {})
        _set(self, "_r", {})
        _set(self, "_t", {})
        _set(self, "_c", {})

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Resources is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Resources is immutable")

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore, (self._s, self._r, self._t))

    def __copy__(self) -> Resources:
        return self

    def __deepcopy__(self, memo: object) -> Resources:
        return self

    # ------------------------------------------------------------------ construction

    @classmethod
    def parse(cls, text: str) -> Resources:
        """Parse the text form; raises :class:`ResourceError` naming the bad token."""
        s, r, t, c = parse_text(text)
        return _make(s, r, t, c)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Resources:
        """Build from the dict form; raises :class:`ResourceError` naming the bad key."""
        s, r, t, c = parse_dict(d)
        return _make(s, r, t, c)

    @classmethod
    def scalars(cls, role: str = UNRESERVED, **amounts: float) -> Resources:
        """``Resources.scalars(cpus=1, mem=128)``; ``role`` reserves them all."""
        s, r, t, c = parse_scalars(role, amounts)
        return _make(s, r, t, c)

    # ------------------------------------------------------------------ output

    def to_text(self) -> str:
        """Canonical text, sorted by name then role; ``parse(to_text(r)) == r``."""
        parts: list[tuple[Key, str]] = []
        for key, milli in self._s.items():
            parts.append((key, milli_to_text(milli)))
        for key, ranges in self._r.items():
            parts.append((key, "[" + ",".join(f"{lo}-{hi}" for lo, hi in ranges) + "]"))
        for key, items in self._t.items():
            parts.append((key, "{" + ",".join(sorted(items)) + "}"))
        parts.sort()
        return ";".join(
            f"{name}:{value}" if role == UNRESERVED else f"{name}({role}):{value}"
            for (name, role), value in parts
        )

    __str__ = to_text

    def to_dict(self) -> dict[str, object]:
        """Dict form; scalars are ints when whole, else floats. ``from_dict(to_dict(r)) == r``."""
        out: dict[str, object] = {}
        for (name, role), milli in sorted(self._s.items()):
            whole, frac = divmod(milli, 1000)
            out[_key_text(name, role)] = whole if frac == 0 else milli / 1000
        for (name, role), ranges in sorted(self._r.items()):
            out[_key_text(name, role)] = [[lo, hi] for lo, hi in ranges]
        for (name, role), items in sorted(self._t.items()):
            out[_key_text(name, role)] = sorted(items)
        return out

    def json_view(self) -> Mapping[str, object]:
        """:meth:`to_dict`, made once per value and shared: for encoders that only read it
        (the operator API's documents repeat the same values thousands of times)."""
        try:
            return self._json
        except AttributeError:
            view = self.to_dict()
            _set(self, "_json", view)
            return view

    def __repr__(self) -> str:
        return f"Resources.parse({self.to_text()!r})"

    # ------------------------------------------------------------------ arithmetic

    def __add__(self, other: Resources) -> Resources:
        if not isinstance(other, Resources):
            return NotImplemented
        if not other._s and not other._r and not other._t:
            return self
        if not self._s and not self._r and not self._t:
            return other
        c = self._c
        oc = other._c
        if oc and c is not oc:
            if c:
                for name, kind in oc.items():
                    mine = c.get(name)
                    if mine is not None and mine != kind:
                        _conflict(name, mine, kind)
                c = {**c, **oc}
            else:
                c = oc
        s = self._s.copy()
        get = s.get
        for key, milli in other._s.items():
            s[key] = get(key, 0) + milli
        r = self._r
        if other._r:
            r = r.copy()
            for key, ranges in other._r.items():
                mine_r = r.get(key)
                r[key] = normalize_ranges(mine_r + ranges) if mine_r else ranges
        t = self._t
        if other._t:
            t = t.copy()
            for key, items in other._t.items():
                mine_t = t.get(key)
                t[key] = mine_t | items if mine_t else items
        return _make(s, r, t, c)

    def __sub__(self, other: Resources) -> Resources:
        """``self`` minus ``other``; :class:`ResourceError` unless ``self.contains(other)``."""
        if not isinstance(other, Resources):
            return NotImplemented
        s = self._s.copy()
        for key, milli in other._s.items():
            left = s.get(key, 0) - milli
            if left > 0:
                s[key] = left
            elif left == 0:
                del s[key]
            else:
                raise ResourceError(f"cannot subtract {other} from {self}: not contained")
        r = self._r
        if other._r:
            r = r.copy()
            for key, ranges in other._r.items():
                mine_r = r.get(key)
                if mine_r is None or not _ranges_contain(mine_r, ranges):
                    raise ResourceError(f"cannot subtract {other} from {self}: not contained")
                rest = _ranges_subtract(mine_r, ranges)
                if rest:
                    r[key] = rest
                else:
                    del r[key]
        t = self._t
        if other._t:
            t = t.copy()
            for key, items in other._t.items():
                mine_t = t.get(key)
                if mine_t is None or not items <= mine_t:
                    raise ResourceError(f"cannot subtract {other} from {self}: not contained")
                rest_t = mine_t - items
                if rest_t:
                    t[key] = rest_t
                else:
                    del t[key]
        c = self._c
        if c:
            c = custom_kinds(s, r, t)
        return _make(s, r, t, c)

    def fits(self, shape: Resources) -> bool:
        """True when ``shape`` (same names and roles) can be carved out of these resources."""
        return self.contains(shape)

    def contains(self, other: Resources) -> bool:
        """Per (name, role): scalar ``>=``, ranges superset, set superset."""
        get = self._s.get
        for key, milli in other._s.items():
            if get(key, 0) < milli:
                return False
        if other._r:
            mine = self._r
            for key, ranges in other._r.items():
                mine_r = mine.get(key)
                if mine_r is None or not _ranges_contain(mine_r, ranges):
                    return False
        if other._t:
            mine_t = self._t
            for key, items in other._t.items():
                have = mine_t.get(key)
                if have is None or not items <= have:
                    return False
        return True

    def __bool__(self) -> bool:
        return bool(self._s or self._r or self._t)

    def is_empty(self) -> bool:
        return not (self._s or self._r or self._t)

    def __mul__(self, n: int) -> Resources:
        """``n`` copies of the scalars; ranges and sets allow only ``n`` of 0 or 1."""
        if not isinstance(n, int) or isinstance(n, bool):
            return NotImplemented
        if n < 0:
            raise ResourceError(f"cannot multiply resources by a negative number ({n})")
        if n == 1:
            return self
        if n == 0:
            return _EMPTY
        if self._r or self._t:
            raise ResourceError(f"cannot multiply ranges or sets by {n}: {self}")
        return _make({k: v * n for k, v in self._s.items()}, {}, {}, self._c)

    __rmul__ = __mul__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resources):
            return NotImplemented
        return self._s == other._s and self._r == other._r and self._t == other._t

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash(
                (
                    frozenset(self._s.items()),
                    frozenset(self._r.items()),
                    frozenset(self._t.items()),
                )
            )
            _set(self, "_hash", h)
            return h

    # ------------------------------------------------------------------ roles

    def _select(self, keep: Iterable[str] | str) -> Resources:
        if isinstance(keep, str):
            s = {k: v for k, v in self._s.items() if k[1] == keep}
            r = {k: v for k, v in self._r.items() if k[1] == keep}
            t = {k: v for k, v in self._t.items() if k[1] == keep}
        else:
            roles = frozenset(keep)
            s = {k: v for k, v in self._s.items() if k[1] in roles}
            r = {k: v for k, v in self._r.items() if k[1] in roles}
            t = {k: v for k, v in self._t.items() if k[1] in roles}
        c = self._c
        if c:
            c = custom_kinds(s, r, t)
        return _make(s, r, t, c)

    def named(self, name: str) -> Resources:
        """The part of these resources called ``name``, in every role."""
        s = {k: v for k, v in self._s.items() if k[0] == name}
        r = {k: v for k, v in self._r.items() if k[0] == name}
        t = {k: v for k, v in self._t.items() if k[0] == name}
        c = self._c
        if c:
            c = custom_kinds(s, r, t)
        return _make(s, r, t, c)

    def roles(self) -> frozenset[str]:
        """Every role that has an entry (``"*"`` included when something is unreserved)."""
        return frozenset(
            [k[1] for k in self._s] + [k[1] for k in self._r] + [k[1] for k in self._t]
        )

    def reserved(self, role: str) -> Resources:
        """Only the entries reserved to ``role``; empty for ``"*"`` (nothing is reserved to it)."""
        if role == UNRESERVED:
            return _EMPTY
        return self._select(role)

    def unreserved(self) -> Resources:
        """Only the ``"*"`` entries."""
        return self._select(UNRESERVED)

    def allocatable_to(self, role: str) -> Resources:
        """What a framework of ``role`` may use: unreserved plus reserved to ``role``."""
        if role == UNRESERVED:
            return self._select(UNRESERVED)
        return self._select((UNRESERVED, role))

    def filter_role(self, role: str) -> Resources:
        """Entries whose role is exactly ``role`` (``"*"`` allowed)."""
        return self._select(role)

    def flatten(self, role: str = UNRESERVED) -> Resources:
        """The same amounts with every entry moved to ``role`` (merging across roles)."""
        if not isinstance(role, str) or not valid_role(role):
            raise ResourceError(f"bad role {role!r}")
        s: dict[Key, int] = {}
        for (name, _), milli in self._s.items():
            key = (name, role)
            s[key] = s.get(key, 0) + milli
        r: dict[Key, Ranges] = {}
        for (name, _), ranges in self._r.items():
            key = (name, role)
            have = r.get(key)
            r[key] = normalize_ranges(have + ranges) if have else ranges
        t: dict[Key, frozenset[str]] = {}
        for (name, _), items in self._t.items():
            key = (name, role)
            have_t = t.get(key)
            t[key] = have_t | items if have_t else items
        return _make(s, r, t, self._c)

    # ------------------------------------------------------------------ reading

    def scalar(self, name: str) -> float:
        """The amount of scalar ``name`` summed over roles; 0.0 when absent."""
        return self.scalar_milli(name) / 1000

    def scalar_milli(self, name: str) -> int:
        """The amount of scalar ``name`` summed over roles, in thousandths."""
        return sum(v for k, v in self._s.items() if k[0] == name)

    def scalar_totals_milli(self) -> dict[str, int]:
        """Name -> thousandths summed over roles (a fresh dict)."""
        out: dict[str, int] = {}
        for (name, _), milli in self._s.items():
            out[name] = out.get(name, 0) + milli
        return out

    def scalar_totals_view(self) -> Mapping[str, int]:
        """:meth:`scalar_totals_milli`, made once per value and shared: for readers only (the
        same task shape is counted thousands of times when agents re-register)."""
        try:
            return self._milli
        except AttributeError:
            view = self.scalar_totals_milli()
            _set(self, "_milli", view)
            return view

    def ranges(self, name: str) -> tuple[tuple[int, int], ...]:
        """The ranges of ``name`` merged over roles: sorted, inclusive, disjoint."""
        found = [v for k, v in self._r.items() if k[0] == name]
        if len(found) == 1:
            return found[0]
        return normalize_ranges(x for ranges in found for x in ranges)

    def set_items(self, name: str) -> frozenset[str]:
        """The items of set ``name`` over all roles."""
        return frozenset(x for k, v in self._t.items() if k[0] == name for x in v)

    def names(self) -> frozenset[str]:
        """Every resource name present."""
        return frozenset(
            [k[0] for k in self._s] + [k[0] for k in self._r] + [k[0] for k in self._t]
        )


_new = object.__new__
_set = object.__setattr__
# the slots' own setters skip the refusing __setattr__ and are the cheapest way in
_set_s: Callable[[Resources, dict[Key, int]], None] = Resources.__dict__["_s"].__set__
_set_r: Callable[[Resources, dict[Key, Ranges]], None] = Resources.__dict__["_r"].__set__
_set_t: Callable[[Resources, dict[Key, frozenset[str]]], None] = Resources.__dict__["_t"].__set__
_set_c: Callable[[Resources, dict[str, int]], None] = Resources.__dict__["_c"].__set__
_EMPTY: Final = Resources()


def _key_text(name: str, role: str) -> str:
    return name if role == UNRESERVED else f"{name}({role})"
