"""The codec's fast encoder: one function per record class, generated from its schema.

Each generated function reads a record's fields, checks them against the schema's types and
bounds inline (no call per field) and builds the wire map that :func:`agora.sdk.codec.encode`
packs. It does not explain anything: on any doubt it raises, and the codec's reference encoder
(the Python converters, which name the bad field) decides. Both accept exactly the same records and
produce the same maps; tests/unit/test_codec_fast.py holds them to it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from agora.sdk.messages._record import Range, Record
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
    record_schema,
    variant_tag,
)
from agora.sdk.resources import Resources

__all__ = ["Unsure", "record_encoder"]

Encoder = Callable[[Any], dict[str, Any]]
_FLOAT_MAX: Final = sys.float_info.max
_TAG: Final = "type"


class Unsure(Exception):
    """The fast encoder does not vouch for this value: let the reference encoder decide."""


_ENCODERS: dict[tuple[type[Record], str | None], Encoder] = {}


def record_encoder(cls: type[Record]) -> Encoder:
    """The generated encoder of ``cls``: record -> wire map; raises on anything it doubts."""
    return _record(record_schema(cls), None)


def _record(kind: RecordKind, tag: str | None) -> Encoder:
    key = (kind.cls, tag)
    enc = _ENCODERS.get(key)
    if enc is None:
        gen = _Gen()
        cls = gen.const(kind.cls)
        body = [f"if type(v) is not {cls}: raise UNSURE"]
        items = [] if tag is None else [f"{_TAG!r}: {tag!r}"]
        for f in kind.fields:
            x = gen.var()
            body.append(f"{x} = v.{f.name}")
            items.append(f"{f.name!r}: {gen.value(f.kind, x, body)}")
        body.append("return {" + ", ".join(items) + "}")
        enc = gen.function(f"encode_{kind.cls.__name__}", body)
        _ENCODERS[key] = enc
    return enc


class _Gen:
    """Source lines and the constants they name, for one generated function."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {"UNSURE": Unsure, "str_of": str.__str__}
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"x{self.n}"

    def const(self, value: object) -> str:
        for name, known in self.ns.items():
            if known is value:
                return name
        self.n += 1
        name = f"c{self.n}"
        self.ns[name] = value
        return name

    def function(self, name: str, body: list[str]) -> Encoder:
        src = f"def {name}(v):\n" + "".join(f"    {line}\n" for line in body)
        exec(compile(src, f"<agora wire encoder {name}>", "exec"), self.ns)
        fn: Encoder = self.ns[name]
        return fn

    def value(self, kind: Kind, x: str, out: list[str]) -> str:
        """Append to ``out`` the checks of ``x`` (a local); return the expression of its value."""
        if isinstance(kind, StrKind):
            out.append(f"if not isinstance({x}, str) or len({x}) > {kind.max_len}: raise UNSURE")
            return f"({x} if type({x}) is str else str_of({x}))"
        if isinstance(kind, IntKind):
            out.append(f"if type({x}) is not int: raise UNSURE")
            out.append(_in_range(self, kind.range, x, integral=True))
            return x
        if isinstance(kind, FloatKind):
            out.append(f"if type({x}) is not float:")
            out.append(f"    if type({x}) is not int: raise UNSURE")
            out.append(f"    {x} = float({x})")
            out.append(_in_range(self, kind.range, x, integral=False))
            return x
        if isinstance(kind, BoolKind):
            out.append(f"if type({x}) is not bool: raise UNSURE")
            return x
        if isinstance(kind, BytesKind):
            out.append(f"if type({x}) is not bytes or len({x}) > {kind.max_len}: raise UNSURE")
            return x
        if isinstance(kind, EnumKind):
            out.append(f"if type({x}) is not {self.const(kind.enum)}: raise UNSURE")
            return f"{x}.value"
        if isinstance(kind, ResourcesKind):
            out.append(f"if not isinstance({x}, {self.const(Resources)}): raise UNSURE")
            return f"{x}.json_view()"
        if isinstance(kind, OptionalKind):
            inner: list[str] = []
            expr = self.value(kind.inner, x, inner)
            out.append(f"if {x} is not None:")
            out.extend(f"    {line}" for line in [*inner, f"{x} = {expr}"])
            return x
        if isinstance(kind, TupleKind):
            out.append(f"if type({x}) is not tuple or len({x}) > {kind.max_items}: raise UNSURE")
            return f"[{self.item(kind.item)}(i) for i in {x}]"
        if isinstance(kind, MapKind):
            check = self.const(_map_checker(kind))
            return f"{check}({x})"
        if isinstance(kind, RecordKind):
            return f"{self.const(_record(kind, None))}({x})"
        by_type = {v.cls: _record(v, variant_tag(v.cls)) for v in kind.variants}
        return f"{self.const(by_type)}[type({x})]({x})"

    def item(self, kind: Kind) -> str:
        """The name of a function converting one value of ``kind``."""
        if isinstance(kind, RecordKind):
            return self.const(_record(kind, None))
        sub = _Gen()
        body: list[str] = []
        body.append(f"return {sub.value(kind, 'v', body)}")
        return self.const(sub.function("item", body))


def _in_range(gen: _Gen, r: Range, x: str, *, integral: bool) -> str:
    lo = r.lo if r.lo is not None else (-(2**63) if integral else -_FLOAT_MAX)
    hi = r.hi if r.hi is not None else (2**64 if integral else _FLOAT_MAX)
    lo_c, hi_c = gen.const(lo), gen.const(hi)
    low = f"{x} > {lo_c}" if r.lo_open else f"{x} >= {lo_c}"
    # comparisons are False for nan, and the bounds are finite: this also rejects nan and inf
    return f"if not ({low} and {x} <= {hi_c}): raise UNSURE"


def _map_checker(kind: MapKind) -> Callable[[Any], dict[str, str]]:
    n, kn, vn = kind.max_items, kind.key.max_len, kind.value.max_len

    def check(m: Any) -> dict[str, str]:
        if type(m) is not dict and not isinstance(m, Mapping):
            raise Unsure
        out: dict[str, str] = m if type(m) is dict else dict(m)
        if len(out) > n:
            raise Unsure
        for k, v in out.items():
            if not isinstance(k, str) or len(k) > kn or not isinstance(v, str) or len(v) > vn:
                raise Unsure
        return out

    return check
