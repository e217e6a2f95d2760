"""The codec's msgspec fast path agrees with its reference decoder.

``decode`` tries msgspec first and hands whatever msgspec rejects to the Python decoder, which
names the bad field; the error tests of test_codec.py cannot tell the two apart. These tests pin
that valid frames really take the fast path (and come out equal, with the declared types), and,
differentially, that the fast path never accepts a frame the reference decoder rejects. Likewise
for encoding: the generated encoders make the reference encoder's map, and refuse what it refuses.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import msgspec
from agora.sdk import codec
from agora.sdk.codec._fast import ENVELOPE, body_decoder
from agora.sdk.codec._fast_enc import record_encoder
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import MESSAGE_TYPES, Message, Offer, Offers, TaskState
from agora.sdk.resources import Resources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import ANY_MESSAGE
from test_codec_props import WIRE_VALUES


def _fast(frame: bytes) -> Message:
    name, _version, _epoch, raw = ENVELOPE.decode(frame)
    message: Message = body_decoder(MESSAGE_TYPES[name]).decode(raw)
    return message


def _same_types(a: object, b: object) -> None:
    """``a`` and ``b`` are equal down to the types of their parts (ids stay ids)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        for x, y in zip(a, b, strict=True):
            _same_types(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            _same_types(getattr(a, name), getattr(b, name))
    else:
        assert a == b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE)
def test_valid_frames_take_the_fast_path(message: Message) -> None:
    _same_types(_fast(codec.encode(message)), message)


# what test_codec_props puts in a body, and values just past the usual bounds
WIRE_JUNK = (
    WIRE_VALUES
    | st.sampled_from([math.nan, math.inf, -math.inf, 2**64 - 1, -(2**63), -1, 0, 65_536])
    | st.text(min_size=250, max_size=300)
    | st.binary(min_size=60, max_size=70)
    | st.lists(st.just("r"), min_size=1020, max_size=1030)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, WIRE_JUNK, st.data())
def test_the_fast_path_accepts_nothing_the_reference_rejects(
    message: Message, value: object, data: st.DataObject
) -> None:
    name, version, epoch, body = msgpack.unpackb(codec.encode(message), raw=False)
    target: Any = body
    while True:  # replace one value somewhere in the body, as test_codec_props does
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        if isinstance(target[key], dict | list) and data.draw(st.booleans()):
            target = target[key]
            continue
        target[key] = value
        break
    frame = msgpack.packb([name, version, epoch, body], use_bin_type=True)
    try:
        fast = _fast(frame)
    except Exception:
        return  # the reference decoder explains it (test_codec_props: only ProtocolError)
    try:
        reference = codec._decode_slowly(frame).message
    except ProtocolError as err:
        raise AssertionError(f"fast path accepted what the reference rejects: {err}") from None
    _same_types(fast, reference)


# ---- the generated encoder ----------------------------------------------------------------------


def _reference_body(message: Message) -> dict[str, Any] | None:
    """What the reference encoder makes of ``message``; None when it rejects it."""
    entry = codec._message_codec(type(message))
    assert entry is not None
    _name, _version, enc, _dec = entry
    try:
        body: dict[str, Any] = enc(message)
    except codec._Bad:
        return None
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE)
def test_the_generated_encoder_makes_the_reference_map(message: Message) -> None:
    fast = record_encoder(type(message))(message)
    assert fast == _reference_body(message)


JUNK = (
    WIRE_JUNK
    | st.sampled_from([TaskState.RUNNING, Resources.parse("cpus:1"), 2**64])
    | st.builds(list, st.lists(st.text(max_size=3), max_size=2))
    | st.dictionaries(st.integers(), st.text(max_size=2), min_size=1, max_size=2)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_MESSAGE, JUNK, st.data())
def test_the_generated_encoder_accepts_nothing_the_reference_rejects(
    message: Message, junk: object, data: st.DataObject
) -> None:
    names = [f.name for f in msgspec.structs.fields(message)]
    if not names:
        return
    # Structs do not check types when built: replace() makes the junk record directly.
    name = data.draw(st.sampled_from(names))
    inner = getattr(message, name)
    if isinstance(inner, msgspec.Struct) and data.draw(st.booleans()):  # one level down
        inner_names = [f.name for f in msgspec.structs.fields(inner)]
        if inner_names:
            inner_name = data.draw(st.sampled_from(inner_names))
            junk = msgspec.structs.replace(inner, **{inner_name: junk})
    bad = msgspec.structs.replace(message, **{name: junk})
    try:
        fast = record_encoder(type(bad))(bad)
    except Exception:
        return  # unsure: the reference decides (and test_codec pins its messages)
    assert fast == _reference_body(bad), "the generated encoder took what the reference refuses"


def test_repeated_resources_are_parsed_once_and_shared() -> None:
    res = Resources.parse("cpus:8;mem:16384;ports:[31000-32000]")
    offers = Offers(
        offers=tuple(
            Offer(
                offer_id=OfferID(f"o{i}"),
                framework_id=FrameworkID("f"),
                agent_id=AgentID(f"a{i}"),
                hostname="h",
                role="*",
                resources=res,
            )
            for i in range(3)
        )
    )
    got = codec.decode(codec.encode(offers)).message
    assert isinstance(got, Offers)
    first = got.offers[0].resources
    assert first == res
    assert all(o.resources is first for o in got.offers)
