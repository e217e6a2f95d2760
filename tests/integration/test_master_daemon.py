"""The master daemon as a real process, driven by raw clients (ZmqClient and bare DEALERs)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pytest
import zmq
import zmq.asyncio
from agora.sdk.codec import decode, encode
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    Error,
    ErrorCode,
    FrameworkInfo,
    Heartbeat,
    LeaderInfo,
    Message,
    Offers,
    RegisterAgent,
    Subscribe,
    Subscribed,
)
from agora.sdk.messages.operator import GetState, OperatorKill, StateReply
from agora.sdk.resources import Resources
from agora.sdk.transport import CurveClient, ZmqClient, generate_keypair
from support.master_process import clean_env, master_process
from support.polling import wait_for

M = TypeVar("M", bound=Message)
T = TypeVar("T")

DEADLINE = 10.0  # seconds any expected reply may take
AGENT_RESOURCES = Resources.parse("cpus:4;mem:4096")


# ---- fixtures and helpers -----------------------------------------------------------------


def _wait_for(predicate: Callable[[], T | None], what: str, timeout: float = DEADLINE) -> T:
    return wait_for(predicate, timeout, what)


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def expect(client: ZmqClient, kind: type[M], timeout: float = DEADLINE) -> M:
    """The next message of ``kind``; master HEARTBEATs and LEADER pushes on the way are skipped
    (a master that activates after a client's first call announces itself to it), anything else
    fails the test."""
    async with asyncio.timeout(timeout):
        while True:
            received = await client.recv()
            message = received.message
            if isinstance(message, Heartbeat | LeaderInfo) and not isinstance(message, kind):
                continue
            assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
            return message


def register_agent(hostname: str = "host-1") -> RegisterAgent:
    return RegisterAgent(agent_info=AgentInfo(hostname=hostname, resources=AGENT_RESOURCES))


def subscribe(name: str = "fw", **info: Any) -> Subscribe:
    return Subscribe(framework_info=FrameworkInfo(name=name, **info))


# ---- tests ------------------------------------------------------------------------------------


def test_agent_registers_and_framework_gets_offers(tmp_path: Path) -> None:
    with master_process(tmp_path, "--allocation-interval", "0.05") as master:

        async def scenario() -> None:
            agent = ZmqClient.connect(master.endpoint)
            framework = ZmqClient.connect(master.endpoint)
            try:
                await agent.send(register_agent())
                registered = await expect(agent, AgentRegistered)
                assert registered.master_info.address == master.endpoint
                assert registered.master_info.epoch == 1

                await framework.send(subscribe(roles=("*",)))
                subscribed = await expect(framework, Subscribed)
                assert subscribed.heartbeat_interval_seconds == 15.0
                offers = await expect(framework, Offers)
                assert [o.agent_id for o in offers.offers] == [registered.agent_id]
                assert offers.offers[0].resources == AGENT_RESOURCES

                await framework.send(GetState())
                state = await expect(framework, StateReply)
                assert [a.hostname for a in state.agents] == ["host-1"]
                assert [f.framework_id for f in state.frameworks] == [subscribed.framework_id]
            finally:
                agent.close()
                framework.close()

        run(scenario())
        events = {e["event"]: e for e in master.log_events()}
        assert events["master_bound"]["endpoint"] == master.endpoint
        assert events["agent_registered"]["hostname"] == "host-1"
        assert events["framework_subscribed"]["name"] == "fw"


def test_malformed_frames_get_error_and_the_daemon_keeps_serving(tmp_path: Path) -> None:
    with master_process(tmp_path) as master:

        async def scenario() -> None:
            ctx = zmq.asyncio.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(master.endpoint)

            async def reply() -> Message:
                async with asyncio.timeout(DEADLINE):
                    frames = await sock.recv_multipart()
                assert len(frames) == 1
                return decode(frames[0]).message

            async def error_for(*frames: bytes) -> Error:
                await sock.send_multipart(frames)
                message = await reply()
                assert isinstance(message, Error), message
                assert message.code is ErrorCode.BAD_REQUEST
                return message

            try:
                assert "msgpack" in (await error_for(b"\xc1garbage")).message
                assert "frames" in (await error_for(encode(Heartbeat()), b"x")).message
                unknown = msgpack.packb(("NO_SUCH_CALL", 1, 0, {}), use_bin_type=True)
                assert "unknown message" in (await error_for(unknown)).message
                wrong = msgpack.packb(
                    ("SUBSCRIBE", 1, 0, {"framework_info": {"name": 5}}), use_bin_type=True
                )
                err = await error_for(wrong)
                assert "SUBSCRIBE.framework_info.name" in err.message
                # A well-formed message the master does not take (an event) is refused by the core.
                await error_for(encode(Offers(offers=())))
                # A HEARTBEAT is liveness only: no answer, so the next reply is SUBSCRIBED.
                await sock.send(encode(Heartbeat()))
                await sock.send(encode(subscribe()))
                assert isinstance(await reply(), Subscribed)
            finally:
                sock.close(linger=0)
                ctx.destroy(linger=0)

        run(scenario())
        assert master.proc.poll() is None
        assert any(e["event"] == "bad_frame" for e in master.log_events())


def test_sigterm_exits_0_and_removes_the_endpoint_file(tmp_path: Path) -> None:
    with master_process(tmp_path) as master:

        async def connect_framework() -> None:
            framework = ZmqClient.connect(master.endpoint)
            try:
                await framework.send(subscribe())
                await expect(framework, Subscribed)
            finally:
                framework.close()

        run(connect_framework())
        master.proc.send_signal(signal.SIGTERM)
        assert master.proc.wait(timeout=DEADLINE) == 0
        assert not master.endpoint_file.exists()
        assert any(e["event"] == "master_stopped" for e in master.log_events())


def test_settings_come_from_flag_then_env_then_toml(tmp_path: Path) -> None:
    toml = tmp_path / "master.toml"
    toml.write_text("heartbeat_interval = 7\nallocation_interval = 0.05\n")

    async def heartbeat_interval(endpoint: str) -> float:
        framework = ZmqClient.connect(endpoint)
        try:
            await framework.send(subscribe())
            subscribed = await expect(framework, Subscribed)
            return float(subscribed.heartbeat_interval_seconds)
        finally:
            framework.close()

    env = {"AGORA_CONFIG": str(toml)}
    with master_process(tmp_path, env=env, name="toml") as master:
        assert run(heartbeat_interval(master.endpoint)) == 7.0
    env["AGORA_HEARTBEAT_INTERVAL"] = "3"
    with master_process(tmp_path, env=env, name="env") as master:
        assert run(heartbeat_interval(master.endpoint)) == 3.0
    with master_process(tmp_path, "--heartbeat-interval", "2", env=env, name="flag") as master:
        assert run(heartbeat_interval(master.endpoint)) == 2.0


def test_bad_options_exit_2(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "agora.master.server", "--allocation-interval", "never"]
    done = subprocess.run(argv, capture_output=True, env=clean_env(), timeout=DEADLINE)
    assert done.returncode == 2
    assert b"--allocation-interval" in done.stderr


def test_one_master_per_work_dir(tmp_path: Path) -> None:
    work = tmp_path / "shared-work"
    with master_process(tmp_path, "--work-dir", str(work)):
        argv = [
            sys.executable,
            "-m",
            "agora.master.server",
            "--bind",
            "tcp://127.0.0.1:0",
            "--work-dir",
            str(work),
            "--log-format",
            "json",
            "--insecure",
        ]
        done = subprocess.run(argv, capture_output=True, env=clean_env(), timeout=DEADLINE)
        assert done.returncode == 1
        assert b"work_dir_unusable" in done.stderr


def test_a_silent_framework_is_disconnected_after_the_peer_timeout(tmp_path: Path) -> None:
    """Framework A holds the only offer and goes silent; B keeps sending HEARTBEATs. After the
    peer timeout A is disconnected (and, with no failover timeout, removed), so its offer goes
    back and B, still alive thanks to its heartbeats, is offered the agent."""
    args = ("--peer-timeout", "0.5", "--allocation-interval", "0.05")
    with master_process(tmp_path, *args) as master:

        async def scenario() -> None:
            agent = ZmqClient.connect(master.endpoint)
            a = ZmqClient.connect(master.endpoint)
            b = ZmqClient.connect(master.endpoint)
            try:
                await agent.send(register_agent())
                await expect(agent, AgentRegistered)
                started = time.monotonic()  # A's last message to the master leaves after this
                await a.send(subscribe("a"))
                await expect(a, Subscribed)
                await expect(a, Offers)
                await b.send(subscribe("b"))
                await expect(b, Subscribed)

                async def keep_alive() -> None:
                    while True:
                        await b.send(Heartbeat())
                        await asyncio.sleep(0.1)

                beating = asyncio.create_task(keep_alive())
                try:
                    offers = await expect(b, Offers)
                finally:
                    beating.cancel()
                assert time.monotonic() - started >= 0.5
                assert offers.offers[0].resources == AGENT_RESOURCES
            finally:
                for client in (agent, a, b):
                    client.close()

        run(scenario())


def test_curve_admits_known_keys_and_the_acl_decides(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    authorized = tmp_path / "authorized"
    master_public, master_secret = generate_keypair(keys, "master")
    for principal in ("agent-1", "fw", "ops"):
        public, _ = generate_keypair(keys, principal)
        authorized.mkdir(exist_ok=True)
        (authorized / public.name).write_bytes(public.read_bytes())
    generate_keypair(keys, "rogue")  # a well-formed key the master does not know
    acl = tmp_path / "acl.toml"
    acl.write_text('agents = ["agent-1"]\noperators = ["ops"]\n[roles]\nfw = ["batch"]\n"*" = []\n')

    def curve(name: str) -> CurveClient:
        return CurveClient(keys / f"{name}.key_secret", master_public)

    args = (
        "--curve-secret-key",
        str(master_secret),
        "--curve-authorized-keys",
        str(authorized),
        "--acl",
        str(acl),
    )
    with master_process(tmp_path, *args) as master:

        async def scenario() -> None:
            # Refused clients are bare DEALERs: once a handshake is refused a DEALER has no pipe,
            # and a send would wait for one; these send without blocking instead.
            ctx = zmq.Context()
            rogue = ctx.socket(zmq.DEALER)
            curve("rogue").configure_socket(rogue)
            plain = ctx.socket(zmq.DEALER)
            agent = ZmqClient.connect(master.endpoint, curve=curve("agent-1"))
            fw = ZmqClient.connect(master.endpoint, curve=curve("fw"))
            ops = ZmqClient.connect(master.endpoint, curve=curve("ops"))
            try:
                # Unknown key and no CURVE at all: never admitted, never answered.
                for sock, host in ((rogue, "rogue"), (plain, "plain")):
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(master.endpoint)
                    with contextlib.suppress(zmq.Again):
                        sock.send(encode(register_agent(host)), zmq.NOBLOCK)

                await fw.send(register_agent("not-an-agent"))
                denied = await expect(fw, Error)
                assert denied.code is ErrorCode.FORBIDDEN
                await agent.send(register_agent("host-1"))
                await expect(agent, AgentRegistered)

                await fw.send(subscribe(roles=("mpi",)))
                denied = await expect(fw, Error)
                assert denied.code is ErrorCode.FORBIDDEN and "mpi" in denied.message
                await fw.send(subscribe(roles=("batch",), principal="ops"))
                denied = await expect(fw, Error)
                assert denied.code is ErrorCode.FORBIDDEN
                await fw.send(subscribe(roles=("batch",)))
                subscribed = await expect(fw, Subscribed)
                # The agent is registered, so the subscription is answered with an offer at once.
                await expect(fw, Offers)

                await fw.send(OperatorKill(task_id=TaskID("t1")))
                denied = await expect(fw, Error)
                assert denied.code is ErrorCode.FORBIDDEN
                await ops.send(OperatorKill(task_id=TaskID("t1")))
                unknown = await expect(ops, Error)
                assert unknown.code is ErrorCode.UNKNOWN_TASK  # reached the core

                await ops.send(GetState())
                state = await expect(ops, StateReply)
                assert [f.principal for f in state.frameworks] == ["fw"]
                assert [f.framework_id for f in state.frameworks] == [subscribed.framework_id]
                assert [a.hostname for a in state.agents] == ["host-1"]  # not rogue, not plain

                # By now the refused handshakes are long over; nothing came back, nor comes.
                for sock in (rogue, plain):
                    assert not sock.poll(300, zmq.POLLIN)
            finally:
                for client in (agent, fw, ops):
                    client.close()
                rogue.close(linger=0)
                plain.close(linger=0)
                ctx.destroy(linger=0)

        run(scenario())
        events = master.log_events()
        assert sum(e["event"] == "forbidden" for e in events) == 4
        assert master.proc.poll() is None


@pytest.mark.parametrize("problem", ["missing_acl", "missing_keys"])
def test_unusable_security_files_exit_1(tmp_path: Path, problem: str) -> None:
    keys = tmp_path / "keys"
    _, master_secret = generate_keypair(keys, "master")
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    args = [
        "--curve-secret-key",
        str(master_secret),
        "--curve-authorized-keys",
        str(authorized if problem != "missing_keys" else tmp_path / "nowhere"),
    ]
    if problem == "missing_acl":
        args += ["--acl", str(tmp_path / "no-acl.toml")]
    argv = [sys.executable, "-m", "agora.master.server", "--bind", "tcp://127.0.0.1:0"]
    argv += ["--work-dir", str(tmp_path / "w"), "--log-format", "json", *args]
    done = subprocess.run(argv, capture_output=True, env=clean_env(), timeout=DEADLINE)
    assert done.returncode == 1
    assert b"security_config_unusable" in done.stderr


def test_a_framework_belongs_to_its_principal_no_other_may_take_it_over(tmp_path: Path) -> None:
    """mallory, admitted by the master's keys and ACL, subscribes with alice's framework id: she
    is refused and the refusal logged; alice's scheduler keeps its framework and hears nothing."""
    keys = tmp_path / "keys"
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    master_public, master_secret = generate_keypair(keys, "master")
    for principal in ("alice", "mallory"):
        public, _ = generate_keypair(keys, principal)
        (authorized / public.name).write_bytes(public.read_bytes())

    def curve(name: str) -> CurveClient:
        return CurveClient(keys / f"{name}.key_secret", master_public)

    args = ("--curve-secret-key", str(master_secret), "--curve-authorized-keys", str(authorized))
    with master_process(tmp_path, *args) as master:

        async def scenario() -> None:
            alice = ZmqClient.connect(master.endpoint, curve=curve("alice"))
            mallory = ZmqClient.connect(master.endpoint, curve=curve("mallory"))
            try:
                await alice.send(subscribe("alice-fw", failover_timeout=3600.0))
                fid = (await expect(alice, Subscribed)).framework_id
                await mallory.send(subscribe("alice-fw", framework_id=fid))
                refused = await expect(mallory, Error)
                assert refused.code is ErrorCode.FORBIDDEN
                assert "another principal" in refused.message
                # alice keeps her framework: her calls still go through, nothing told her to stop.
                await alice.send(GetState())
                state = await expect(alice, StateReply)
                [fw] = [f for f in state.frameworks if f.framework_id == fid]
                assert fw.principal == "alice" and fw.active
                with pytest.raises(TimeoutError):  # no "failed over to another scheduler"
                    await expect(alice, Error, timeout=0.3)
            finally:
                alice.close()
                mallory.close()

        run(scenario())
        events = master.log_events()
        [refusal] = [e for e in events if e["event"] == "subscribe_refused"]
        assert (refusal["principal"], refusal["owner"]) == ("mallory", "alice")
        assert master.proc.poll() is None
