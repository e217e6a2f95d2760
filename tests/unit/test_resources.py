"""Unit tests for agora.sdk.resources."""

from __future__ import annotations

import copy
import pickle

import pytest
from agora.sdk.resources import UNRESERVED, ResourceError, Resources

R = Resources.parse

TYPICAL = "cpus:16;mem:65536;disk:1048576;ports:[31000-32000]"


# --------------------------------------------------------------------------- parsing


def test_parse_every_kind_and_role() -> None:
    r = R("cpus:4;mem:4096;ports:[31000-32000,32005-32010];zones:{a,b};cpus(batch):2")
    assert r.scalar("cpus") == 6.0
    assert r.filter_role(UNRESERVED).scalar("cpus") == 4.0
    assert r.reserved("batch").scalar("cpus") == 2.0
    assert r.scalar("mem") == 4096.0
    assert r.ranges("ports") == ((31000, 32000), (32005, 32010))
    assert r.set_items("zones") == frozenset({"a", "b"})
    assert r.names() == frozenset({"cpus", "mem", "ports", "zones"})
    assert r.roles() == frozenset({"*", "batch"})


def test_parse_empty_and_blank_text_is_empty() -> None:
    for text in ("", "   ", ";", " ; ;; "):
        r = R(text)
        assert r.is_empty()
        assert not r
        assert r == Resources()
        assert r.to_text() == ""


def test_parse_whitespace_around_tokens() -> None:
    spaced = R(" cpus ( batch ) : 4 ; ports : [ 1 - 3 , 10 - 12 ] ; zones : { a , b } ; ")
    assert spaced == R("cpus(batch):4;ports:[1-3,10-12];zones:{a,b}")


def test_parse_zero_scalar_is_dropped() -> None:
    assert R("cpus:0").is_empty()
    assert R("cpus:0.0;mem:1") == R("mem:1")
    assert R("cpus:0.0001") == Resources()  # rounds to zero thousandths


def test_parse_empty_ranges_and_sets_are_dropped() -> None:
    assert R("ports:[]").is_empty()
    assert R("zones:{ }").is_empty()


def test_parse_duplicates_sum_and_union() -> None:
    r = R("cpus:1;cpus:2.5;ports:[1-5];ports:[4-9];zones:{a};zones:{b}")
    assert r == R("cpus:3.5;ports:[1-9];zones:{a,b}")


def test_parse_ranges_normalized() -> None:
    assert R("ports:[4-5,1-3]").ranges("ports") == ((1, 5),)
    assert R("ports:[10-20,1-2,15-30,32-32]").ranges("ports") == ((1, 2), (10, 30), (32, 32))
    assert R("ports:[0-4294967295]").ranges("ports") == ((0, 2**32 - 1),)


def test_parse_rounds_half_even_to_thousandths() -> None:
    assert R("cpus:0.0005").scalar_milli("cpus") == 0
    assert R("cpus:0.0015").scalar_milli("cpus") == 2
    assert R("cpus:0.0025").scalar_milli("cpus") == 2
    assert R("cpus:0.00251").scalar_milli("cpus") == 3
    assert R("cpus:1.2344999").scalar_milli("cpus") == 1234
    assert R("cpus:7").scalar_milli("cpus") == 7000


@pytest.mark.parametrize(
    ("text", "fragment", "position"),
    [
        ("cpus:x4", "bad scalar value 'x4' for 'cpus'", 5),
        ("cpus:4;mem:-1", "bad scalar value '-1' for 'mem'", 11),
        ("cpus:1.2.3", "bad scalar value '1.2.3' for 'cpus'", 5),
        ("cpus:", "bad scalar value '' for 'cpus'", 5),
        ("cpus:nan", "bad scalar value 'nan' for 'cpus'", 5),
        ("cpus:1e3", "bad scalar value '1e3' for 'cpus'", 5),
        ("cpus:1000000000000.001", "is above", 5),
        ("cpus:4;#x:1", "bad resource name '#x'", 7),
        ("cpus 4", "expected ':' after 'cpus'", 5),
        ("cpus", "expected ':' after 'cpus'", 4),
        ("cpus(.):1", "bad role '.'", 5),
        ("cpus(..):1", "bad role '..'", 5),
        ("cpus( a b ):1", "bad role 'a b'", 6),
        ("cpus():1", "bad role ''", 5),
        ("cpus(*x):1", "bad role '*x'", 5),
        ("cpus(batch:1", "unterminated role for 'cpus'", 4),
        ("cpus:1 mem:2", "bad scalar value '1 mem:2' for 'cpus'", 5),
        ("ports:[1-2];ports:[5-3]", "bad range '5-3' for 'ports'", 19),
        ("ports:[1-2,x-3]", "bad range 'x-3' for 'ports'", 11),
        ("ports:[1-2, 7]", "bad range '7' for 'ports'", 12),
        ("ports:[-1-2]", "bad range '-1-2' for 'ports'", 7),
        ("ports:[0-4294967296]", "bad range '0-4294967296' for 'ports'", 7),
        ("ports:[1-2", "unterminated '[' for 'ports'", 6),
        ("zones:{a,b", "unterminated '{' for 'zones'", 6),
        ("zones:{a,,b}", "bad set item '' for 'zones'", 9),
        ("ports:[1-2] x", "expected ';' but found 'x'", 12),
        ("cpus:[1-2]", "resource 'cpus' must be scalar, got ranges", 5),
        ("ports:7", "resource 'ports' must be ranges, got scalar", 6),
        ("mem:{a}", "resource 'mem' must be scalar, got set", 4),
        ("x:1;x(r):[1-2]", "resource 'x' is both scalar and ranges", 9),
        ("x:{a};x:[1-2]", "resource 'x' is both set and ranges", 8),
    ],
)
def test_parse_errors_name_token_and_position(text: str, fragment: str, position: int) -> None:
    with pytest.raises(ResourceError) as info:
        R(text)
    assert info.value.position == position
    assert fragment in str(info.value)
    assert str(info.value).endswith(f"at position {position}")
    assert isinstance(info.value, ValueError)


def test_parse_error_example_from_contract() -> None:
    with pytest.raises(ResourceError, match=r"^bad scalar value 'x4' for 'cpus' at position 5$"):
        R("cpus:x4")


def test_parse_bounds() -> None:
    many = ";".join(f"r{i}:1" for i in range(1024))
    assert len(R(many).names()) == 1024
    with pytest.raises(ResourceError, match="too many entries") as info:
        R(many + ";extra:1")
    assert info.value.position == len(many) + 1

    long_name = "n" * 65
    with pytest.raises(ResourceError, match="longer than 64") as info:
        R(f"{long_name}:1")
    assert info.value.position == 0
    assert R(f"{'n' * 64}:1").scalar("n" * 64) == 1.0

    with pytest.raises(ResourceError, match="bad role"):
        R(f"cpus({'r' * 65}):1")

    with pytest.raises(ResourceError, match="bad set item"):
        R("zones:{" + "z" * 257 + "}")
    assert R("zones:{" + "z" * 256 + "}").set_items("zones") == frozenset({"z" * 256})

    ranges = ",".join(f"{2 * i}-{2 * i}" for i in range(1024))
    assert len(R(f"ports:[{ranges}]").ranges("ports")) == 1024
    with pytest.raises(ResourceError, match="too many ranges for 'ports'"):
        R(f"ports:[{ranges},5000-5000]")
    with pytest.raises(ResourceError, match="too many ranges for 'ports'"):
        R(f"ports:[{ranges}];ports(r):[9000-9000]")

    with pytest.raises(ResourceError, match="bad scalar value"):
        R("cpus:1." + "0" * 100)


def test_parse_rejects_non_str() -> None:
    with pytest.raises(ResourceError, match="must be a str"):
        Resources.parse(b"cpus:1")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- text / dict


def test_to_text_canonical_and_sorted() -> None:
    r = R("zones:{b,a};mem(z):1;cpus(batch):2;cpus:4.50;ports:[5-6,1-2]")
    assert r.to_text() == "cpus:4.5;cpus(batch):2;mem(z):1;ports:[1-2,5-6];zones:{a,b}"
    assert str(r) == r.to_text()
    assert R(r.to_text()) == r
    assert repr(r) == f"Resources.parse({r.to_text()!r})"


def test_to_text_scalar_formats() -> None:
    assert R("cpus:0.001").to_text() == "cpus:0.001"
    assert R("cpus:0.10").to_text() == "cpus:0.1"
    assert R("cpus:1000000000000").to_text() == "cpus:1000000000000"
    assert R("cpus:999999999999.999").to_text() == "cpus:999999999999.999"


def test_dict_round_trip_and_types() -> None:
    d: dict[str, object] = {
        "cpus": 4,
        "mem": 4096.5,
        "ports": [[31000, 32000]],
        "zones": ["b", "a"],
        "cpus(batch)": 2,
    }
    r = Resources.from_dict(d)
    assert r == R("cpus:4;mem:4096.5;ports:[31000-32000];zones:{a,b};cpus(batch):2")
    out = r.to_dict()
    assert out == {
        "cpus": 4,
        "cpus(batch)": 2,
        "mem": 4096.5,
        "ports": [[31000, 32000]],
        "zones": ["a", "b"],
    }
    assert type(out["cpus"]) is int
    assert type(out["mem"]) is float
    assert Resources.from_dict(out) == r


def test_from_dict_accepts_tuples_and_whole_floats() -> None:
    r = Resources.from_dict({"ports": ((1, 2), (3, 4)), "cpus": 2.0, "z": ("a",)})
    assert r == R("ports:[1-4];cpus:2;z:{a}")
    assert r.to_dict()["cpus"] == 2 and type(r.to_dict()["cpus"]) is int


def test_from_dict_float_rounding_uses_decimal_form() -> None:
    assert Resources.from_dict({"cpus": 0.1}).scalar_milli("cpus") == 100
    assert Resources.from_dict({"cpus": 0.0025}).scalar_milli("cpus") == 2
    assert Resources.from_dict({"cpus": 0.0035}).scalar_milli("cpus") == 4
    assert Resources.from_dict({"cpus": 1e-05}).is_empty()
    assert Resources.from_dict({"cpus": 1.5e3}).scalar_milli("cpus") == 1_500_000
    assert Resources.from_dict({"cpus": -0.0}).is_empty()


@pytest.mark.parametrize(
    ("d", "fragment"),
    [
        ({"cpus": True}, "'cpus'"),
        ({"cpus": "4"}, "'cpus'"),
        ({"cpus": None}, "'cpus'"),
        ({"cpus": -1}, "'cpus'"),
        ({"cpus": -0.5}, "'cpus'"),
        ({"cpus": float("nan")}, "'cpus'"),
        ({"cpus": float("inf")}, "'cpus'"),
        ({"cpus": 10**12 + 1}, "'cpus'"),
        ({"cpus": []}, "'cpus'"),
        ({"cpus(.)": 1}, "'cpus(.)'"),
        ({"cpus(a b)": 1}, "'cpus(a b)'"),
        ({"cpus(": 1}, "'cpus('"),
        ({"": 1}, "''"),
        ({3: 1}, "3"),
        ({"ports": [[2, 1]]}, "'ports'"),
        ({"ports": [[-1, 1]]}, "'ports'"),
        ({"ports": [[0, 2**32]]}, "'ports'"),
        ({"ports": [[1, 2, 3]]}, "'ports'"),
        ({"ports": [[True, 2]]}, "'ports'"),
        ({"ports": [[1.0, 2]]}, "'ports'"),
        ({"ports": [1, 2]}, "'ports'"),
        ({"ports": ["a"]}, "'ports'"),
        ({"ports": 5}, "'ports'"),
        ({"zones": ["a", 1]}, "'zones'"),
        ({"zones": ["a b"]}, "'zones'"),
        ({"zones": [""]}, "'zones'"),
        ({"zones": {1, 2}}, "'zones'"),
        ({"zones": {"a": 1}}, "'zones'"),
        ({"x": 1, "x(r)": [[1, 2]]}, "'x'"),
        ({"n" * 65: 1}, "longer than 64"),
    ],
)
def test_from_dict_errors_name_the_key(d: dict[object, object], fragment: str) -> None:
    with pytest.raises(ResourceError) as info:
        Resources.from_dict(d)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert info.value.position is None


def test_from_dict_bounds_and_type() -> None:
    with pytest.raises(ResourceError, match="too many entries"):
        Resources.from_dict({f"r{i}": 1 for i in range(1025)})
    with pytest.raises(ResourceError, match="mapping"):
        Resources.from_dict([("cpus", 1)])  # type: ignore[arg-type]
    with pytest.raises(ResourceError, match="too many ranges"):
        Resources.from_dict({"ports": [[2 * i, 2 * i] for i in range(1025)]})


def test_scalars_constructor() -> None:
    assert Resources.scalars(cpus=1, mem=128) == R("cpus:1;mem:128")
    assert Resources.scalars("batch", cpus=0.5) == R("cpus(batch):0.5")
    assert Resources.scalars(cpus=0) == Resources()
    with pytest.raises(ResourceError, match="bad role"):
        Resources.scalars("..", cpus=1)
    with pytest.raises(ResourceError, match="'cpus'"):
        Resources.scalars(cpus=-1)
    with pytest.raises(ResourceError, match="'ports'"):
        Resources.scalars(ports=1)
    with pytest.raises(ResourceError, match="'cpus'"):
        Resources.scalars(cpus=True)


# --------------------------------------------------------------------------- arithmetic


def test_fixed_point_has_no_drift() -> None:
    tenth = R("cpus:0.1")
    total = Resources()
    for _ in range(10):
        total = total + tenth
    assert total == R("cpus:1")
    assert total.scalar("cpus") == 1.0
    assert R("cpus:0.1") + R("cpus:0.2") == R("cpus:0.3")
    assert tenth * 3 == R("cpus:0.3")
    for _ in range(10):
        total = total - tenth
    assert total.is_empty()


def test_add() -> None:
    a = R("cpus:1;ports:[1-5];zones:{a}")
    b = R("cpus:2;mem:3;ports:[6-9,20-21];zones:{b};cpus(r):1")
    assert a + b == R("cpus:3;mem:3;ports:[1-9,20-21];zones:{a,b};cpus(r):1")
    assert a + Resources() == a
    assert Resources() + a == a
    assert a == R("cpus:1;ports:[1-5];zones:{a}")  # operands untouched


def test_add_rejects_kind_clash() -> None:
    with pytest.raises(ResourceError, match="'x' is both"):
        R("x:1") + R("x:[1-2]")
    with pytest.raises(ResourceError, match="'x' is both"):
        R("x(a):{q}") + R("y:1;x(b):3")
    # once x is gone, it may come back with another kind
    assert (R("x:1") - R("x:1")) + R("x:{a}") == R("x:{a}")
    assert R("x:1;y:2").filter_role("r") + R("x:[1-2]") == R("x:[1-2]")


def test_add_wrong_type() -> None:
    with pytest.raises(TypeError):
        R("cpus:1") + 1  # type: ignore[operator]


def test_subtract() -> None:
    a = R("cpus:4;mem:10;ports:[1-10];zones:{a,b};cpus(r):2")
    assert a - R("cpus:1.5;ports:[3-4];zones:{a}") == R(
        "cpus:2.5;mem:10;ports:[1-2,5-10];zones:{b};cpus(r):2"
    )
    assert a - a == Resources()
    assert (a - a).is_empty()
    assert a - Resources() == a
    assert a - R("ports:[1-10]") == R("cpus:4;mem:10;zones:{a,b};cpus(r):2")
    assert a == R("cpus:4;mem:10;ports:[1-10];zones:{a,b};cpus(r):2")


@pytest.mark.parametrize(
    "other",
    [
        "cpus:4.001",
        "gpus:1",
        "cpus(q):1",
        "cpus(r):3",
        "ports:[0-1]",
        "ports:[10-11]",
        "ports(r):[1-1]",
        "zones:{c}",
        "zones(r):{a}",
        "x:1",
    ],
)
def test_subtract_not_contained_raises(other: str) -> None:
    a = R("cpus:4;mem:10;ports:[1-10];zones:{a,b};cpus(r):2")
    assert not a.contains(R(other))
    with pytest.raises(ResourceError, match="not contained"):
        a - R(other)


def test_never_negative() -> None:
    with pytest.raises(ResourceError):
        R("cpus:1") - R("cpus:1.001")
    with pytest.raises(ResourceError):
        Resources() - R("cpus:0.001")
    for v in (R("cpus:1") - R("cpus:0.999")).to_dict().values():
        assert isinstance(v, float) and v > 0


def test_contains() -> None:
    a = R(TYPICAL)
    assert a.contains(a)
    assert a.contains(Resources())
    assert Resources().contains(Resources())
    assert not Resources().contains(a)
    assert a.contains(R("cpus:16;ports:[31000-31000,31500-32000]"))
    assert not a.contains(R("ports:[30999-31000]"))
    assert not a.contains(R("cpus:16.001"))
    assert not R("cpus(r):4").contains(R("cpus:1"))  # roles are distinct
    assert R("ports:[1-3,4-6]").contains(R("ports:[2-5]"))  # adjacency was merged


def test_multiply() -> None:
    shape = R("cpus:0.5;mem:128;cpus(r):1")
    assert shape * 4 == R("cpus:2;mem:512;cpus(r):4")
    assert 4 * shape == shape * 4
    assert shape * 1 == shape
    assert (shape * 0).is_empty()
    ports = R("cpus:1;ports:[1-2]")
    assert ports * 1 == ports
    assert (ports * 0).is_empty()
    with pytest.raises(ResourceError, match="cannot multiply"):
        ports * 2
    with pytest.raises(ResourceError, match="cannot multiply"):
        R("z:{a}") * 3
    with pytest.raises(ResourceError, match="negative"):
        shape * -1
    with pytest.raises(TypeError):
        shape * 1.5  # type: ignore[operator]
    with pytest.raises(TypeError):
        shape * True


# --------------------------------------------------------------------------- value semantics


def test_equality_and_hash() -> None:
    a = R("cpus:1;ports:[1-2,3-4];zones:{a,b}")
    b = Resources.from_dict({"zones": ["b", "a"], "ports": [[1, 4]], "cpus": 1.0})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, R("cpus:1")}) == 2
    assert a != R("cpus:1")
    assert a != "cpus:1;ports:[1-4];zones:{a,b}"
    assert R("cpus:1") != R("cpus(r):1")


def test_immutable() -> None:
    a = R("cpus:1")
    with pytest.raises(AttributeError):
        a._s = {}
    with pytest.raises(AttributeError):
        a.anything = 1
    with pytest.raises(AttributeError):
        del a._s
    assert a == R("cpus:1")


def test_pickle_and_copy() -> None:
    a = R("cpus:1;x:2;ports:[1-2];zones:{a}")
    b = pickle.loads(pickle.dumps(a))
    assert b == a and hash(b) == hash(a)
    with pytest.raises(ResourceError):
        b + R("x:{q}")  # kind information survives
    assert copy.copy(a) is a
    assert copy.deepcopy(a) is a


# --------------------------------------------------------------------------- roles


ROLED = R("cpus:4;mem:8;cpus(batch):2;ports(batch):[1-5];zones(web):{a};mem(web):1")


def test_roles() -> None:
    assert ROLED.roles() == frozenset({"*", "batch", "web"})
    assert Resources().roles() == frozenset()
    assert R("cpus(a):1").roles() == frozenset({"a"})


def test_reserved_unreserved() -> None:
    assert ROLED.reserved("batch") == R("cpus(batch):2;ports(batch):[1-5]")
    assert ROLED.reserved("web") == R("zones(web):{a};mem(web):1")
    assert ROLED.reserved("nobody").is_empty()
    assert ROLED.reserved(UNRESERVED).is_empty()
    assert ROLED.unreserved() == R("cpus:4;mem:8")
    assert ROLED.unreserved() + ROLED.reserved("batch") + ROLED.reserved("web") == ROLED


def test_allocatable_to_and_filter_role() -> None:
    assert ROLED.allocatable_to("batch") == R("cpus:4;mem:8;cpus(batch):2;ports(batch):[1-5]")
    assert ROLED.allocatable_to(UNRESERVED) == ROLED.unreserved()
    assert ROLED.allocatable_to("other") == ROLED.unreserved()
    assert ROLED.filter_role("web") == ROLED.reserved("web")
    assert ROLED.filter_role(UNRESERVED) == ROLED.unreserved()


def test_named_keeps_one_kind_in_every_role() -> None:
    assert ROLED.named("cpus") == R("cpus:4;cpus(batch):2")
    assert ROLED.named("ports") == R("ports(batch):[1-5]")
    assert ROLED.named("gpus") == Resources()


def test_flatten() -> None:
    flat = ROLED.flatten()
    assert flat == R("cpus:6;mem:9;ports:[1-5];zones:{a}")
    assert flat.roles() == frozenset({"*"})
    assert ROLED.flatten("q") == R("cpus(q):6;mem(q):9;ports(q):[1-5];zones(q):{a}")
    merged = R("ports:[1-2];ports(a):[3-4];z:{x};z(a):{y}").flatten()
    assert merged == R("ports:[1-4];z:{x,y}")
    with pytest.raises(ResourceError, match="bad role"):
        ROLED.flatten("..")


# --------------------------------------------------------------------------- reading


def test_reading() -> None:
    r = R("cpus:1.5;cpus(a):0.25;ports:[10-20];ports(a):[21-25,1-2];z:{x};z(a):{y}")
    assert r.scalar("cpus") == 1.75
    assert r.scalar_milli("cpus") == 1750
    assert r.scalar("gpus") == 0.0
    assert r.scalar_milli("gpus") == 0
    assert r.scalar_totals_milli() == {"cpus": 1750}
    assert r.ranges("ports") == ((1, 2), (10, 25))
    assert r.ranges("nope") == ()
    assert R("ports(a):[5-6]").ranges("ports") == ((5, 6),)
    assert r.set_items("z") == frozenset({"x", "y"})
    assert r.set_items("nope") == frozenset()
    assert r.names() == frozenset({"cpus", "ports", "z"})
    totals = r.scalar_totals_milli()
    totals["cpus"] = 0
    assert r.scalar_totals_milli() == {"cpus": 1750}  # a fresh dict each time


def test_the_scalar_totals_view_is_made_once_and_matches_the_totals() -> None:
    r = R("cpus:1.5;cpus(a):0.25;mem:64;ports:[10-20]")
    view = r.scalar_totals_view()
    assert view == r.scalar_totals_milli() == {"cpus": 1750, "mem": 64000}
    assert r.scalar_totals_view() is view  # shared by every reader of this value
    assert R("").scalar_totals_view() == {}
