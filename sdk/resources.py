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
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, NoReturn

__all__ = ["UNRESERVED", "ResourceError", "Resources"]

UNRESERVED: Final = "*"

MAX_ENTRIES: Final = 1024
MAX_NAME_LENGTH: Final = 64
MAX_ROLE_LENGTH: Final = 64
MAX_ITEM_LENGTH: Final = 256
MAX_RANGES_PER_NAME: Final = 1024
MAX_ITEMS_PER_NAME: Final = 1024
MAX_SCALAR: Final = 10**12
MAX_PORT: Final = 2**32 - 1

_MAX_SCALAR_MILLI: Final = MAX_SCALAR * 1000
_MAX_SCALAR_TOKEN: Final = 64

_SCALAR: Final = 0
_RANGES: Final = 1
_SET: Final = 2
_KIND_NAMES: Final = ("scalar", "ranges", "set")
_WELL_KNOWN: Final[dict[str, int]] = {
    "cpus": _SCALAR,
    "mem": _SCALAR,
    "disk": _SCALAR,
    "gpus": _SCALAR,
    "ports": _RANGES,
}

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_./-]+")
_ROLE_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")
_KEY_RE: Final = re.compile(r"([A-Za-z0-9_./-]+)(?:\((.*)\))?", re.DOTALL)
_DECIMAL_RE: Final = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_INT_RE: Final = re.compile(r"[0-9]+")
_ITEM_FORBIDDEN: Final = frozenset(",;{}")
_WS: Final = " \t\r\n"

_Key = tuple[str, str]
_Ranges = tuple[tuple[int, int], ...]


class ResourceError(ValueError):
    """Bad resource text/dict or an impossible operation (subtracting what is not there)."""

    position: int | None

    def __init__(self, message: str, position: int | None = None) -> None:
        if position is not None:
            message = f"{message} at position {position}"
        super().__init__(message)
        self.position = position


# --------------------------------------------------------------------------- helpers


def _decimal_to_milli(digits: str, scale: int) -> int:
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


def _float_to_milli(value: float) -> int:
    """A finite, non-negative float in thousandths, rounded half-even on its decimal repr."""
    if value == 0:
        return 0
    text = repr(value)
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    return _decimal_to_milli(whole + frac, len(frac) - (int(exp) if exp else 0))


def _milli_to_text(milli: int) -> str:
    whole, frac = divmod(milli, 1000)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


def _normalize(intervals: Iterable[tuple[int, int]]) -> _Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _ranges_contain(a: _Ranges, b: _Ranges) -> bool:
    """Whether normalized ``a`` covers every value of normalized ``b``."""
    i = 0
    n = len(a)
    for lo, hi in b:
        while i < n and a[i][1] < lo:
            i += 1
        if i == n or a[i][0] > lo or a[i][1] < hi:
            return False
    return True


def _ranges_subtract(a: _Ranges, b: _Ranges) -> _Ranges:
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


def _valid_role(role: str) -> bool:
    if role == UNRESERVED:
        return True
    return (
        len(role) <= MAX_ROLE_LENGTH
        and role not in (".", "..")
        and _ROLE_RE.fullmatch(role) is not None
    )


def _valid_item(item: str) -> bool:
    return (
        0 < len(item) <= MAX_ITEM_LENGTH
        and item.isprintable()
        and not any(c.isspace() or c in _ITEM_FORBIDDEN for c in item)
    )


def _custom_kinds(
    s: Mapping[_Key, int], r: Mapping[_Key, _Ranges], t: Mapping[_Key, frozenset[str]]
) -> dict[str, int]:
    """Kinds of the names that are not well known (empty in the common case)."""
    out: dict[str, int] = {}
    for kind, entries in ((_SCALAR, s), (_RANGES, r), (_SET, t)):
        for name, _ in entries:
            if name not in _WELL_KNOWN:
                out[name] = kind
    return out


class _Builder:
    """Accumulates validated entries for parse / from_dict / scalars."""

    __slots__ = ("entries", "items", "kinds", "r", "ranges_count", "s", "t")

    def __init__(self) -> None:
        self.s: dict[_Key, int] = {}
        self.r: dict[_Key, list[tuple[int, int]]] = {}
        self.t: dict[_Key, set[str]] = {}
        self.kinds: dict[str, int] = {}
        self.ranges_count: dict[str, int] = {}
        self.items: dict[str, int] = {}
        self.entries = 0

    def entry(self, what: str, position: int | None) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise ResourceError(f"too many entries (more than {MAX_ENTRIES}) at {what}", position)

    def kind(self, name: str, kind: int, position: int | None) -> None:
        expected = _WELL_KNOWN.get(name)
        if expected is not None and expected != kind:
            raise ResourceError(
                f"resource {name!r} must be {_KIND_NAMES[expected]}, got {_KIND_NAMES[kind]}",
                position,
            )
        seen = self.kinds.setdefault(name, kind)
        if seen != kind:
            raise ResourceError(
                f"resource {name!r} is both {_KIND_NAMES[seen]} and {_KIND_NAMES[kind]}",
                position,
            )

    def add_scalar(self, key: _Key, milli: int) -> None:
        self.s[key] = self.s.get(key, 0) + milli

    def add_ranges(self, key: _Key, ranges: list[tuple[int, int]], position: int | None) -> None:
        count = self.ranges_count.get(key[0], 0) + len(ranges)
        if count > MAX_RANGES_PER_NAME:
            raise ResourceError(
                f"too many ranges for {key[0]!r} (more than {MAX_RANGES_PER_NAME})", position
            )
        self.ranges_count[key[0]] = count
        self.r.setdefault(key, []).extend(ranges)

    def add_items(self, key: _Key, items: list[str], position: int | None) -> None:
        count = self.items.get(key[0], 0) + len(items)
        if count > MAX_ITEMS_PER_NAME:
            raise ResourceError(
                f"too many set items for {key[0]!r} (more than {MAX_ITEMS_PER_NAME})", position
            )
        self.items[key[0]] = count
        self.t.setdefault(key, set()).update(items)

    def build(self) -> Resources:
        s = {k: v for k, v in self.s.items() if v}
        r = {k: _normalize(v) for k, v in self.r.items() if v}
        t = {k: frozenset(v) for k, v in self.t.items() if v}
        return _make(s, r, t, _custom_kinds(s, r, t))


# --------------------------------------------------------------------------- text parser


class _Parser:
    __slots__ = ("b", "i", "n", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.b = _Builder()

    def ws(self) -> None:
        text, n, i = self.text, self.n, self.i
        while i < n and text[i] in _WS:
            i += 1
        self.i = i

    def fail(self, message: str, position: int) -> NoReturn:
        raise ResourceError(message, position)

    def token_at(self, i: int, stops: str = ";") -> str:
        j = i
        while j < self.n and self.text[j] not in stops:
            j += 1
        return self.text[i:j].strip() or self.text[i : i + 1]

    def parse(self) -> Resources:
        text = self.text
        while True:
            self.ws()
            if self.i >= self.n:
                break
            if text[self.i] == ";":
                self.i += 1
                continue
            self.entry()
            self.ws()
            if self.i < self.n:
                if text[self.i] != ";":
                    self.fail(f"expected ';' but found {self.token_at(self.i)!r}", self.i)
                self.i += 1
        return self.b.build()

    def entry(self) -> None:
        text = self.text
        start = self.i
        m = _NAME_RE.match(text, start)
        if m is None:
            self.fail(f"bad resource name {self.token_at(start, ';:(')!r}", start)
        name = m.group()
        if len(name) > MAX_NAME_LENGTH:
            self.fail(f"resource name {name!r} longer than {MAX_NAME_LENGTH} characters", start)
        self.b.entry(repr(name), start)
        self.i = m.end()
        self.ws()
        role = UNRESERVED
        if self.i < self.n and text[self.i] == "(":
            close = text.find(")", self.i)
            if close < 0:
                self.fail(f"unterminated role for {name!r}", self.i)
            raw = text[self.i + 1 : close]
            role = raw.strip()
            role_pos = self.i + 1 + (len(raw) - len(raw.lstrip()))
            if not _valid_role(role):
                self.fail(f"bad role {role!r} for {name!r}", role_pos)
            self.i = close + 1
            self.ws()
        if self.i >= self.n or text[self.i] != ":":
            found = self.token_at(self.i) if self.i < self.n else "end of text"
            self.fail(f"expected ':' after {name!r} but found {found!r}", self.i)
        self.i += 1
        self.ws()
        key = (name, role)
        if self.i < self.n and text[self.i] == "[":
            self.ranges(key)
        elif self.i < self.n and text[self.i] == "{":
            self.set_items(key)
        else:
            self.scalar(key)

    def scalar(self, key: _Key) -> None:
        name = key[0]
        pos = self.i
        end = self.text.find(";", pos)
        if end < 0:
            end = self.n
        token = self.text[pos:end].rstrip()
        if len(token) > _MAX_SCALAR_TOKEN:
            self.fail(f"bad scalar value {token[:_MAX_SCALAR_TOKEN] + '...'!r} for {name!r}", pos)
        m = _DECIMAL_RE.fullmatch(token)
        if m is None:
            self.fail(f"bad scalar value {token!r} for {name!r}", pos)
        self.b.kind(name, _SCALAR, pos)
        whole, frac = m.group(1), m.group(2) or ""
        milli = _decimal_to_milli(whole + frac, len(frac))
        if milli > _MAX_SCALAR_MILLI:
            self.fail(f"scalar value {token!r} for {name!r} is above {MAX_SCALAR}", pos)
        self.b.add_scalar(key, milli)
        self.i = pos + len(token)

    def _bracketed(self, key: _Key, close: str) -> list[tuple[str, int]]:
        """Items between the bracket at self.i and ``close``, each with its position."""
        open_pos = self.i
        end = self.text.find(close, open_pos)
        if end < 0:
            self.fail(f"unterminated {self.text[open_pos]!r} for {key[0]!r}", open_pos)
        inner_start = open_pos + 1
        inner = self.text[inner_start:end]
        self.i = end + 1
        if not inner.strip():
            return []
        out: list[tuple[str, int]] = []
        offset = 0
        for part in inner.split(","):
            lead = len(part) - len(part.lstrip())
            out.append((part.strip(), inner_start + offset + lead))
            offset += len(part) + 1
        return out

    def ranges(self, key: _Key) -> None:
        name = key[0]
        open_pos = self.i
        self.b.kind(name, _RANGES, open_pos)
        out: list[tuple[int, int]] = []
        for token, pos in self._bracketed(key, "]"):
            lo_text, dash, hi_text = token.partition("-")
            lo_text, hi_text = lo_text.strip(), hi_text.strip()
            if (
                not dash
                or _INT_RE.fullmatch(lo_text) is None
                or _INT_RE.fullmatch(hi_text) is None
                or len(lo_text) > 12
                or len(hi_text) > 12
            ):
                self.fail(f"bad range {token!r} for {name!r}", pos)
            lo, hi = int(lo_text), int(hi_text)
            if lo > hi or hi > MAX_PORT:
                self.fail(f"bad range {token!r} for {name!r}", pos)
            out.append((lo, hi))
        self.b.add_ranges(key, out, open_pos)

    def set_items(self, key: _Key) -> None:
        name = key[0]
        open_pos = self.i
        self.b.kind(name, _SET, open_pos)
        out: list[str] = []
        for token, pos in self._bracketed(key, "}"):
            if not _valid_item(token):
                self.fail(f"bad set item {token!r} for {name!r}", pos)
            out.append(token)
        self.b.add_items(key, out, open_pos)


# --------------------------------------------------------------------------- the value


def _make(
    s: dict[_Key, int],
    r: dict[_Key, _Ranges],
    t: dict[_Key, frozenset[str]],
    c: dict[str, int],
) -> Resources:
    obj = _new(Resources)
    _set_s(obj, s)
    _set_r(obj, r)
    _set_t(obj, t)
    _set_c(obj, c)
    return obj


def _restore(
    s: dict[_Key, int], r: dict[_Key, _Ranges], t: dict[_Key, frozenset[str]]
) -> Resources:
    return _make(dict(s), dict(r), dict(t), _custom_kinds(s, r, t))


def _conflict(name: str, a: int, b: int) -> NoReturn:
    raise ResourceError(f"resource {name!r} is both {_KIND_NAMES[a]} and {_KIND_NAMES[b]}")


class Resources:
    """An immutable, hashable bag of scalar, range and set resources, per role."""

    __slots__ = ("_c", "_hash", "_r", "_s", "_t")

    # scalars in thousandths / normalized ranges / sets, keyed by (name, role); never empty
    _s: dict[_Key, int]
    _r: dict[_Key, _Ranges]
    _t: dict[_Key, frozenset[str]]
    # kinds of names that are not well known: lets + detect a kind clash cheaply
    _c: dict[str, int]
    _hash: int

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
        if not isinstance(text, str):
            raise ResourceError(f"resource text must be a str, not {type(text).__name__}")
        return _Parser(text).parse()

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Resources:
        """Build from the dict form; raises :class:`ResourceError` naming the bad key."""
        if not isinstance(d, Mapping):
            raise ResourceError(f"resources must be a mapping, not {type(d).__name__}")
        b = _Builder()
        for key, value in d.items():
            b.entry(repr(key), None)
            if not isinstance(key, str):
                raise ResourceError(f"resource key {key!r} is not a str")
            m = _KEY_RE.fullmatch(key)
            if m is None:
                raise ResourceError(f"bad resource key {key!r}")
            name, role = m.group(1), m.group(2)
            if len(name) > MAX_NAME_LENGTH:
                raise ResourceError(
                    f"resource name in {key!r} longer than {MAX_NAME_LENGTH} characters"
                )
            if role is None:
                role = UNRESERVED
            elif not _valid_role(role):
                raise ResourceError(f"bad role {role!r} in resource key {key!r}")
            _dict_value(b, key, (name, role), value)
        return b.build()

    @classmethod
    def scalars(cls, role: str = UNRESERVED, **amounts: float) -> Resources:
        """``Resources.scalars(cpus=1, mem=128)``; ``role`` reserves them all."""
        if not isinstance(role, str) or not _valid_role(role):
            raise ResourceError(f"bad role {role!r}")
        b = _Builder()
        for name, value in amounts.items():
            b.entry(repr(name), None)
            if _NAME_RE.fullmatch(name) is None or len(name) > MAX_NAME_LENGTH:
                raise ResourceError(f"bad resource name {name!r}")
            b.kind(name, _SCALAR, None)
            b.add_scalar((name, role), _scalar_milli(name, value))
        return b.build()

    # ------------------------------------------------------------------ output

    def to_text(self) -> str:
        """Canonical text, sorted by name then role; ``parse(to_text(r)) == r``."""
        parts: list[tuple[_Key, str]] = []
        for key, milli in self._s.items():
            parts.append((key, _milli_to_text(milli)))
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
                r[key] = _normalize(mine_r + ranges) if mine_r else ranges
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
            c = _custom_kinds(s, r, t)
        return _make(s, r, t, c)

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
            c = _custom_kinds(s, r, t)
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
        if not isinstance(role, str) or not _valid_role(role):
            raise ResourceError(f"bad role {role!r}")
        s: dict[_Key, int] = {}
        for (name, _), milli in self._s.items():
            key = (name, role)
            s[key] = s.get(key, 0) + milli
        r: dict[_Key, _Ranges] = {}
        for (name, _), ranges in self._r.items():
            key = (name, role)
            have = r.get(key)
            r[key] = _normalize(have + ranges) if have else ranges
        t: dict[_Key, frozenset[str]] = {}
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

    def ranges(self, name: str) -> tuple[tuple[int, int], ...]:
        """The ranges of ``name`` merged over roles: sorted, inclusive, disjoint."""
        found = [v for k, v in self._r.items() if k[0] == name]
        if len(found) == 1:
            return found[0]
        return _normalize(x for ranges in found for x in ranges)

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
_set_s: Callable[[Resources, dict[_Key, int]], None] = Resources.__dict__["_s"].__set__
_set_r: Callable[[Resources, dict[_Key, _Ranges]], None] = Resources.__dict__["_r"].__set__
_set_t: Callable[[Resources, dict[_Key, frozenset[str]]], None] = Resources.__dict__["_t"].__set__
_set_c: Callable[[Resources, dict[str, int]], None] = Resources.__dict__["_c"].__set__
_EMPTY: Final = Resources()


def _key_text(name: str, role: str) -> str:
    return name if role == UNRESERVED else f"{name}({role})"


def _scalar_milli(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResourceError(f"resource {key!r}: expected a number, got {type(value).__name__}")
    if isinstance(value, int):
        if value < 0 or value > MAX_SCALAR:
            raise ResourceError(f"resource {key!r}: scalar {value} not in [0, {MAX_SCALAR}]")
        return value * 1000
    if not math.isfinite(value) or value < 0 or value > MAX_SCALAR:
        raise ResourceError(f"resource {key!r}: scalar {value!r} not in [0, {MAX_SCALAR}]")
    return _float_to_milli(value)


def _dict_value(b: _Builder, key_text: str, key: _Key, value: object) -> None:
    name = key[0]
    if isinstance(value, int | float) and not isinstance(value, bool):
        b.kind(name, _SCALAR, None)
        b.add_scalar(key, _scalar_milli(key_text, value))
        return
    if not isinstance(value, list | tuple | set | frozenset):
        raise ResourceError(
            f"resource {key_text!r}: expected a number or a list, got {type(value).__name__}"
        )
    items = list(value)
    if not items:
        expected = _WELL_KNOWN.get(name)
        if expected == _SCALAR:
            raise ResourceError(f"resource {key_text!r}: expected a number, got an empty list")
        return
    if all(isinstance(x, str) for x in items):
        b.kind(name, _SET, None)
        for x in items:
            if not _valid_item(x):
                raise ResourceError(f"resource {key_text!r}: bad set item {x!r}")
        b.add_items(key, [str(x) for x in items], None)
        return
    if isinstance(value, set | frozenset):
        raise ResourceError(f"resource {key_text!r}: a set may hold only strings")
    ranges: list[tuple[int, int]] = []
    for x in items:
        if (
            not isinstance(x, list | tuple)
            or len(x) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in x)
        ):
            raise ResourceError(f"resource {key_text!r}: bad range {x!r}, expected [lo, hi]")
        lo, hi = x
        if not 0 <= lo <= hi <= MAX_PORT:
            raise ResourceError(
                f"resource {key_text!r}: bad range {x!r}, need 0 <= lo <= hi < 2**32"
            )
        ranges.append((lo, hi))
    b.kind(name, _RANGES, None)
    b.add_ranges(key, ranges, None)
