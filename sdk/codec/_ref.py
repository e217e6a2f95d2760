"""The reference converters of the wire codec (:mod:`agora.sdk.codec`): per schema kind, a Python
function each way that checks types and bounds and names the dotted path of a bad value. They
decide whenever the msgspec fast path is unsure, so every error a peer or a caller sees comes
from here."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Range
from agora.sdk.messages._schema import (
    BoolKind,
    BytesKind,
    EnumKind,
    FloatKind,
    IntKind,
    Kind,
    MapKind,
    OptionalKind,
    RecordKind,
    ResourcesKind,
    StrKind,
    TupleKind,
    UnionKind,
    variant_tag,
)
from agora.sdk.resources import ResourceError, Resources

_TAG: Final = "type"  # discriminator key of union (operation) maps


# ---- errors --------------------------------------------------------------------------------------


class _Bad(Exception):
    """A value that breaks its schema; ``path`` (innermost first) is filled while unwinding."""

    def __init__(self, reason: str, leaf: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.leaf = leaf  # a field named by the reason (missing/unknown), not part of the prefix
        self.path: list[str] = []

    def error(self, root: str) -> ProtocolError:
        where = root + "".join(s if s[0] == "[" else "." + s for s in reversed(self.path))
        field = where if self.leaf is None else f"{where}.{self.leaf}"
        return ProtocolError(f"{where}: {self.reason}", field=field)


_NAMES: Final[Mapping[type, str]] = {
    type(None): "nil",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    tuple: "array",
    dict: "map",
}


def _got(v: object) -> str:
    return _NAMES.get(type(v)) or type(v).__name__


def _expected(what: str, v: object) -> _Bad:
    return _Bad(f"expected {what}, got {_got(v)}")


def _short(v: object) -> str:
    return _clip(repr(v), 80)


def _clip(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _oversized(size: int, limit: int) -> str:
    return f"frame of {size} bytes exceeds the {limit}-byte limit"


def _first_bad(conv: Conv, items: tuple[Any, ...]) -> int:
    """Index of the first item ``conv`` rejects (converters are pure, so a re-run finds it)."""
    for i, x in enumerate(items):
        try:
            conv(x)
        except _Bad:
            return i
    return -1


def _bounds(r: Range) -> tuple[float, float, bool]:
    lo = -math.inf if r.lo is None else r.lo
    hi = math.inf if r.hi is None else r.hi
    return lo, hi, r.lo_open


def _out_of_range(v: float, r: Range) -> _Bad:
    return _Bad(f"{v!r} is out of range {r.describe()}")


# ---- converters ----------------------------------------------------------------------------------
# One function per (kind, direction), built once. Decoders take what msgpack produced (str, int,
# float, bool, bytes, None, tuple, dict); encoders take what a record holds.

Conv = Callable[[Any], Any]
_MISSING: Final = object()


def _dec_str(k: StrKind) -> Conv:
    n, wrap = k.max_len, k.wrap

    def dec(v: Any) -> Any:
        if type(v) is not str:
            raise _expected("str", v)
        if len(v) > n:
            raise _Bad(f"string of {len(v)} characters exceeds the {n}-character limit")
        return v if wrap is None else wrap(v)

    return dec


def _enc_str(k: StrKind) -> Conv:
    n = k.max_len

    def enc(v: Any) -> Any:
        if not isinstance(v, str):
            raise _expected("str", v)
        if len(v) > n:
            raise _Bad(f"string of {len(v)} characters exceeds the {n}-character limit")
        return v

    return enc


def _int(k: IntKind) -> Conv:  # same both ways
    r = k.range
    lo, hi, lo_open = _bounds(r)

    def conv(v: Any) -> Any:
        if type(v) is not int:
            raise _expected("int", v)
        if not lo <= v <= hi or (lo_open and v == lo):
            raise _out_of_range(v, r)
        return v

    return conv


def _float(k: FloatKind) -> Conv:  # same both ways; ints are accepted and become floats
    r = k.range
    lo, hi, lo_open = _bounds(r)
    isfinite = math.isfinite

    def conv(v: Any) -> Any:
        t = type(v)
        if t is float:
            if not isfinite(v):
                raise _Bad(f"expected a finite number, got {v!r}")
        elif t is int:
            try:
                v = float(v)
            except OverflowError:
                raise _Bad("expected a finite number, got a huge int") from None
        else:
            raise _expected("float", v)
        if not lo <= v <= hi or (lo_open and v == lo):
            raise _out_of_range(v, r)
        return v

    return conv


def _bool(_: BoolKind) -> Conv:
    def conv(v: Any) -> Any:
        if type(v) is not bool:
            raise _expected("bool", v)
        return v

    return conv


def _bytes(k: BytesKind) -> Conv:
    n = k.max_len

    def conv(v: Any) -> Any:
        if type(v) is not bytes:
            raise _expected("bytes", v)
        if len(v) > n:
            raise _Bad(f"{len(v)} bytes exceed the {n}-byte limit")
        return v

    return conv


def _dec_enum(k: EnumKind) -> Conv:
    members = {m.value: m for m in k.enum}
    hint = f"a {k.enum.__name__} ({', '.join(members)})"

    def dec(v: Any) -> Any:
        if type(v) is not str:
            raise _expected(f"a {k.enum.__name__} name", v)
        m = members.get(v)
        if m is None:
            raise _Bad(f"expected {hint}, got {_short(v)}")
        return m

    return dec


def _enc_enum(k: EnumKind) -> Conv:
    cls = k.enum

    def enc(v: Any) -> Any:
        if type(v) is not cls:
            raise _expected(cls.__name__, v)
        return v.value

    return enc


def _dec_resources(_: ResourcesKind) -> Conv:
    from_dict = Resources.from_dict

    def dec(v: Any) -> Any:
        if type(v) is not dict:
            raise _expected("map", v)
        try:
            return from_dict(v)
        except ResourceError as exc:
            raise _Bad(f"bad resources: {_clip(str(exc))}") from None
        except Exception as exc:  # foreign code fed hostile input: still the sender's fault
            raise _Bad(f"bad resources ({type(exc).__name__})") from None

    return dec


def _enc_resources(_: ResourcesKind) -> Conv:
    def enc(v: Any) -> Any:
        if not isinstance(v, Resources):
            raise _expected("Resources", v)
        return v.json_view()  # made once per value; msgpack only reads it

    return enc


def _optional(inner: Conv) -> Conv:
    def conv(v: Any) -> Any:
        return None if v is None else inner(v)

    return conv


def _tuple(k: TupleKind, item: Conv, *, decoding: bool) -> Conv:
    n = k.max_items
    what = "array" if decoding else "tuple"

    def conv(v: Any) -> Any:
        if type(v) is not tuple:
            raise _expected(what, v)
        if len(v) > n:
            raise _Bad(f"{len(v)} items exceed the {n}-item limit")
        try:
            out = [item(x) for x in v]
        except _Bad as bad:
            bad.path.append(f"[{_first_bad(item, v)}]")
            raise
        return tuple(out) if decoding else out

    return conv


def _map(k: MapKind, *, decoding: bool) -> Conv:
    n, kn, vn = k.max_items, k.key.max_len, k.value.max_len

    def conv(v: Any) -> Any:
        if type(v) is not dict:
            if decoding or not isinstance(v, Mapping):
                raise _expected("map", v)
            v = dict(v)
        if len(v) > n:
            raise _Bad(f"{len(v)} entries exceed the {n}-entry limit")
        for key, value in v.items():
            if not isinstance(key, str) or len(key) > kn:
                what = f"a str key of at most {kn} characters"
                raise _Bad(f"expected {what}, got {_got(key)} {_short(key)}")
            if not isinstance(value, str) or len(value) > vn:
                bad = _Bad(f"expected a str of at most {vn} characters, got {_got(value)}")
                bad.path.append(f"[{_short(key)}]")
                raise bad
        return v

    return conv


def _dec_record(k: RecordKind, tag: str | None = None) -> Conv:
    cls = k.cls
    plan = tuple((f.name, _decoder(f.kind), f.required) for f in k.fields)
    extra = 0 if tag is None else 1

    def dec(v: Any) -> Any:
        if type(v) is not dict:
            raise _expected("map", v)
        kw = {}
        for name, conv, required in plan:
            x = v.get(name, _MISSING)
            if x is _MISSING:
                if required:
                    raise _Bad(f"missing required field {name!r}", leaf=name)
                continue
            try:
                kw[name] = conv(x)
            except _Bad as bad:
                bad.path.append(name)
                raise
        if len(kw) + extra != len(v):  # unknown fields (a newer peer's) are ignored...
            for key in v:
                if type(key) is not str:  # ...but are named by a str, as msgpack maps of records
                    raise _Bad(f"field names must be str, got {_got(key)} {_short(key)}")
        return cls(**kw)

    return dec


def _enc_record(k: RecordKind, tag: str | None = None) -> Conv:
    cls = k.cls
    plan = tuple((f.name, _encoder(f.kind)) for f in k.fields)

    def enc(v: Any) -> Any:
        if type(v) is not cls:
            raise _expected(cls.__name__, v)
        out: dict[str, Any] = {} if tag is None else {_TAG: tag}
        for name, conv in plan:
            try:
                out[name] = conv(getattr(v, name))
            except _Bad as bad:
                bad.path.append(name)
                raise
        return out

    return enc


def _dec_union(k: UnionKind) -> Conv:
    by_tag = {variant_tag(v.cls): _dec_record(v, variant_tag(v.cls)) for v in k.variants}
    choices = ", ".join(by_tag)

    def dec(v: Any) -> Any:
        if type(v) is not dict:
            raise _expected("map", v)
        tag = v.get(_TAG, _MISSING)
        if tag is _MISSING:
            raise _Bad(f"missing required field {_TAG!r}", leaf=_TAG)
        conv = by_tag.get(tag) if type(tag) is str else None
        if conv is None:
            raise _Bad(f"unknown {_TAG} {_short(tag)} (expected one of {choices})", leaf=_TAG)
        return conv(v)

    return dec


def _enc_union(k: UnionKind) -> Conv:
    by_cls = {v.cls: _enc_record(v, variant_tag(v.cls)) for v in k.variants}
    choices = " | ".join(c.__name__ for c in by_cls)

    def enc(v: Any) -> Any:
        conv = by_cls.get(type(v))
        if conv is None:
            raise _expected(choices, v)
        return conv(v)

    return enc


def _decoder(kind: Kind) -> Conv:
    """The decoding converter of ``kind`` (wire value -> record value)."""
    if isinstance(kind, StrKind):
        return _dec_str(kind)
    if isinstance(kind, IntKind):
        return _int(kind)
    if isinstance(kind, FloatKind):
        return _float(kind)
    if isinstance(kind, BoolKind):
        return _bool(kind)
    if isinstance(kind, BytesKind):
        return _bytes(kind)
    if isinstance(kind, EnumKind):
        return _dec_enum(kind)
    if isinstance(kind, ResourcesKind):
        return _dec_resources(kind)
    if isinstance(kind, OptionalKind):
        return _optional(_decoder(kind.inner))
    if isinstance(kind, TupleKind):
        return _tuple(kind, _decoder(kind.item), decoding=True)
    if isinstance(kind, MapKind):
        return _map(kind, decoding=True)
    if isinstance(kind, RecordKind):
        return _dec_record(kind)
    return _dec_union(kind)


def _encoder(kind: Kind) -> Conv:
    """The encoding converter of ``kind`` (record value -> wire value)."""
    if isinstance(kind, StrKind):
        return _enc_str(kind)
    if isinstance(kind, IntKind):
        return _int(kind)
    if isinstance(kind, FloatKind):
        return _float(kind)
    if isinstance(kind, BoolKind):
        return _bool(kind)
    if isinstance(kind, BytesKind):
        return _bytes(kind)
    if isinstance(kind, EnumKind):
        return _enc_enum(kind)
    if isinstance(kind, ResourcesKind):
        return _enc_resources(kind)
    if isinstance(kind, OptionalKind):
        return _optional(_encoder(kind.inner))
    if isinstance(kind, TupleKind):
        return _tuple(kind, _encoder(kind.item), decoding=False)
    if isinstance(kind, MapKind):
        return _map(kind, decoding=False)
    if isinstance(kind, RecordKind):
        return _enc_record(kind)
    return _enc_union(kind)
