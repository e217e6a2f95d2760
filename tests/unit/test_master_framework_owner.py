"""A framework belongs to the principal that registered it: a SUBSCRIBE with its id from another
principal is refused, logged, and changes nothing, before and after a leader change."""

from __future__ import annotations

from agora.master.core import Master, MasterConfig
from agora.master.core.actions import Action, Send
from agora.master.registry import FrameworkEntry, Registry, UpsertFramework
from agora.sdk.ids import FrameworkID
from agora.sdk.messages import Error, ErrorCode, FrameworkInfo, Subscribe, Subscribed


def _sent(actions: list[Action], to: str) -> list[object]:
    return [a.message for a in actions if isinstance(a, Send) and a.to == to]


def _subscribe(name: str, principal: str | None, fid: FrameworkID | None = None) -> Subscribe:
    return Subscribe(framework_info=FrameworkInfo(name=name, principal=principal, framework_id=fid))


def test_another_principal_cannot_take_over_a_subscribed_framework() -> None:
    master = Master(MasterConfig(), now=0.0)
    [subscribed] = _sent(master.handle("alice", _subscribe("fw", "alice"), 1.0), "alice")
    assert isinstance(subscribed, Subscribed)
    fid = subscribed.framework_id
    out = master.handle("mallory", _subscribe("fw", "mallory", fid), 2.0)
    [refused] = _sent(out, "mallory")
    assert isinstance(refused, Error) and refused.code is ErrorCode.FORBIDDEN
    assert _sent(out, "alice") == [], "alice is not told to stop"
    fw = master.state.frameworks[fid]
    assert fw.peer == "alice" and fw.connected and fw.failovers == 0
    [notice] = [n for n in master.notices() if n.event == "subscribe_refused"]
    assert dict(notice.fields)["owner"] == "alice" and notice.level == "warning"
    # alice herself may re-subscribe from a new connection (a scheduler failover).
    [back] = _sent(master.handle("alice-2", _subscribe("fw", "alice", fid), 3.0), "alice-2")
    assert isinstance(back, Subscribed) and master.state.frameworks[fid].peer == "alice-2"


def test_after_a_leader_change_the_registry_says_whose_a_framework_is() -> None:
    fid = FrameworkID("e1-F1")
    registry = Registry()
    entry = FrameworkEntry(framework_id=fid, name="fw", principal="alice", failover_timeout=60.0)
    registry.apply(UpsertFramework(framework=entry))
    master = Master(MasterConfig(epoch=2), registry=registry, now=0.0)
    [refused] = _sent(master.handle("mallory", _subscribe("fw", "mallory", fid), 1.0), "mallory")
    assert isinstance(refused, Error) and refused.code is ErrorCode.FORBIDDEN
    assert fid not in master.state.frameworks and registry.frameworks[fid].principal == "alice"
    [ok] = _sent(master.handle("alice", _subscribe("fw", "alice", fid), 2.0), "alice")
    assert isinstance(ok, Subscribed) and ok.framework_id == fid


def test_without_principals_nothing_changes() -> None:
    master = Master(MasterConfig(), now=0.0)
    [subscribed] = _sent(master.handle("s1", _subscribe("fw", None), 1.0), "s1")
    assert isinstance(subscribed, Subscribed)
    out = master.handle("s2", _subscribe("fw", None, subscribed.framework_id), 2.0)
    assert any(isinstance(m, Subscribed) for m in _sent(out, "s2"))
