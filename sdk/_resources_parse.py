"""Parsing the text, dict and keyword forms of :class:`agora.sdk.resources.Resources`.

Private: use ``Resources.parse``, ``Resources.from_dict`` and ``Resources.scalars``.
Each ``parse_*`` function validates its input against the limits and returns the
components a value is built from (see :data:`Components`) or raises
:class:`ResourceError`; this module does not import :class:`Resources`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final, NoReturn

from agora.sdk._resources_base import (
    KIND_NAMES,
    MAX_ENTRIES,
    MAX_ITEM_LENGTH,
    MAX_ITEMS_PER_NAME,
    MAX_NAME_LENGTH,
    MAX_PORT,
    MAX_RANGES_PER_NAME,
    MAX_SCALAR,
    RANGES,
    SCALAR,
    SET,
    UNRESERVED,
    WELL_KNOWN,
    Key,
    Ranges,
    ResourceError,
    custom_kinds,
    decimal_to_milli,
    float_to_milli,
    normalize_ranges,
    valid_role,
)

__all__ = ["Components", "parse_dict", "parse_scalars", "parse_text"]

# scalars in thousandths / normalized ranges / sets, keyed by (name, role), none of
# them empty, and the kinds of the names that are not well known
Components = tuple[dict[Key, int], dict[Key, Ranges], dict[Key, frozenset[str]], dict[str, int]]

# A module-level name rather than the imported one: CPython 3.11 compiles a method call
# on an imported name (``WELL_KNOWN.get(x)``) as an attribute load, which allocates a
# bound method on every call, and Builder.kind is on the hot path.
_WELL_KNOWN: Final = WELL_KNOWN

_MAX_SCALAR_MILLI: Final = MAX_SCALAR * 1000
_MAX_SCALAR_TOKEN: Final = 64

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_./-]+")
_KEY_RE: Final = re.compile(r"([A-Za-z0-9_./-]+)(?:\((.*)\))?", re.DOTALL)
_DECIMAL_RE: Final = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_INT_RE: Final = re.compile(r"[0-9]+")
_ITEM_FORBIDDEN: Final = frozenset(",;{}")
_WS: Final = " \t\r\n"


def parse_text(text: str) -> Components:
    """The components of the text form."""
    if not isinstance(text, str):
        raise ResourceError(f"resource text must be a str, not {type(text).__name__}")
    return _Parser(text).parse()


def parse_dict(d: Mapping[str, object]) -> Components:
    """The components of the dict form."""
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
        elif not valid_role(role):
            raise ResourceError(f"bad role {role!r} in resource key {key!r}")
        _dict_value(b, key, (name, role), value)
    return b.build()


def parse_scalars(role: str, amounts: Mapping[str, object]) -> Components:
    """The components of ``Resources.scalars(role, **amounts)``."""
    if not isinstance(role, str) or not valid_role(role):
        raise ResourceError(f"bad role {role!r}")
    b = _Builder()
    for name, value in amounts.items():
        b.entry(repr(name), None)
        if _NAME_RE.fullmatch(name) is None or len(name) > MAX_NAME_LENGTH:
            raise ResourceError(f"bad resource name {name!r}")
        b.kind(name, SCALAR, None)
        b.add_scalar((name, role), _scalar_milli(name, value))
    return b.build()


# --------------------------------------------------------------------------- validated entries


class _Builder:
    """Accumulates validated entries for parse_text / parse_dict / parse_scalars."""

    __slots__ = ("entries", "items", "kinds", "r", "ranges_count", "s", "t")

    def __init__(self) -> None:
        self.s: dict[Key, int] = {}
        self.r: dict[Key, list[tuple[int, int]]] = {}
        self.t: dict[Key, set[str]] = {}
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
                f"resource {name!r} must be {KIND_NAMES[expected]}, got {KIND_NAMES[kind]}",
                position,
            )
        seen = self.kinds.setdefault(name, kind)
        if seen != kind:
            raise ResourceError(
                f"resource {name!r} is both {KIND_NAMES[seen]} and {KIND_NAMES[kind]}",
                position,
            )

    def add_scalar(self, key: Key, milli: int) -> None:
        self.s[key] = self.s.get(key, 0) + milli

    def add_ranges(self, key: Key, ranges: list[tuple[int, int]], position: int | None) -> None:
        count = self.ranges_count.get(key[0], 0) + len(ranges)
        if count > MAX_RANGES_PER_NAME:
            raise ResourceError(
                f"too many ranges for {key[0]!r} (more than {MAX_RANGES_PER_NAME})", position
            )
        self.ranges_count[key[0]] = count
        self.r.setdefault(key, []).extend(ranges)

    def add_items(self, key: Key, items: list[str], position: int | None) -> None:
        count = self.items.get(key[0], 0) + len(items)
        if count > MAX_ITEMS_PER_NAME:
            raise ResourceError(
                f"too many set items for {key[0]!r} (more than {MAX_ITEMS_PER_NAME})", position
            )
        self.items[key[0]] = count
        self.t.setdefault(key, set()).update(items)

    def build(self) -> Components:
        s = {k: v for k, v in self.s.items() if v}
        r = {k: normalize_ranges(v) for k, v in self.r.items() if v}
        t = {k: frozenset(v) for k, v in self.t.items() if v}
        return s, r, t, custom_kinds(s, r, t)


def _valid_item(item: str) -> bool:
    return (
        0 < len(item) <= MAX_ITEM_LENGTH
        and item.isprintable()
        and not any(c.isspace() or c in _ITEM_FORBIDDEN for c in item)
    )


# --------------------------------------------------------------------------- text form


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

    def parse(self) -> Components:
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
            if not valid_role(role):
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

    def scalar(self, key: Key) -> None:
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
        self.b.kind(name, SCALAR, pos)
        whole, frac = m.group(1), m.group(2) or ""
        milli = decimal_to_milli(whole + frac, len(frac))
        if milli > _MAX_SCALAR_MILLI:
            self.fail(f"scalar value {token!r} for {name!r} is above {MAX_SCALAR}", pos)
        self.b.add_scalar(key, milli)
        self.i = pos + len(token)

    def _bracketed(self, key: Key, close: str) -> list[tuple[str, int]]:
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

    def ranges(self, key: Key) -> None:
        name = key[0]
        open_pos = self.i
        self.b.kind(name, RANGES, open_pos)
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

    def set_items(self, key: Key) -> None:
        name = key[0]
        open_pos = self.i
        self.b.kind(name, SET, open_pos)
        out: list[str] = []
        for token, pos in self._bracketed(key, "}"):
            if not _valid_item(token):
                self.fail(f"bad set item {token!r} for {name!r}", pos)
            out.append(token)
        self.b.add_items(key, out, open_pos)


# --------------------------------------------------------------------------- dict form


def _scalar_milli(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResourceError(f"resource {key!r}: expected a number, got {type(value).__name__}")
    if isinstance(value, int):
        if value < 0 or value > MAX_SCALAR:
            raise ResourceError(f"resource {key!r}: scalar {value} not in [0, {MAX_SCALAR}]")
        return value * 1000
    if not math.isfinite(value) or value < 0 or value > MAX_SCALAR:
        raise ResourceError(f"resource {key!r}: scalar {value!r} not in [0, {MAX_SCALAR}]")
    return float_to_milli(value)


def _dict_value(b: _Builder, key_text: str, key: Key, value: object) -> None:
    name = key[0]
    if isinstance(value, int | float) and not isinstance(value, bool):
        b.kind(name, SCALAR, None)
        b.add_scalar(key, _scalar_milli(key_text, value))
        return
    if not isinstance(value, list | tuple | set | frozenset):
        raise ResourceError(
            f"resource {key_text!r}: expected a number or a list, got {type(value).__name__}"
        )
    items = list(value)
    if not items:
        expected = _WELL_KNOWN.get(name)
        if expected == SCALAR:
            raise ResourceError(f"resource {key_text!r}: expected a number, got an empty list")
        return
    if all(isinstance(x, str) for x in items):
        b.kind(name, SET, None)
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
    b.kind(name, RANGES, None)
    b.add_ranges(key, ranges, None)
