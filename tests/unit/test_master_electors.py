"""Who may send a master election traffic under CURVE: the ACL's ``masters`` when it names
them, else only whoever holds the master's own key pair (the group's shared ``master`` key), so
an ACL that forgets ``masters`` does not let every admitted agent or framework vote."""

from __future__ import annotations

import shutil
from pathlib import Path

from agora.master.server.process import _electors
from agora.sdk.transport import Acl, CurveServer, generate_keypair


def _server(tmp_path: Path) -> CurveServer:
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    authorized.mkdir()
    for name in ("master", "agent", "user-alice"):
        public, _ = generate_keypair(keys, name)
        shutil.copyfile(public, authorized / public.name)
    return CurveServer(keys / "master.key_secret", authorized)


def test_without_a_masters_list_only_the_masters_own_key_may_elect(tmp_path: Path) -> None:
    curve = _server(tmp_path)
    assert _electors(curve, None) == {"master"}
    assert _electors(curve, Acl.from_dict({"agents": ["agent"]})) == {"master"}


def test_the_acls_masters_list_decides_when_it_names_them(tmp_path: Path) -> None:
    curve = _server(tmp_path)
    assert _electors(curve, Acl.from_dict({"masters": ["m1", "m2"]})) == {"m1", "m2"}


def test_without_curve_senders_cannot_be_told_apart() -> None:
    assert _electors(None, Acl()) is None


def test_the_daemon_drops_election_traffic_from_anyone_else(tmp_path: Path) -> None:
    from agora.master.server.daemon import MasterDaemon
    from agora.sdk.transport.inproc import InprocHub

    curve = _server(tmp_path)
    acl = Acl.from_dict({"agents": ["agent"]})
    daemon = MasterDaemon(
        None,
        InprocHub().server("inproc://m"),
        tick_interval=0.1,
        peer_timeout=1.0,
        acl=acl,
        authenticated=True,
        electors=_electors(curve, acl),
    )
    assert daemon._may_elect("master")
    assert not any(daemon._may_elect(p) for p in ("agent", "user-alice", None))
