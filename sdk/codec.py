"""MessagePack framing of ``agora.sdk.messages``.

A frame is the msgpack array ``[name, version, epoch, body]``: the message's NAME and VERSION, the
sender's master epoch (0 when the sender is not a master) and a map of the message's fields. Nested
records are maps, enums their names, bytes msgpack bin, tuples arrays, Resources their ``to_dict()``
form and ACCEPT operations maps with a ``"type"`` key ("LAUNCH", "LAUNCH_GROUP", ...).

Encoders and decoders are compiled per class at import time from the record schemas. Both directions
check types and bounds; :func:`decode` raises only :class:`ProtocolError`, whose message names the
dotted path of the bad value ("SUBSCRIBE.framework_info.roles[2]: expected str, got int").

A frame is decoded by msgspec, in C, straight into the records (:mod:`agora.sdk._codec_fast`, the
same schemas as ``msgspec.Meta`` bounds); one msgspec rejects is decoded again by the Python
converters below, the reference, which name what is wrong. Those run on msgpack (tuples for arrays,
its length limits against hostile headers): the only use of msgpack left. Encoding likewise runs a
function generated per record class (:mod:`agora.sdk._codec_fast_enc`: checks and map built inline)
and, when that one is unsure, the Python converters, which name a caller's bad field; msgspec packs.

Decoding ignores fields a record does not know, and every field added to a record after its first
release has a default: a peer one version ahead or behind can talk to this one (rolling upgrades).

:func:`pack_record` / :func:`unpack_record` carry any single record (a message or not, e.g. the
agent's checkpoint records) as a bare msgpack map of its fields, with the same checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgpack
from agora.sdk._codec_fast import ENVELOPE, PACK, body_decoder
from agora.sdk._codec_fast_enc import record_encoder
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import MESSAGE_TYPES, Message, Range, Record
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
    record_schema,
    variant_tag,
    walk,
)
from agora.sdk.resources import ResourceError, Resources

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Envelope",
    "ProtocolError",
    "decode",
    "encode",
    "pack_record",
    "unpack_record",
]

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
PROTOCOL_VERSION: Final = 1
MAX_EPOCH: Final = 2**63 - 1
_TAG: Final = "type"  # discriminator key of union (operation) maps


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded frame: the message and the epoch of the master that sent it (0: not a master)."""

    message: Message
    epoch: int


def encode(message: Message, *, epoch: int = 0) -> bytes:
    """The frame of ``message``; raises :class:`ProtocolError` if it breaks its schema."""
    entry = _ENCODERS.get(type(message))
    if entry is None:
        raise ProtocolError(f"{type(message).__qualname__} is not a registered message")
    name, version, enc = entry
    if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
        raise ProtocolError(f"{name}: epoch must be an int in [0, 2**63 - 1], got {epoch!r}")
    body = _fast_body(message)
    if body is None:  # the reference encoder names what is wrong (or, if nothing, encodes it)
        try:
            body = enc(message)
        except _Bad as bad:
            raise bad.error(name) from None
    try:
        frame = PACK((name, version, epoch, body))
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a str with lone surrogates
        raise ProtocolError(f"{name}: cannot be packed: {_clip(str(exc))}") from None
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(_oversized(len(frame), MAX_FRAME_BYTES))
    return frame


_FAST_ENCODERS: Final[dict[type, Callable[[Any], dict[str, Any]]]] = {}


def _fast_body(record: Record) -> dict[str, Any] | None:
    """The wire map of ``record`` by its generated encoder, or None when that one is unsure."""
    try:
        fast = _FAST_ENCODERS.get(type(record))
        if fast is None:
            fast = _FAST_ENCODERS[type(record)] = record_encoder(type(record))
        return fast(record)
    except Exception:  # Unsure, or anything a hostile value raised: the reference decides
        return None


def decode(
    frame: bytes | bytearray | memoryview, *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> Envelope:
    """Parse and validate one frame. Raises :class:`ProtocolError`, and nothing else."""
    if isinstance(frame, memoryview):
        size = frame.nbytes
    elif isinstance(frame, bytes | bytearray):
        size = len(frame)
    else:
        raise ProtocolError(f"a frame must be bytes, not {type(frame).__name__}")
    limit = min(max_frame_bytes, MAX_FRAME_BYTES)
    if size > limit:
        raise ProtocolError(_oversized(size, limit))
    try:  # the fast path: msgspec, in C; what it rejects, the reference decoder below explains
        name, version, epoch, raw = ENVELOPE.decode(frame)
        cls = MESSAGE_TYPES[name]
        if 1 <= version <= cls.VERSION and 0 <= epoch <= MAX_EPOCH:
            return Envelope(body_decoder(cls).decode(raw), epoch)
    except Exception:  # any failure: decode again, slowly, to say what is wrong
        pass
    return _decode_slowly(frame)


def _decode_slowly(frame: bytes | bytearray | memoryview) -> Envelope:
    try:
        obj = msgpack.unpackb(frame, **_UNPACK_LIMITS)
    except msgpack.ExtraData as exc:
        raise ProtocolError(f"{len(exc.extra)} trailing bytes after the frame") from None
    except Exception as exc:  # hostile input: any failure of the parser is the sender's fault
        raise ProtocolError(f"malformed msgpack frame: {_clip(str(exc))}") from None
    if type(obj) is not tuple or len(obj) != 4:
        got = f"{len(obj)} items" if type(obj) is tuple else _got(obj)
        raise ProtocolError(f"a frame is an array [name, version, epoch, body], got {got}")
    name, version, epoch, body = obj
    if type(name) is not str:
        raise ProtocolError(f"message name: expected str, got {_got(name)}")
    entry = _DECODERS.get(name)
    if entry is None:
        raise ProtocolError(f"unknown message {_short(name)}")
    cls, dec = entry
    if type(version) is not int:
        raise ProtocolError(f"{name} version: expected int, got {_got(version)}")
    if not 1 <= version <= cls.VERSION:
        raise ProtocolError(f"{name} version {version} is not supported (max {cls.VERSION})")
    if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH:
        raise ProtocolError(f"{name} epoch: expected an int >= 0, got {_short(epoch)}")
    try:
        message = dec(body)
    except _Bad as bad:
        raise bad.error(name) from None
    except Exception as exc:  # a safety net: decoders raise only _Bad by design
        raise ProtocolError(f"{name}: undecodable body ({type(exc).__name__})") from None
    return Envelope(message, epoch)


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


# ---- compiled tables -----------------------------------------------------------------------------


def _unpack_limits(schemas: list[RecordKind]) -> dict[str, Any]:
    """msgpack limits at twice the largest schema bound.

    Hostile lengths fail before any allocation, while a merely over-long value still reaches the
    schema check that names its field.
    """
    kinds = [k for s in schemas for k in walk(s)]
    chars = max([256] + [k.max_len for k in kinds if isinstance(k, StrKind)])
    binary = max([0] + [k.max_len for k in kinds if isinstance(k, BytesKind)])
    items = max([1024] + [k.max_items for k in kinds if isinstance(k, TupleKind)])
    entries = max(
        [1024]  # Resources entries
        + [k.max_items for k in kinds if isinstance(k, MapKind)]
        + [len(k.fields) + 1 for k in kinds if isinstance(k, RecordKind)]
    )
    return {
        "raw": False,
        "use_list": False,
        "strict_map_key": True,
        "max_str_len": 2 * 4 * chars,  # UTF-8 bytes
        "max_bin_len": 2 * binary,
        "max_array_len": 2 * items,
        "max_map_len": 2 * entries,
        "max_ext_len": 0,
    }


_SCHEMAS: Final = {cls: record_schema(cls) for cls in MESSAGE_TYPES.values()}
_DECODERS: Final[dict[str, tuple[type[Message], Conv]]] = {
    cls.NAME: (cls, _dec_record(schema)) for cls, schema in _SCHEMAS.items()
}
_ENCODERS: Final[dict[type, tuple[str, int, Conv]]] = {
    cls: (cls.NAME, cls.VERSION, _enc_record(schema)) for cls, schema in _SCHEMAS.items()
}
_UNPACK_LIMITS: Final = _unpack_limits(list(_SCHEMAS.values()))


# ---- bare records --------------------------------------------------------------------------------

R = TypeVar("R", bound=Record)
_RECORD_CODECS: Final[dict[type, tuple[Conv, Conv, dict[str, Any]]]] = {}


def _record_codec(cls: type[Record]) -> tuple[Conv, Conv, dict[str, Any]]:
    entry = _RECORD_CODECS.get(cls)
    if entry is None:
        schema = record_schema(cls)  # TypeError for a class the wire cannot carry
        entry = (_enc_record(schema), _dec_record(schema), _unpack_limits([schema]))
        _RECORD_CODECS[cls] = entry
    return entry


def pack_record(record: Record) -> bytes:
    """``record`` (any Record class) as a msgpack map of its fields; no name, version or epoch.

    Raises :class:`ProtocolError` if it breaks its schema."""
    name = type(record).__qualname__
    enc, _dec, _limits = _record_codec(type(record))
    body = _fast_body(record)
    if body is None:  # as in encode()
        try:
            body = enc(record)
        except _Bad as bad:
            raise bad.error(name) from None
    try:
        data = PACK(body)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"{name}: cannot be packed: {_clip(str(exc))}") from None
    return data


def unpack_record(cls: type[R], data: bytes | bytearray | memoryview) -> R:
    """The ``cls`` record that :func:`pack_record` made ``data`` from. Raises
    :class:`ProtocolError` (naming the bad field), and nothing else, for bad input."""
    name = cls.__qualname__
    _enc, dec, limits = _record_codec(cls)
    try:  # the fast path, as in decode()
        fast = body_decoder(cls).decode(data)
        if isinstance(fast, cls):
            return fast
    except Exception:  # the reference decoder below says what is wrong
        pass
    try:
        obj = msgpack.unpackb(data, **limits)
    except msgpack.ExtraData as exc:
        raise ProtocolError(f"{name}: {len(exc.extra)} trailing bytes after the record") from None
    except Exception as exc:  # any parser failure is the data's fault
        raise ProtocolError(f"{name}: malformed msgpack: {_clip(str(exc))}") from None
    try:
        record = dec(obj)
    except _Bad as bad:
        raise bad.error(name) from None
    except Exception as exc:  # a safety net, as in decode()
        raise ProtocolError(f"{name}: undecodable record ({type(exc).__name__})") from None
    assert isinstance(record, cls)
    return record
