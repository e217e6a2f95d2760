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
from agora.sdk.messages import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import ANY_MESSAGE, EPOCHS, MESSAGES, NAMES

FAST = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

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
