"""The codec's fast path: msgspec decodes a body straight into the message records, in C.

:mod:`agora.sdk.codec` keeps its Python converters as the reference: they name the bad field of
a rejected frame and check what an encoder is handed. This module compiles the same record
schemas into msgspec types (bounds as ``msgspec.Meta``) and decodes valid frames with them;
whatever msgspec rejects goes to the reference decoder, which explains it (or, should the two
ever disagree, decides).

msgspec reads a record's fields from its annotations, so while the decoders are built each
record class carries annotations made from its schema (then gets its own back); msgspec keeps
what it read. Ids (``str`` subclasses), Resources and ACCEPT's operation unions are custom types
that msgspec hands to :func:`_dec_hook`; a Resources value is parsed once per distinct wire form
and then shared (it is immutable), so a frame repeating the same resources does no Python-level
pass over their entries.
"""

from __future__ import annotations

import abc
import functools
import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Final

import msgspec
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
    walk,
)
from agora.sdk.resources import Resources

__all__ = ["ENVELOPE", "PACK", "body_decoder"]

#: Packs what the reference encoder made of a record (plain maps, arrays, str, bytes, numbers).
PACK: Final = msgspec.msgpack.Encoder(enc_hook=lambda v: _plain_str(v)).encode
#: A frame as msgspec sees it first: the body stays raw until its NAME picks the decoder.
ENVELOPE: Final = msgspec.msgpack.Decoder(tuple[str, int, int, msgspec.Raw])

_FLOAT_MAX: Final = sys.float_info.max  # a float bound rejects nan and +-inf as out of range
_CACHED_RESOURCES_BYTES: Final = 512  # wire forms up to this size are parsed once, then shared
_TAG: Final = "type"

# custom types msgspec hands to _dec_hook: id types -> their bound; union markers -> members
_ID_MAX_LEN: dict[type, int] = {}
_UNIONS: dict[type, dict[str, type[Record]]] = {}
_DECODERS: dict[type[Record], msgspec.msgpack.Decoder[Any]] = {}
_BUILDING: Final = threading.Lock()


def body_decoder(cls: type[Record]) -> msgspec.msgpack.Decoder[Any]:
    """The msgspec decoder of ``cls``'s wire map, built on first use."""
    dec = _DECODERS.get(cls)
    if dec is None:
        # one build at a time: two interleaved swaps could leave a class with the wrong annotations
        with _BUILDING, _msgspec_annotations(record_schema(cls)) as records:
            # every record under cls, union members included (_dec_hook decodes those)
            for rec in records:
                _DECODERS[rec] = msgspec.msgpack.Decoder(rec, dec_hook=_dec_hook)
        dec = _DECODERS[cls]
    return dec


# ---- custom types --------------------------------------------------------------------------------


def _plain_str(value: object) -> str:
    if isinstance(value, str):  # an id: msgspec packs only exact str
        return str.__str__(value)
    raise TypeError(f"cannot pack a {type(value).__name__}")


def _dec_hook(tp: type, obj: Any) -> Any:
    n = _ID_MAX_LEN.get(tp)
    if n is not None:  # an id type: a str subclass
        if type(obj) is not str or len(obj) > n:
            raise TypeError("expected an id")
        return tp(obj)
    if tp is Resources:
        if type(obj) is not dict:
            raise TypeError("expected a map")
        key = msgspec.msgpack.encode(obj)
        if len(key) <= _CACHED_RESOURCES_BYTES:
            return _resources(key)
        return Resources.from_dict(obj)
    variants = _UNIONS.get(tp)
    if variants is not None:
        tag = obj.get(_TAG) if type(obj) is dict else None
        cls = variants.get(tag) if type(tag) is str else None
        if cls is None:
            raise TypeError("expected a tagged map")
        return _DECODERS[cls].decode(msgspec.msgpack.encode(obj))
    raise NotImplementedError(f"no wire decoding for {tp!r}")


@functools.lru_cache(maxsize=2048)
def _resources(wire: bytes) -> Resources:
    return Resources.from_dict(msgspec.msgpack.decode(wire))


# ---- schema -> msgspec types ---------------------------------------------------------------------


def _meta_range(r: Range, *, integral: bool) -> msgspec.Meta:
    lo: float = -_FLOAT_MAX if r.lo is None else r.lo
    hi: float = _FLOAT_MAX if r.hi is None else r.hi
    if integral:  # an int field: the same bounds, as ints
        lo = math.floor(lo) if r.lo_open else math.ceil(lo)
        hi = math.floor(hi)
    if r.lo_open:
        return msgspec.Meta(gt=lo, le=hi)
    return msgspec.Meta(ge=lo, le=hi)


def _mtype(kind: Kind, records: dict[type[Record], RecordKind]) -> Any:
    """The msgspec type that accepts what the reference decoder of ``kind`` accepts."""
    if isinstance(kind, StrKind):
        if kind.wrap is None:
            return Annotated[str, msgspec.Meta(max_length=kind.max_len)]
        # the hook checks an id type's shortest bound anywhere: the fast path may refuse an id
        # the reference decoder would take (which then decodes it), never the other way round
        seen = _ID_MAX_LEN.get(kind.wrap, kind.max_len)
        _ID_MAX_LEN[kind.wrap] = min(seen, kind.max_len)
        return kind.wrap
    if isinstance(kind, IntKind):
        return Annotated[int, _meta_range(kind.range, integral=True)]
    if isinstance(kind, FloatKind):
        return Annotated[float, _meta_range(kind.range, integral=False)]
    if isinstance(kind, BoolKind):
        return bool
    if isinstance(kind, BytesKind):
        return Annotated[bytes, msgspec.Meta(max_length=kind.max_len)]
    if isinstance(kind, EnumKind):
        return kind.enum
    if isinstance(kind, ResourcesKind):
        return Resources
    if isinstance(kind, OptionalKind):
        return _mtype(kind.inner, records) | None
    if isinstance(kind, TupleKind):
        item = _mtype(kind.item, records)
        return Annotated[tuple[item, ...], msgspec.Meta(max_length=kind.max_items)]  # type: ignore[valid-type]
    if isinstance(kind, MapKind):
        key = _mtype(kind.key, records)
        value = _mtype(kind.value, records)
        return Annotated[dict[key, value], msgspec.Meta(max_length=kind.max_items)]  # type: ignore[valid-type]
    if isinstance(kind, RecordKind):
        records[kind.cls] = kind
        return kind.cls
    variants = {variant_tag(v.cls): v.cls for v in kind.variants}
    for v in kind.variants:
        records[v.cls] = v
    return _marker(_UNIONS, variants, "Operation")


def _marker(table: dict[type, Any], value: Any, name: str) -> type:
    for marker, known in table.items():
        if known == value:
            return marker
    # msgspec checks that a hook's result is an instance of the type it asked for: an ABC that
    # counts the union's members as its instances.
    marker = abc.ABCMeta(f"_Wire{name}", (), {"__slots__": ()})
    for real in value.values():
        marker.register(real)
    table[marker] = value
    return marker


@contextmanager
def _msgspec_annotations(schema: RecordKind) -> Iterator[list[type[Record]]]:
    """Every record class under ``schema`` annotated with msgspec types while msgspec reads it.

    msgspec caches what it reads of a class in the class (``__msgspec_cache__``): a cache made
    from the plain annotations (which lack the bounds) is dropped first, so msgspec reads ours."""
    records: dict[type[Record], RecordKind] = {}
    for kind in walk(schema):
        if isinstance(kind, RecordKind):
            records[kind.cls] = kind
    saved: list[tuple[type, dict[str, Any]]] = []
    try:
        for cls, rk in list(records.items()):
            kinds = {f.name: f.kind for f in rk.fields}
            for owner in cls.__mro__:
                own = owner.__dict__.get("__annotations__")  # noqa: RUF063 - its own, raw
                if not own or not any(name in kinds for name in own):
                    continue
                saved.append((owner, own))
                new: dict[str, Any] = dict(own)
                for name in own:
                    if name in kinds:
                        new[name] = _mtype(kinds[name], records)
                owner.__annotations__ = new
        for cls in records:
            if "__msgspec_cache__" in cls.__dict__:
                delattr(cls, "__msgspec_cache__")
        yield list(records)
    finally:
        for owner, own in reversed(saved):
            owner.__annotations__ = own
