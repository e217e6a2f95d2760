"""Properties of agora.sdk.codec, with strategies generated from the message registry.

- Round trip: decode(encode(m, epoch=e)) == Envelope(m, e) for every registered message type.
- Fuzz: random bytes, truncations, bit flips and wrong-typed field values only ever decode or raise
  ProtocolError (never TypeError, KeyError, msgpack errors, RecursionError, ...).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from agora.sdk.codec import Envelope, decode, encode
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import MESSAGE_TYPES, Message
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
)
from agora.sdk.resources import Resources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NAMES = sorted(MESSAGE_TYPES)
FAST = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- strategies from schemas --------------------------------------------------------------------

_SCALARS = st.integers(0, 10**7).map(lambda milli: milli / 1000)
_RANGES = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 1000)).map(
        lambda p: [p[0], min(p[0] + p[1], 2**32 - 1)]
    ),
    max_size=3,
)
_ITEMS = st.lists(st.text("abcxyz-_.0123456789", min_size=1, max_size=6), max_size=3)
RESOURCES = st.fixed_dictionaries(
    {},
    optional={
        "cpus": _SCALARS,
        "mem": st.integers(0, 10**6),
        "gpus": _SCALARS,
        "cpus(batch)": _SCALARS,
        "ports": _RANGES,
        "zones": _ITEMS,
    },
).map(Resources.from_dict)


def strategy(kind: Kind) -> st.SearchStrategy[Any]:
    """Valid values of ``kind``; sizes stay small so every type gets many examples fast."""
    if isinstance(kind, StrKind):
        text = st.text(max_size=min(kind.max_len, 12))
        return text if kind.wrap is None else text.map(kind.wrap)
    if isinstance(kind, IntKind):
        lo, hi = kind.range.lo, kind.range.hi
        return st.integers(
            None if lo is None else int(lo) + (1 if kind.range.lo_open else 0),
            None if hi is None else int(hi),
        )
    if isinstance(kind, FloatKind):
        r = kind.range
        return st.floats(r.lo, r.hi, allow_nan=False, allow_infinity=False, exclude_min=r.lo_open)
    if isinstance(kind, BoolKind):
        return st.booleans()
    if isinstance(kind, BytesKind):
        return st.binary(max_size=min(kind.max_len, 24))
    if isinstance(kind, EnumKind):
        return st.sampled_from(list(kind.enum))
    if isinstance(kind, ResourcesKind):
        return RESOURCES
    if isinstance(kind, OptionalKind):
        return st.none() | strategy(kind.inner)
    if isinstance(kind, TupleKind):
        return st.lists(strategy(kind.item), max_size=min(kind.max_items, 3)).map(tuple)
    if isinstance(kind, MapKind):
        return st.dictionaries(strategy(kind.key), strategy(kind.value), max_size=3)
    if isinstance(kind, RecordKind):
        return st.builds(kind.cls, **{f.name: strategy(f.kind) for f in kind.fields})
    assert isinstance(kind, UnionKind)
    return st.one_of([strategy(v) for v in kind.variants])


MESSAGES = {name: strategy(record_schema(cls)) for name, cls in MESSAGE_TYPES.items()}
ANY_MESSAGE = st.sampled_from(NAMES).flatmap(lambda name: MESSAGES[name])
EPOCHS = st.integers(0, 2**63 - 1)

# Arbitrary msgpack-able values, to put where a field's value belongs.
WIRE_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def _decodes_or_rejects(frame: bytes) -> None:
    try:
        env = decode(frame)
    except ProtocolError as err:
        assert str(err)
        return
    assert isinstance(env, Envelope)
    assert isinstance(env.message, Message)


# ---- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data(), epoch=EPOCHS)
def test_round_trip_every_message_type(name: str, data: st.DataObject, epoch: int) -> None:
    message = data.draw(MESSAGES[name])
    assert decode(encode(message, epoch=epoch)) == Envelope(message, epoch)


# ---- fuzz ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_only_raise_protocol_error(frame: bytes) -> None:
    _decodes_or_rejects(frame)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), WIRE_VALUES, st.integers(-2, 3), st.integers(-2, 2**64 - 1))
def test_random_envelopes_only_raise_protocol_error(
    name: str, body: object, version: int, epoch: int
) -> None:
    _decodes_or_rejects(msgpack.packb([name, version, epoch, body], use_bin_type=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, st.data())
def test_truncated_frames_only_raise_protocol_error(message: Message, data: st.DataObject) -> None:
    frame = encode(message)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        decode(frame[:cut])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, st.data())
def test_bit_flipped_frames_only_raise_protocol_error(
    message: Message, data: st.DataObject
) -> None:
    frame = bytearray(encode(message))
    for bit in data.draw(st.lists(st.integers(0, len(frame) * 8 - 1), min_size=1, max_size=3)):
        frame[bit // 8] ^= 1 << (bit % 8)
    _decodes_or_rejects(bytes(frame))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, WIRE_VALUES, st.data())
def test_wrong_field_values_only_raise_protocol_error(
    message: Message, value: object, data: st.DataObject
) -> None:
    name, version, epoch, body = msgpack.unpackb(encode(message), raw=False)
    # Replace one value somewhere in the body (a field, or an item of an array) with any value.
    target: Any = body
    while True:
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if isinstance(target[key], dict | list) and data.draw(st.booleans()):
            target = target[key]
            continue
        target[key] = value
        break
    _decodes_or_rejects(msgpack.packb([name, version, epoch, body], use_bin_type=True))
