"""The master daemon's peer table, alone: who was heard when, who is silent, who is a master."""

from __future__ import annotations

from agora.master.server.peers import PeerTable


def test_silent_peers_leave_least_recently_heard_first() -> None:
    peers = PeerTable()
    peers.heard("a", 1.0)
    peers.heard("b", 2.0)
    peers.heard("c", 3.0)
    peers.heard("a", 4.0)  # heard again: now the most recent
    assert list(peers.expire(3.0)) == ["b", "c"]
    assert list(peers.expire(3.0)) == []  # gone once reported
    assert list(peers.clients()) == ["a"]
    assert list(peers.expire(4.0)) == ["a"]


def test_other_masters_are_not_clients_until_they_expire() -> None:
    peers = PeerTable()
    peers.heard("m", 1.0)
    peers.electing("m")
    peers.heard("fw", 2.0)
    assert list(peers.clients()) == ["fw"]
    assert list(peers.expire(1.0)) == ["m"]
    peers.heard("m", 5.0)  # the same routing id back, now as a client
    assert list(peers.clients()) == ["fw", "m"]
