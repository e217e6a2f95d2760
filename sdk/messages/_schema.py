"""Field schemas of records, derived once from their annotations.

A schema is a small tree of ``Kind`` values (one per field type, with its bounds resolved). The
codec compiles it into per-class encoders and decoders; tests build hypothesis strategies from it.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Iterator, Mapping
from typing import Annotated, TypeAlias, Union, get_args, get_origin, get_type_hints

import msgspec
from agora.sdk.messages._record import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ID_LEN,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_MAP_ITEMS,
    DEFAULT_MAX_STR_LEN,
    MaxItems,
    MaxLen,
    Range,
    Record,
)
from agora.sdk.resources import Resources

__all__ = [
    "ANY_FLOAT",
    "INT_RANGE",
    "BoolKind",
    "BytesKind",
    "EnumKind",
    "FieldSchema",
    "FloatKind",
    "IntKind",
    "Kind",
    "MapKind",
    "OptionalKind",
    "RecordKind",
    "ResourcesKind",
    "StrKind",
    "TupleKind",
    "UnionKind",
    "record_schema",
    "variant_tag",
    "walk",
]

INT_RANGE = Range(-(2**63), 2**63 - 1)  # what msgpack carries as a signed integer
ANY_FLOAT = Range()


class StrKind(msgspec.Struct, frozen=True):
    max_len: int
    wrap: type[str] | None = None  # an agora.sdk.ids type to build on decode


class IntKind(msgspec.Struct, frozen=True):
    range: Range = INT_RANGE


class FloatKind(msgspec.Struct, frozen=True):
    range: Range = ANY_FLOAT


class BoolKind(msgspec.Struct, frozen=True):
    pass


class BytesKind(msgspec.Struct, frozen=True):
    max_len: int


class EnumKind(msgspec.Struct, frozen=True):
    enum: type[enum.Enum]


class ResourcesKind(msgspec.Struct, frozen=True):
    pass


class OptionalKind(msgspec.Struct, frozen=True):
    inner: Kind


class TupleKind(msgspec.Struct, frozen=True):
    item: Kind
    max_items: int


class MapKind(msgspec.Struct, frozen=True):
    key: StrKind
    value: StrKind
    max_items: int


class FieldSchema(msgspec.Struct, frozen=True):
    name: str
    kind: Kind
    required: bool


class RecordKind(msgspec.Struct, frozen=True):
    cls: type[Record]
    fields: tuple[FieldSchema, ...]


class UnionKind(msgspec.Struct, frozen=True):
    """One of several records, told apart on the wire by a "type" key holding the class's TYPE."""

    variants: tuple[RecordKind, ...]


Kind: TypeAlias = (
    StrKind
    | IntKind
    | FloatKind
    | BoolKind
    | BytesKind
    | EnumKind
    | ResourcesKind
    | OptionalKind
    | TupleKind
    | MapKind
    | RecordKind
    | UnionKind
)


def record_schema(cls: type[Record]) -> RecordKind:
    """The schema of a record class (raises TypeError for a field type the wire cannot carry)."""
    cached = _CACHE.get(cls)
    if cached is None:
        cached = _CACHE[cls] = _build(cls)
    return cached


_CACHE: dict[type[Record], RecordKind] = {}


def _build(cls: type[Record]) -> RecordKind:
    hints = get_type_hints(cls, include_extras=True)
    out = []
    for f in msgspec.structs.fields(cls):
        where = f"{cls.__qualname__}.{f.name}"
        out.append(FieldSchema(f.name, _kind(hints[f.name], (), where), f.required))
    return RecordKind(cls, tuple(out))


def walk(kind: Kind) -> Iterator[Kind]:
    """``kind`` and every kind nested in it, depth first."""
    yield kind
    if isinstance(kind, OptionalKind):
        yield from walk(kind.inner)
    elif isinstance(kind, TupleKind):
        yield from walk(kind.item)
    elif isinstance(kind, MapKind):
        yield kind.key
        yield kind.value
    elif isinstance(kind, RecordKind):
        for f in kind.fields:
            yield from walk(f.kind)
    elif isinstance(kind, UnionKind):
        for v in kind.variants:
            yield from walk(v)


def _kind(tp: object, meta: tuple[object, ...], where: str) -> Kind:
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        return _kind(inner, meta + tuple(extra), where)
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        rest = tuple(a for a in args if a is not type(None))
        if len(rest) == 1:
            return OptionalKind(_kind(rest[0], meta, where))
        _no_meta(meta, where)
        union = UnionKind(tuple(_variant(a, where) for a in rest))
        tags = [variant_tag(v.cls) for v in union.variants]
        if len(set(tags)) != len(tags):
            raise TypeError(f"{where}: union members share a TYPE")
        return union if len(rest) == len(args) else OptionalKind(union)
    if origin is tuple:
        args = get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only tuple[X, ...] is supported")
        limit = _take(meta, MaxItems, where)
        return TupleKind(_kind(args[0], (), where), DEFAULT_MAX_ITEMS if limit is None else limit)
    if origin is Mapping or origin is dict:
        key, value = get_args(tp)
        if key is not str or value is not str:
            raise TypeError(f"{where}: only Mapping[str, str] is supported")
        limit = _take(meta, MaxItems, where)
        n = DEFAULT_MAX_MAP_ITEMS if limit is None else limit
        return MapKind(StrKind(DEFAULT_MAX_STR_LEN), StrKind(DEFAULT_MAX_STR_LEN), n)
    if not isinstance(tp, type):
        raise TypeError(f"{where}: unsupported field type {tp!r}")
    if tp is bool:
        _no_meta(meta, where)
        return BoolKind()
    if tp is int:
        return IntKind(_range(meta, where, INT_RANGE))
    if tp is float:
        return FloatKind(_range(meta, where, ANY_FLOAT))
    if issubclass(tp, enum.Enum):
        _no_meta(meta, where)
        if any(m.value != m.name for m in tp):
            raise TypeError(f"{where}: {tp.__name__} values must equal member names")
        return EnumKind(tp)
    if issubclass(tp, str):
        limit = _take(meta, MaxLen, where)
        if tp is str:
            return StrKind(DEFAULT_MAX_STR_LEN if limit is None else limit)
        return StrKind(DEFAULT_MAX_ID_LEN if limit is None else limit, tp)
    if tp is bytes:
        limit = _take(meta, MaxLen, where)
        return BytesKind(DEFAULT_MAX_BYTES if limit is None else limit)
    if tp is Resources:
        _no_meta(meta, where)
        return ResourcesKind()
    if issubclass(tp, Record):
        _no_meta(meta, where)
        return record_schema(tp)
    raise TypeError(f"{where}: unsupported field type {tp.__qualname__}")


def variant_tag(cls: type[Record]) -> str:
    """The wire tag of a union member: its ``TYPE`` ClassVar."""
    tag = getattr(cls, "TYPE", None)
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__qualname__} has no TYPE ClassVar")
    return tag


def _variant(tp: object, where: str) -> RecordKind:
    if not (isinstance(tp, type) and issubclass(tp, Record)):
        raise TypeError(f"{where}: union members must be records, not {tp!r}")
    variant_tag(tp)
    return record_schema(tp)


def _range(meta: tuple[object, ...], where: str, default: Range) -> Range:
    bounds = [m for m in meta if isinstance(m, Range)]
    _no_meta(tuple(m for m in meta if not isinstance(m, Range)), where)
    if len(bounds) > 1:
        raise TypeError(f"{where}: more than one Range")
    return bounds[0] if bounds else default


def _take(
    meta: tuple[object, ...], marker: type[MaxLen] | type[MaxItems], where: str
) -> int | None:
    found = [m for m in meta if isinstance(m, marker)]
    _no_meta(tuple(m for m in meta if not isinstance(m, marker)), where)
    if len(found) > 1:
        raise TypeError(f"{where}: more than one {marker.__name__}")
    return found[0].n if found else None


def _no_meta(meta: tuple[object, ...], where: str) -> None:
    if meta:
        raise TypeError(f"{where}: bound {meta[0]!r} does not apply to this type")
