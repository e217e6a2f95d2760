"""Property tests for agora.sdk.resources."""

from __future__ import annotations

from agora.sdk.resources import ResourceError, Resources
from hypothesis import given, settings
from hypothesis import strategies as st

ROLES = st.sampled_from(["*", "*", "batch", "web", "a.b-c_1"])
# each custom name has one fixed kind so that generated values can always be added
SCALAR_NAMES = st.sampled_from(["cpus", "mem", "disk", "gpus", "licenses"])
RANGE_NAMES = st.sampled_from(["ports", "slots"])
SET_NAMES = st.sampled_from(["zones", "racks"])

MILLI = st.integers(min_value=0, max_value=10**15)
PORT = st.integers(min_value=0, max_value=2**32 - 1)
SMALL_PORT = st.integers(min_value=0, max_value=64)
ITEM = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=["Cs", "Cc", "Z"], exclude_characters=",;{}"
    ),
    min_size=1,
    max_size=8,
).filter(lambda s: s.isprintable() and not any(c.isspace() for c in s))


def _scalar_value(milli: int) -> int | float:
    whole, frac = divmod(milli, 1000)
    return whole if frac == 0 else milli / 1000


@st.composite
def _ranges(draw: st.DrawFn, port: st.SearchStrategy[int]) -> list[list[int]]:
    out = []
    for lo, width in draw(st.lists(st.tuples(port, st.integers(0, 20)), max_size=4)):
        out.append([lo, min(lo + width, 2**32 - 1)])
    return out


@st.composite
def resources(draw: st.DrawFn, small: bool = False) -> Resources:
    d: dict[str, object] = {}
    for name, role, milli in draw(st.lists(st.tuples(SCALAR_NAMES, ROLES, MILLI), max_size=5)):
        d[name if role == "*" else f"{name}({role})"] = _scalar_value(milli)
    port = SMALL_PORT if small else PORT
    for name, role in draw(st.lists(st.tuples(RANGE_NAMES, ROLES), max_size=3)):
        d[name if role == "*" else f"{name}({role})"] = draw(_ranges(port))
    for name, role in draw(st.lists(st.tuples(SET_NAMES, ROLES), max_size=3)):
        d[name if role == "*" else f"{name}({role})"] = draw(st.lists(ITEM, max_size=4))
    return Resources.from_dict(d)


@given(resources())
def test_text_round_trip(r: Resources) -> None:
    text = r.to_text()
    assert Resources.parse(text) == r
    assert Resources.parse(text).to_text() == text


@given(resources())
def test_dict_round_trip(r: Resources) -> None:
    d = r.to_dict()
    assert Resources.from_dict(d) == r
    assert Resources.from_dict(d).to_dict() == d


def _disjoint_from(b: Resources, a: Resources) -> Resources:
    """``b`` with every port/item that ``a`` has under the same key removed."""
    mine = a.to_dict()
    out: dict[str, object] = {}
    for key, value in b.to_dict().items():
        theirs = mine.get(key)
        if isinstance(value, list) and isinstance(theirs, list) and value:
            if isinstance(value[0], str):
                value = sorted(set(value) - set(theirs))
            else:
                taken = {p for lo, hi in theirs for p in range(lo, hi + 1)}
                value = [[p, p] for lo, hi in value for p in range(lo, hi + 1) if p not in taken]
        out[key] = value
    return Resources.from_dict(out)


@given(resources(small=True), resources(small=True))
def test_add_then_subtract_is_identity(a: Resources, b: Resources) -> None:
    # ranges and sets add by union, so the identity needs them disjoint; scalars never do
    b = _disjoint_from(b, a)
    assert (a + b) - b == a
    assert (a + b) - a == b


@given(resources(), resources())
def test_add_then_subtract_scalars_is_identity(a: Resources, b: Resources) -> None:
    scalars = Resources.from_dict(
        {k: v for k, v in b.to_dict().items() if isinstance(v, int | float)}
    )
    assert (a + scalars) - scalars == a


@given(resources(small=True), resources(small=True))
def test_overlapping_union_subtract_keeps_only_the_rest(a: Resources, b: Resources) -> None:
    total = a + b
    rest = total - b
    assert rest + b == total
    assert a.contains(rest)


@given(resources(), resources())
def test_sum_contains_operands(a: Resources, b: Resources) -> None:
    total = a + b
    assert total.contains(a)
    assert total.contains(b)


@given(resources(), resources())
def test_add_commutative(a: Resources, b: Resources) -> None:
    assert a + b == b + a
    assert hash(a + b) == hash(b + a)


@given(resources(), resources(), resources())
def test_add_associative(a: Resources, b: Resources, c: Resources) -> None:
    assert (a + b) + c == a + (b + c)


@given(resources())
def test_contains_reflexive(a: Resources) -> None:
    assert a.contains(a)
    assert a.contains(Resources())
    assert (a - a).is_empty()


@given(resources(small=True), resources(small=True))
def test_contains_antisymmetric(a: Resources, b: Resources) -> None:
    if a.contains(b) and b.contains(a):
        assert a == b
    if a != b:
        assert not (a.contains(b) and b.contains(a))


@given(resources(small=True), resources(small=True), resources(small=True))
def test_contains_transitive(a: Resources, b: Resources, c: Resources) -> None:
    big = a + b + c
    mid = a + b
    assert big.contains(mid) and mid.contains(a)
    assert big.contains(a)
    if a.contains(b) and b.contains(c):
        assert a.contains(c)


@given(resources(small=True), resources(small=True))
def test_subtract_iff_contains(a: Resources, b: Resources) -> None:
    if a.contains(b):
        rest = a - b
        assert rest + b == a
        assert a.contains(rest)
    else:
        try:
            a - b
        except ResourceError:
            pass
        else:
            raise AssertionError("subtracting what is not contained must raise")


def _port_set(r: Resources, name: str) -> set[int]:
    return {p for lo, hi in r.ranges(name) for p in range(lo, hi + 1)}


@given(resources(small=True), resources(small=True))
def test_ranges_match_a_set_model(a: Resources, b: Resources) -> None:
    for name in ("ports", "slots"):
        union = _port_set(a, name) | _port_set(b, name)
        assert _port_set(a + b, name) == union
        ranges = (a + b).ranges(name)
        # sorted, disjoint and not adjacent
        assert all(ranges[i][1] + 1 < ranges[i + 1][0] for i in range(len(ranges) - 1))
        assert all(lo <= hi for lo, hi in ranges)


def _from_ports(ports: set[int]) -> Resources:
    return Resources.from_dict({"ports": [[p, p] for p in ports]})


@given(st.sets(SMALL_PORT, max_size=40), st.sets(SMALL_PORT, max_size=40))
def test_range_subtract_and_contains_match_a_set_model(xs: set[int], ys: set[int]) -> None:
    x, y = _from_ports(xs), _from_ports(ys)
    assert _port_set(x, "ports") == xs
    assert x.contains(y) == (ys <= xs)
    assert _port_set(x - _from_ports(xs & ys), "ports") == xs - ys
    assert _port_set(x + y, "ports") == xs | ys


@given(resources())
def test_roles_partition(r: Resources) -> None:
    rebuilt = r.unreserved()
    for role in r.roles() - {"*"}:
        assert r.reserved(role) == r.filter_role(role)
        assert r.allocatable_to(role) == r.unreserved() + r.reserved(role)
        rebuilt = rebuilt + r.reserved(role)
    assert rebuilt == r
    flat = r.flatten()
    assert flat.roles() <= {"*"}
    assert flat.scalar_totals_milli() == r.scalar_totals_milli()
    for name in r.names():
        assert flat.ranges(name) == r.ranges(name)
        assert flat.set_items(name) == r.set_items(name)


@settings(max_examples=50)
@given(resources(), st.integers(min_value=0, max_value=50))
def test_multiply_is_repeated_addition(r: Resources, n: int) -> None:
    scalars = Resources.from_dict(
        {k: v for k, v in r.to_dict().items() if isinstance(v, int | float)}
    )
    total = Resources()
    for _ in range(n):
        total = total + scalars
    assert scalars * n == total
    assert scalars.contains(scalars * min(n, 1))
