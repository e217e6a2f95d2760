"""The multi-host rig (deploy/rig.py) against the real kernel: hosts reach each other over the
hub bridge, each fault blocks exactly what it names (established TCP and ZeroMQ included),
heal restores it, and down leaves nothing behind. Needs root, `ip` and `nft`."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.polling import wait_for


def _load_rig() -> ModuleType:
    deploy = str(Path(__file__).resolve().parents[2] / "deploy")
    if deploy not in sys.path:
        sys.path.insert(0, deploy)
    return importlib.import_module("rig")


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root: creates network namespaces and nftables rules"
    missing = [tool for tool in ("ip", "nft", "tc") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)} installed" if missing else None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")

rigmod = _load_rig() if _why_skip() is None else None
PY = sys.executable
PORT = 7000

ECHO_SERVER = """
import socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
def serve(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""

TCP_PROBE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"ping")
        sys.exit(0 if s.recv(4) == b"ping" else 1)
except OSError:
    sys.exit(1)
"""

# Reads lines on stdin over one connection; prints the echo, or FAIL when none comes in time.
TCP_SESSION = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
s.settimeout(float(sys.argv[3]))
for line in sys.stdin:
    try:
        s.sendall(line.encode())
        print("ECHO", s.recv(4096).decode().strip(), flush=True)
    except OSError as exc:
        print("FAIL", type(exc).__name__, flush=True)
"""

UDP_RECV = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 1 << 22)  # SO_RCVBUFFORCE
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
s.settimeout(float(sys.argv[3]))
n = 0
try:
    while True:
        s.recv(64)
        n += 1
        s.settimeout(0.5)
except OSError:
    pass
print(n, flush=True)
"""

UDP_SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    try:
        s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    except OSError:
        pass
"""

ZMQ_ROUTER = """
import sys, zmq
sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(f"tcp://{sys.argv[1]}:{sys.argv[2]}")
while True:
    sock.send_multipart(sock.recv_multipart())
"""

ZMQ_DEALER = """
import sys, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(f"tcp://{sys.argv[1]}:{sys.argv[2]}")
seq = 0
while True:
    sock.send(str(seq).encode())
    print("sent", seq, flush=True)
    seq += 1
    if sock.poll(50):
        while sock.poll(0):
            print("reply", sock.recv().decode(), flush=True)
"""


@pytest.fixture
def rig() -> Iterator[Any]:
    assert rigmod is not None
    r = rigmod.Rig.create(3, name=f"t{uuid.uuid4().hex[:6]}")
    try:
        yield r
    finally:
        r.down()
    assert not [ns for ns in _netns() if ns.startswith(r.prefix)]


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip() for line in out.stdout.splitlines()}


def _serve(rig: Any, host: int) -> None:
    """Start the echo server in host and wait until another host can reach it."""
    rig.popen(host, [PY, "-c", ECHO_SERVER, rig.hosts[host].address, str(PORT)])
    other = 1 if host == 0 else 0
    wait_for(lambda: _tcp(rig, other, host), timeout=10, what=f"echo server on host {host}")


def _tcp(rig: Any, src: int, dst: int, timeout: float = 0.5) -> bool:
    argv = [PY, "-c", TCP_PROBE, rig.hosts[dst].address, str(PORT), str(timeout)]
    return subprocess.run(rig.command(src, argv), timeout=10, check=False).returncode == 0


def _udp(rig: Any, src: int, dst: int, count: int = 5) -> int:
    """Datagrams of `count` sent src->dst that arrived."""
    port = str(PORT + 1)
    argv = [PY, "-c", UDP_RECV, rig.hosts[dst].address, port, "1.0"]
    recv = rig.popen(dst, argv, stdout=subprocess.PIPE)
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == b"ready"
        send = [PY, "-c", UDP_SEND, rig.hosts[dst].address, port, str(count)]
        subprocess.run(rig.command(src, send), timeout=10, check=True)
        out, _ = recv.communicate(timeout=10)
        return int(out.strip())
    finally:
        recv.kill()
        recv.wait()


class Lines:
    """Collects a child's stdout lines in a thread."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for raw in stream:
            with self._lock:
                self.lines.append(raw.decode().strip())

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def last(self, kind: str) -> int:
        found = [int(line.split()[1]) for line in self.snapshot() if line.startswith(kind + " ")]
        return max(found, default=-1)


def test_hosts_reach_each_other_and_cut_blocks_only_that_link(rig: Any) -> None:
    _serve(rig, 0)
    assert _tcp(rig, 1, 0) and _tcp(rig, 2, 0)
    rig.cut(0, 1)
    assert not _tcp(rig, 1, 0)
    assert _tcp(rig, 2, 0)
    rig.heal()
    assert _tcp(rig, 1, 0)


def test_cut_stalls_an_established_connection(rig: Any) -> None:
    _serve(rig, 0)
    argv = [PY, "-c", TCP_SESSION, rig.hosts[0].address, str(PORT), "0.5"]
    sess = rig.popen(1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    lines = Lines(sess)
    assert sess.stdin is not None

    def say(word: str) -> str:
        before = len(lines.snapshot())
        assert sess.stdin is not None
        sess.stdin.write(word.encode() + b"\n")
        sess.stdin.flush()
        wait_for(lambda: len(lines.snapshot()) > before, timeout=10, what="session answer")
        return lines.snapshot()[before]

    assert say("a") == "ECHO a"
    rig.cut(0, 1)
    assert say("b").startswith("FAIL")
    rig.heal()
    # TCP retransmits the stalled bytes; the same connection works again.
    wait_for(lambda: "ECHO" in say("c"), timeout=15, what="connection to recover after heal")


def test_one_way_cut_drops_only_that_direction(rig: Any) -> None:
    assert _udp(rig, 0, 1) == 5 and _udp(rig, 1, 0) == 5
    rig.cut(0, 1, both=False)
    assert _udp(rig, 0, 1) == 0
    assert _udp(rig, 1, 0) == 5
    rig.heal()
    assert _udp(rig, 0, 1) == 5


def test_partition_and_isolate(rig: Any) -> None:
    for h in range(3):
        _serve(rig, h)
    rig.partition([0], [1, 2])
    reach = {(a, b): _tcp(rig, a, b) for a in range(3) for b in range(3) if a != b}
    assert reach == {(a, b): (a != 0 and b != 0) for (a, b) in reach}
    rig.heal()
    rig.isolate(2)
    reach = {(a, b): _tcp(rig, a, b) for a in range(3) for b in range(3) if a != b}
    assert reach == {(a, b): (a != 2 and b != 2) for (a, b) in reach}
    rig.heal()
    assert all(_tcp(rig, a, b) for a in range(3) for b in range(3) if a != b)


def test_loss(rig: Any) -> None:
    rig.loss(1, 0, 100)
    assert _udp(rig, 1, 0) == 0
    assert _udp(rig, 0, 1) == 5
    rig.loss(1, 0, 30)  # replaces the 100 % rule
    got = _udp(rig, 1, 0, count=400)
    assert 200 <= got <= 360, got  # expected 280, sd ~9
    rig.loss(1, 0, 0)
    assert _udp(rig, 1, 0, count=50) == 50


def test_delay_adds_rtt_or_is_unsupported(rig: Any) -> None:
    assert rigmod is not None
    _serve(rig, 1)

    def rtt() -> float:
        start = time.monotonic()
        assert _tcp(rig, 0, 1, timeout=5)
        return time.monotonic() - start

    base = min(rtt() for _ in range(3))
    try:
        rig.delay(0, 1, 100)
    except rigmod.RigUnsupported as exc:
        pytest.skip(str(exc))
    # connect + echo is two round trips, each crossing 0->1 once.
    assert min(rtt() for _ in range(3)) - base >= 0.15
    rig.heal()
    assert min(rtt() for _ in range(3)) - base < 0.1


def test_down_leaves_nothing_even_after_an_error() -> None:
    assert rigmod is not None
    links = _root_links()
    name = f"t{uuid.uuid4().hex[:6]}"
    with pytest.raises(RuntimeError, match="boom"), rigmod.Rig.create(2, name=name) as r:
        tracked = r.popen(0, ["sleep", "60"])
        # Started around the rig (as the CLI would): down must still kill it.
        stray = subprocess.Popen(r.command(1, ["sleep", "60"]), start_new_session=True)
        r.cut(0, 1)
        wait_for(lambda: rigmod.Rig.attach(name).hosts == r.hosts, timeout=5, what="attach")
        raise RuntimeError("boom")
    try:
        assert stray.wait(timeout=5) is not None
        assert tracked.poll() is not None
    finally:
        stray.kill()
    assert not [ns for ns in _netns() if ns.startswith(f"agora-rig-{name}-")]
    assert _root_links() == links
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "agora_rig" not in tables


def test_cleanup_stale_removes_a_crashed_rig() -> None:
    assert rigmod is not None
    name = f"t{uuid.uuid4().hex[:6]}"
    r = rigmod.Rig.create(2, name=name)
    proc = r.popen(0, ["sleep", "60"])
    removed = rigmod.cleanup_stale(r.prefix)  # as if the owner had crashed
    assert sorted(removed) == sorted([h.name for h in r.hosts] + [f"{r.prefix}hub"])
    assert not [ns for ns in _netns() if ns.startswith(r.prefix)]
    wait_for(lambda: proc.poll() is not None, timeout=5, what="rig process killed")


def test_zmq_dealer_loses_and_regains_router_across_cut(rig: Any) -> None:
    pytest.importorskip("zmq")
    addr = rig.hosts[0].address
    rig.popen(0, [PY, "-c", ZMQ_ROUTER, addr, str(PORT)])
    dealer = rig.popen(1, [PY, "-c", ZMQ_DEALER, addr, str(PORT)], stdout=subprocess.PIPE)
    lines = Lines(dealer)
    wait_for(lambda: lines.last("reply") >= 5, timeout=10, what="first replies")

    rig.cut(0, 1)
    cut_at = lines.last("sent")
    # Let ~1 s of requests go out (20 per second); none sent after the cut gets a reply.
    wait_for(lambda: lines.last("sent") >= cut_at + 20, timeout=10, what="requests during cut")
    assert lines.last("reply") <= cut_at + 3

    rig.heal()
    healed_at = lines.last("sent")
    wait_for(lambda: lines.last("reply") > healed_at, timeout=15, what="replies after heal")


def test_cli_up_exec_cut_down() -> None:
    script = str(Path(__file__).resolve().parents[2] / "deploy" / "rig.py")
    name = f"t{uuid.uuid4().hex[:6]}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [PY, script, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    try:
        up = cli("up", "--hosts", "2", "--name", name)
        assert up.returncode == 0, up.stderr
        hosts = json.loads(up.stdout)["hosts"]
        assert [h["index"] for h in hosts] == [0, 1]
        assert cli("exec", name, "1", "--", "true").returncode == 0
        assert cli("exec", name, "1", "--", "false").returncode == 1
        assert cli("cut", name, "0", "1", "--one-way").returncode == 0
        rules = cli("exec", name, "0", "--", "nft", "list", "ruleset").stdout
        assert f"ip daddr {hosts[1]['address']}" in rules
        assert cli("down", name).returncode == 0
        assert not [ns for ns in _netns() if ns.startswith(f"agora-rig-{name}-")]
        assert cli("cut", name, "0", "1").returncode == 1  # no such rig any more
    finally:
        assert rigmod is not None
        rigmod.cleanup_stale(f"agora-rig-{name}-")
