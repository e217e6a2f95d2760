"""MessagePack framing of ``agora.sdk.messages``.

A frame is the msgpack array ``[name, version, epoch, body]``: the message's NAME and VERSION, the
sender's master epoch (0 when the sender is not a master) and a map of the message's fields. Nested
records are maps, enums their names, bytes msgpack bin, tuples arrays, Resources their ``to_dict()``
form and ACCEPT operations maps with a ``"type"`` key ("LAUNCH", "LAUNCH_GROUP", ...).

Encoders and decoders are compiled per class, on its first use, from the record schemas. Both
directions check types and bounds; :func:`decode` raises only :class:`ProtocolError`, whose message
names the dotted path of the bad value ("SUBSCRIBE.framework_info.roles[2]: expected str, got int").

A frame is decoded by msgspec, in C, straight into the records (:mod:`agora.sdk.codec._fast`, the
same schemas as ``msgspec.Meta`` bounds); one msgspec rejects is decoded again by the Python
converters (:mod:`agora.sdk.codec._ref`, the reference), which name what is wrong. Those run on
msgpack (tuples for arrays, its length limits against hostile headers): the only use of msgpack
left. Encoding likewise runs a
function generated per record class (:mod:`agora.sdk.codec._fast_enc`: checks and map built inline)
and, when that one is unsure, the Python converters, which name a caller's bad field; msgspec packs.

Decoding ignores fields a record does not know, and every field added to a record after its first
release has a default: a peer one version ahead or behind can talk to this one (rolling upgrades).

:func:`pack_record` / :func:`unpack_record` carry any single record (a message or not, e.g. the
agent's checkpoint records) as a bare msgpack map of its fields, with the same checks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgpack
from agora.sdk.codec._fast import ENVELOPE, PACK, body_decoder
from agora.sdk.codec._fast_enc import record_encoder
from agora.sdk.codec._ref import (
    Conv,
    _Bad,
    _clip,
    _dec_record,
    _enc_record,
    _got,
    _oversized,
    _short,
)
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import MESSAGE_TYPES, Message, Record
from agora.sdk.messages._schema import (
    BytesKind,
    MapKind,
    RecordKind,
    StrKind,
    TupleKind,
    record_schema,
    walk,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Envelope",
    "ProtocolError",
    "decode",
    "encode",
    "envelope_head",
    "pack_record",
    "unpack_record",
]

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
PROTOCOL_VERSION: Final = 1
MAX_EPOCH: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded frame: the message and the epoch of the master that sent it (0: not a master)."""

    message: Message
    epoch: int


def encode(message: Message, *, epoch: int = 0) -> bytes:
    """The frame of ``message``; raises :class:`ProtocolError` if it breaks its schema."""
    entry = _ENCODERS.get(type(message)) or _message_codec(type(message))
    if entry is None:
        raise ProtocolError(f"{type(message).__qualname__} is not a registered message")
    name, version, enc, _dec = entry
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


def envelope_head(frame: bytes | bytearray | memoryview) -> tuple[str, int] | None:
    """The name and epoch of the message in ``frame`` (its envelope only: the body is not
    decoded), or None when the frame is not an envelope. For relays, which carry frames without
    reading them."""
    try:
        name, _version, epoch, _raw = ENVELOPE.decode(frame)
    except Exception:  # msgspec's errors, or a type error from a hostile frame
        return None
    return (name, epoch) if isinstance(name, str) and isinstance(epoch, int) else None


def _decode_slowly(frame: bytes | bytearray | memoryview) -> Envelope:
    try:
        obj = msgpack.unpackb(frame, **_frame_limits())
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
    cls = MESSAGE_TYPES.get(name)
    entry = None if cls is None else _message_codec(cls)
    if cls is None or entry is None:
        raise ProtocolError(f"unknown message {_short(name)}")
    dec = entry[3]
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


# Built per message class on its first encode or decode, not at import: a process that speaks a
# handful of messages (an executor, `agora run`) does not pay for the schemas of all of them.
_MESSAGE_CLASSES: Final = frozenset(MESSAGE_TYPES.values())
#: class -> (NAME, VERSION, reference encoder, reference decoder)
_ENCODERS: Final[dict[type, tuple[str, int, Conv, Conv]]] = {}
_BUILDING: Final = threading.Lock()


def _message_codec(cls: type) -> tuple[str, int, Conv, Conv] | None:
    """The reference converters of message class ``cls`` (None: not a registered message)."""
    entry = _ENCODERS.get(cls)
    if entry is None:
        if cls not in _MESSAGE_CLASSES:
            return None
        with _BUILDING:  # one build per class; record_schema's cache is not built concurrently
            entry = _ENCODERS.get(cls)
            if entry is None:
                schema = record_schema(cls)
                entry = (cls.NAME, cls.VERSION, _enc_record(schema), _dec_record(schema))
                _ENCODERS[cls] = entry
    return entry


@functools.cache
def _frame_limits() -> dict[str, Any]:
    """msgpack limits for any frame: from every message's schema (first needed by a frame the
    fast path rejected)."""
    with _BUILDING:
        schemas = [record_schema(cls) for cls in MESSAGE_TYPES.values()]
    return _unpack_limits(schemas)


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
