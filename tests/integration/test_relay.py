"""An agent behind ``agora-relay``, and what the master refuses to take from a relay (CURVE on).

The master admits agent-1, ops, fw, relay and rogue (their public keys are in its authorized-keys
directory); its ACL lets agent-1 register, ops make operator calls, fw subscribe, and only
``relay`` relay. The relay admits agent-1 and rogue. The agent connects to the relay only.
Forged relay traffic is sent with a raw DEALER, as an attacker holding an admitted key would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from agora.sdk.codec import decode, encode
from agora.sdk.messages import (
    AgentInfo,
    DetectLeader,
    Error,
    ErrorCode,
    GetState,
    LeaderInfo,
    RegisterAgent,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import generate_keypair
from support.agent_daemon_kit import agent_process
from support.master_http_group import http_group
from support.polling import wait_for
from support.procs import marked, stop

pytestmark = pytest.mark.timeout(120)

AGORA = (sys.executable, "-m", "agora.sdk.cli")
CMD_TIMEOUT = 60.0
START_TIMEOUT = 30.0
REPLY_TIMEOUT_MS = 10_000
MARK = "RELAY_TEST_MARK"


@dataclass
class RelayCluster:
    master: str
    relay: str
    keys: Path
    env: dict[str, str]
    logs: list[Path]

    def agora(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AGORA, *args], env=self.env, capture_output=True, text=True, timeout=CMD_TIMEOUT
        )

    def as_(self, principal: str) -> tuple[str, ...]:
        return (
            *("--master", self.master),
            *("--curve-secret-key", str(self.keys / f"{principal}.key_secret")),
            *("--curve-server-key", str(self.keys / "master.key")),
        )

    def state(self) -> dict[str, Any]:
        out = self.agora("state", "--json", *self.as_("ops"), "--timeout", "5")
        assert out.returncode == 0, f"{out.stderr}\n{self.tail()}"
        state: dict[str, Any] = json.loads(out.stdout)
        return state

    def tail(self) -> str:
        return "\n".join(
            f"---- {p.name} ----\n{p.read_text(errors='replace')[-5000:]}"
            for p in self.logs
            if p.exists()
        )

    @contextlib.contextmanager
    def dealer(self, principal: str, server: str = "master") -> Iterator[zmq.Socket[bytes]]:
        """A raw DEALER to the master (or the relay) holding ``principal``'s key."""
        ctx = zmq.Context.instance()
        sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        public, secret = zmq.auth.load_certificate(str(self.keys / f"{principal}.key_secret"))
        server_key, _ = zmq.auth.load_certificate(str(self.keys / f"{server}.key"))
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = (
            public,
            secret,
            server_key,
        )
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
        sock.connect(self.master if server == "master" else self.relay)
        try:
            yield sock
        finally:
            sock.close(linger=0)


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _bound(proc: subprocess.Popen[bytes], endpoint_file: Path, log: Path) -> str:
    def bound() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(OSError):
            return endpoint_file.read_text().strip() or None
        return None

    return wait_for(bound, START_TIMEOUT, f"{endpoint_file.name}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayCluster]:
    tmp = tmp_path_factory.mktemp("relay")
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env[MARK] = mark
    keys = tmp / "keys"
    for name in ("master", "relay", "agent-1", "ops", "fw", "rogue"):
        generate_keypair(keys, name)
    at_master, at_relay = tmp / "authorized-master", tmp / "authorized-relay"
    at_master.mkdir()
    at_relay.mkdir()
    for name in ("agent-1", "ops", "fw", "relay", "rogue"):
        shutil.copy(keys / f"{name}.key", at_master / f"{name}.key")
    for name in ("agent-1", "rogue"):
        shutil.copy(keys / f"{name}.key", at_relay / f"{name}.key")
    acl = tmp / "acl.toml"
    acl.write_text(
        'agents = ["agent-1"]\noperators = ["ops"]\nrelays = ["relay"]\n'
        '[roles]\nfw = ["*"]\n"*" = []\n',
        encoding="utf-8",
    )
    logs = [tmp / "master.log", tmp / "relay.log", tmp / "agent.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master = _spawn(
            [
                "agora.master.server",
                *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(tmp / "master.ep")),
                *("--work-dir", str(tmp / "master-work")),
                *("--curve-secret-key", str(keys / "master.key_secret")),
                *("--curve-authorized-keys", str(at_master), "--acl", str(acl)),
            ],
            logs[0],
            env,
        )
        procs.append(master)
        master_ep = _bound(master, tmp / "master.ep", logs[0])
        relay = _spawn(
            [
                "agora.master.relay",
                *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(tmp / "relay.ep")),
                *("--masters", master_ep),
                *("--curve-secret-key", str(keys / "relay.key_secret")),
                *("--curve-authorized-keys", str(at_relay)),
                *("--master-public-key", str(keys / "master.key")),
            ],
            logs[1],
            env,
        )
        procs.append(relay)
        relay_ep = _bound(relay, tmp / "relay.ep", logs[1])
        agent = _spawn(
            [
                "agora.agent.server",
                *("--master", relay_ep, "--hostname", "agent-1"),
                *("--work-dir", str(tmp / "agent-work")),
                *("--resources", "cpus:2;mem:1024;disk:1024"),
                *("--executor-bind", "tcp://127.0.0.1:0"),
                "--allow-root-tasks",
                *("--curve-secret-key", str(keys / "agent-1.key_secret")),
                *("--curve-server-key", str(keys / "relay.key")),
            ],
            logs[2],
            env,
        )
        procs.append(agent)
        yield RelayCluster(master_ep, relay_ep, keys, env, logs)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for pid in marked(MARK, mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _active_agents(cluster: RelayCluster) -> list[dict[str, Any]]:
    return [a for a in cluster.state()["agents"] if a["status"] == "ACTIVE"]


def test_an_agent_behind_the_relay_registers_and_runs_a_task(cluster: RelayCluster) -> None:
    agents = wait_for(lambda: _active_agents(cluster) or None, START_TIMEOUT, "the agent")
    assert [a["hostname"] for a in agents] == ["agent-1"], cluster.tail()
    out = cluster.agora("run", *cluster.as_("fw"), "--timeout", "30", "--", "echo", "relayed")
    assert out.returncode == 0, f"{out.stderr}\n{cluster.tail()}"
    assert "relayed" in out.stdout


def test_the_relay_answers_detect_leader_as_the_leader_itself(cluster: RelayCluster) -> None:
    with cluster.dealer("rogue", server="relay") as sock:
        sock.send(encode(DetectLeader()))
        info = decode(sock.recv()).message
        while not isinstance(info, LeaderInfo) or info.leader is None:
            info = decode(sock.recv()).message  # told once on arrival, then the answer
    assert info.leader == info.responder and info.masters == (info.responder,)
    assert cluster.master not in (info.leader, *info.masters)  # agents never dial a master


def _register(name: str) -> bytes:
    info = AgentInfo(hostname=name, resources=Resources.parse("cpus:1;mem:64"))
    return encode(RegisterAgent(agent_info=info))


def _relayed_reply(sock: zmq.Socket[bytes], agent: bytes) -> Error:
    behind, frame = sock.recv_multipart()
    assert behind == agent
    reply = decode(frame).message
    assert isinstance(reply, Error), reply
    return reply


@pytest.mark.parametrize(
    ("sender", "claims", "frame", "why"),
    [
        # An admitted key that is not one of the ACL's relays cannot speak for an agent...
        ("rogue", "agent-1", _register("forged"), "may not relay"),
        # ...nor for an operator.
        ("fw", "ops", encode(GetState()), "not an agent's message"),
        # The relay itself carries agents' messages only.
        ("relay", "ops", encode(GetState()), "not an agent's message"),
        # And its agents act as their own principal: rogue may not register agents.
        ("relay", "rogue", _register("rogue-agent"), "may not register agents"),
    ],
    ids=["not-a-relay", "not-a-relay-operator-call", "relay-operator-call", "relayed-principal"],
)
def test_forged_relay_traffic_is_refused_and_changes_nothing(
    cluster: RelayCluster, sender: str, claims: str, frame: bytes, why: str
) -> None:
    wait_for(lambda: _active_agents(cluster) or None, START_TIMEOUT, "the agent")
    before = {a["hostname"] for a in cluster.state()["agents"]}
    agent = uuid.uuid4().bytes[:5]
    with cluster.dealer(sender) as sock:
        sock.send_multipart([agent, claims.encode(), frame])
        reply = _relayed_reply(sock, agent)
    assert reply.code == ErrorCode.FORBIDDEN and why in reply.message, reply
    assert {a["hostname"] for a in cluster.state()["agents"]} == before


@pytest.mark.parametrize(
    "parts",
    [
        [b"", b"agent-1", b"x"],  # no routing id for the agent
        [b"abcde", b"p" * 300, b"x"],  # a principal longer than any
        [b"abcde", b"\xff\xfe", b"x"],  # not UTF-8
    ],
    ids=["no-routing-id", "long-principal", "not-utf8"],
)
def test_malformed_relay_envelopes_get_an_error(cluster: RelayCluster, parts: list[bytes]) -> None:
    with cluster.dealer("relay") as sock:
        sock.send_multipart(parts)
        reply = decode(sock.recv()).message
    assert isinstance(reply, Error) and reply.code == ErrorCode.BAD_REQUEST, reply
    assert _active_agents(cluster)  # the master serves on


def test_agents_behind_a_relay_follow_a_failover(tmp_path: Path) -> None:
    """A real agent knows only the relay; the leader is killed; it is back at the new leader."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    with http_group(tmp_path, election_timeout=1.0) as group:
        leader, epoch = wait_for(group.leader, 30, "a leader")
        log = tmp_path / "relay.log"
        relay = _spawn(
            [
                "agora.master.relay",
                *("--bind", "tcp://127.0.0.1:0", "--endpoint-file", str(tmp_path / "relay.ep")),
                *("--masters", ",".join(group.endpoints), "--insecure"),
            ],
            log,
            env,
        )
        try:
            relay_ep = _bound(relay, tmp_path / "relay.ep", log)
            with agent_process(tmp_path, relay_ep) as agent:

                def active(at: str) -> str | None:
                    agents = group.state(at)["agents"]
                    up = [a["id"] for a in agents if a["status"] == "ACTIVE"]
                    return up[0] if up else None

                agent_id = wait_for(lambda: active(leader), START_TIMEOUT, "the agent")
                group.kill(leader)
                survivors = [e for e in group.endpoints if e != leader]
                new, new_epoch = wait_for(lambda: group.leader(survivors), 30, "a new leader")
                assert new_epoch > epoch
                back = wait_for(lambda: active(new), START_TIMEOUT, "the agent at the new leader")
                assert back == agent_id, f"{agent.log()[-3000:]}\n{log.read_text()[-3000:]}"
                # It never dialled a master itself: the relay is the only master it knows.
                assert all(m not in agent.log() for m in group.endpoints)
        finally:
            stop(relay)
