"""The relay's books (pure), the ACL's ``relays`` and reading a frame's message name."""

from __future__ import annotations

from pathlib import Path

import pytest
from agora.master.relay.config import OPTIONS, settings_from
from agora.master.relay.core import Downstream, leader_info
from agora.sdk.codec import encode, envelope_head
from agora.sdk.messages import DetectLeader, Pong
from agora.sdk.transport import Acl, AclError


def test_an_agent_is_new_once_then_carried() -> None:
    books = Downstream(idle=10.0, max_agents=2)
    assert books.heard(b"a", 0.0).new
    again = books.heard(b"a", 1.0)
    assert again.carry and not again.new
    assert list(books) == [b"a"]


def test_agents_beyond_the_bound_are_refused_until_one_is_forgotten() -> None:
    books = Downstream(idle=10.0, max_agents=2)
    books.heard(b"a", 0.0)
    books.heard(b"b", 0.0)
    refused = books.heard(b"c", 0.0)
    assert not refused.carry and not refused.new
    books.forget(b"a")
    assert books.heard(b"c", 0.0).new
    assert sorted(books) == [b"b", b"c"]


def test_silent_agents_expire_and_heard_ones_stay() -> None:
    books = Downstream(idle=10.0)
    books.heard(b"a", 0.0)
    books.heard(b"b", 5.0)
    books.heard(b"a", 9.0)  # heard again: it moves behind b
    assert books.expire(14.9) == []
    assert books.expire(15.0) == [b"b"]
    assert list(books) == [b"a"]
    assert books.expire(100.0) == [b"a"] and len(books) == 0


def test_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError):
        Downstream(idle=0.0)
    with pytest.raises(ValueError):
        Downstream(idle=1.0, max_agents=0)


def test_the_relay_names_itself_the_leader_only_while_one_leads() -> None:
    up = leader_info("tcp://relay:5060", 7, True)
    assert (up.responder, up.leader, up.epoch, up.masters) == (
        "tcp://relay:5060",
        "tcp://relay:5060",
        7,
        ("tcp://relay:5060",),
    )
    assert leader_info("tcp://relay:5060", 7, False).leader is None


def test_relays_must_be_named_and_nobody_relays_by_default() -> None:
    assert not Acl().may_relay("relay")
    assert not Acl.from_dict({}).may_relay("relay")
    acl = Acl.from_dict({"relays": ["relay"]})
    assert acl.may_relay("relay") and not acl.may_relay("other") and not acl.may_relay(None)
    with pytest.raises(AclError, match="relays"):
        Acl.from_dict({"relays": ["*"]})
    with pytest.raises(AclError, match="relays"):
        Acl.from_dict({"relays": "relay"})


def test_envelope_head_reads_the_envelope_only() -> None:
    assert envelope_head(encode(DetectLeader(), epoch=3)) == ("DETECT_LEADER", 3)
    assert envelope_head(encode(Pong())) == ("PONG", 0)
    for junk in (b"", b"\xff" * 10, b"\x94\xa1x", encode(Pong())[:5]):
        assert envelope_head(junk) is None


def _values(**given: object) -> dict[str, object]:
    values: dict[str, object] = {opt.name: opt.default for opt in OPTIONS}
    values.update(given)
    return values


def test_the_relay_needs_masters_and_curve_or_insecure_on_purpose() -> None:
    with pytest.raises(ValueError, match="--masters"):
        settings_from(_values(insecure=True))
    with pytest.raises(ValueError, match="--insecure"):
        settings_from(_values(masters=("tcp://m1:5050",)))
    with pytest.raises(ValueError, match="--master-public-key"):
        settings_from(_values(masters=("tcp://m1:5050",), curve_secret_key=Path("relay")))
    keys = {k: Path(k) for k in ("curve_secret_key", "curve_authorized_keys", "master_public_key")}
    with pytest.raises(ValueError, match="exclude"):
        settings_from(_values(masters=("tcp://m1:5050",), insecure=True, **keys))
    ok = settings_from(_values(masters=("tcp://m1:5050",), **keys))
    assert ok.curve_secret_key == Path("curve_secret_key") and not ok.insecure
