"""Hypothesis strategies for every wire message, generated from the message registry."""

from __future__ import annotations

from typing import Any

from agora.sdk.messages import MESSAGE_TYPES
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
from hypothesis import strategies as st

NAMES = sorted(MESSAGE_TYPES)

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
