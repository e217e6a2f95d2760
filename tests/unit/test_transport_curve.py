"""agora.sdk.transport.curve: CURVE admission with principals, and the ACL."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq.asyncio
import zmq.auth
from agora.sdk.messages import Heartbeat, Pong
from agora.sdk.transport import (
    Acl,
    AclError,
    CurveClient,
    CurveServer,
    ZmqClient,
    ZmqServer,
    generate_keypair,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.005)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """master keypair, two admitted clients (agent-1, ops) and one stranger."""
    authorized = tmp_path / "authorized"
    own = tmp_path / "own"
    paths: dict[str, Path] = {"authorized": authorized}
    _, paths["master"] = generate_keypair(own, "master")
    paths["master.pub"] = own / "master.key"
    for name in ("agent-1", "ops"):
        public, paths[name] = generate_keypair(own, name)
        authorized.mkdir(exist_ok=True)
        (authorized / public.name).write_bytes(public.read_bytes())
    _, paths["stranger"] = generate_keypair(tmp_path / "elsewhere", "stranger")
    return paths


def test_generate_keypair_writes_pyzmq_certificates(tmp_path: Path) -> None:
    public, secret = generate_keypair(tmp_path / "k", "node")
    assert public.name == "node.key" and secret.name == "node.key_secret"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    loaded = zmq.auth.load_certificate(str(secret))
    assert loaded[1] is not None and loaded[0] == zmq.auth.load_certificate(str(public))[0]
    with pytest.raises(ValueError):
        generate_keypair(tmp_path, "../escape")


def test_admitted_clients_carry_their_principal_and_strangers_never_arrive(
    keys: dict[str, Path],
) -> None:
    async def main() -> None:
        curve = CurveServer(keys["master"], keys["authorized"])
        assert sorted(curve.principals.values()) == ["agent-1", "ops"]
        server = ZmqServer.bind("tcp://127.0.0.1:0", curve=curve)
        stranger = ZmqClient.connect(
            server.endpoint, curve=CurveClient(keys["stranger"], keys["master.pub"])
        )
        agent = ZmqClient.connect(
            server.endpoint, curve=CurveClient(keys["agent-1"], keys["master.pub"])
        )
        ops = ZmqClient.connect(server.endpoint, curve=CurveClient(keys["ops"], keys["master.pub"]))
        try:
            await stranger.send(Heartbeat())
            await until(lambda: stranger.handshake_error == "authentication failed")
            assert not stranger.connected
            await agent.send(Heartbeat())
            got = await asyncio.wait_for(server.recv(), 5)
            assert got.principal == "agent-1" and got.message == Heartbeat()
            assert await server.send(got.peer, Pong())
            assert (await asyncio.wait_for(agent.recv(), 5)).message == Pong()
            await ops.send(Pong())
            got = await asyncio.wait_for(server.recv(), 5)
            assert got.principal == "ops" and got.message == Pong()
            # The stranger keeps retrying; none of its messages ever gets through.
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                assert server.recv_nowait() is None
                await asyncio.sleep(0.01)
            assert not stranger.connected and agent.connected
        finally:
            for transport in (stranger, agent, ops, server):
                transport.close()

    run(main())


def test_a_client_with_the_wrong_server_key_never_connects(keys: dict[str, Path]) -> None:
    async def main() -> None:
        server = ZmqServer.bind(
            "tcp://127.0.0.1:0", curve=CurveServer(keys["master"], keys["authorized"])
        )
        wrong = keys["authorized"] / "ops.key"  # not the master's public key
        client = ZmqClient.connect(server.endpoint, curve=CurveClient(keys["agent-1"], wrong))
        try:
            await client.send(Heartbeat())
            await until(lambda: client.handshake_error is not None)
            assert not client.connected and server.recv_nowait() is None
        finally:
            client.close()
            server.close()

    run(main())


def test_one_zap_handler_per_context(keys: dict[str, Path]) -> None:
    async def main() -> None:
        context = zmq.asyncio.Context()
        curve = CurveServer(keys["master"], keys["authorized"])
        server = ZmqServer.bind("tcp://127.0.0.1:0", curve=curve, context=context)
        try:
            with pytest.raises(ValueError, match="ZAP"):
                ZmqServer.bind("tcp://127.0.0.1:0", curve=curve, context=context)
        finally:
            server.close()
            context.term()

    run(main())


def test_bad_key_files_give_clear_errors(keys: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no secret key"):
        CurveServer(keys["master.pub"], keys["authorized"])
    with pytest.raises(ValueError, match="does not exist"):
        CurveServer(keys["master"], tmp_path / "missing")
    with pytest.raises(ValueError, match="cannot load"):
        CurveClient(tmp_path / "nothing.key_secret", keys["master.pub"])
    (keys["authorized"] / "copy.key").write_bytes((keys["authorized"] / "ops.key").read_bytes())
    with pytest.raises(ValueError, match="repeats the key of 'copy'"):
        CurveServer(keys["master"], keys["authorized"])
    (keys["authorized"] / "copy.key").unlink()
    (keys["authorized"] / "broken.key").write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"broken\.key"):
        CurveServer(keys["master"], keys["authorized"])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "acl.toml"
    path.write_text(text)
    return path


def test_acl_decisions(tmp_path: Path) -> None:
    acl = Acl.load(
        write(
            tmp_path,
            'agents = ["agent-1", "agent-2"]\noperators = ["ops"]\n'
            '[roles]\nbatch = ["batch", "*"]\n"*" = ["*"]\n',
        )
    )
    assert acl.may_register_agent("agent-1") and acl.may_register_agent("agent-2")
    assert not acl.may_register_agent("batch") and not acl.may_register_agent(None)
    assert acl.may_operate("ops") and not acl.may_operate("agent-1")
    assert acl.may_use_roles("batch", ["batch", "*"]) is None
    assert acl.may_use_roles("batch", ["batch", "mpi"]) == "mpi"
    assert acl.may_use_roles("someone", ["*"]) is None  # the "*" default entry
    assert acl.may_use_roles("someone", ["*", "batch"]) == "batch"
    assert acl.may_use_roles(None, ["batch"]) == "batch"
    assert acl.may_use_roles("batch", []) is None


def test_acl_wildcards_and_defaults(tmp_path: Path) -> None:
    acl = Acl.load(write(tmp_path, '[roles]\nbatch = ["batch"]\n'))
    assert acl.may_register_agent("anyone") and acl.may_register_agent(None)  # agents default "*"
    assert not acl.may_operate("anyone")  # operators default: nobody
    assert acl.may_use_roles("mpi", ["mpi"]) == "mpi"  # no "*" entry: unlisted get no roles
    open_roles = Acl.load(write(tmp_path, 'operators = ["*"]\n'))
    assert open_roles.may_operate("x") and open_roles.may_use_roles("x", ["any"]) is None
    allow_all = Acl()
    assert allow_all.may_register_agent(None) and allow_all.may_operate(None)
    assert allow_all.may_use_roles(None, ["r"]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("agents = [", "not valid TOML"),
        ('agent = ["a"]', "unknown key"),
        ('agents = "a"', "agents must be a list"),
        ("operators = [1]", "operators must hold non-empty strings"),
        ('agents = [""]', "non-empty"),
        ('roles = ["a"]', "roles must be a table"),
        ('[roles]\nbatch = "batch"', "roles.batch must be a list"),
    ],
)
def test_bad_acl_files_give_a_clear_error(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(AclError, match=expected) as info:
        Acl.load(path)
    assert str(path) in str(info.value)


def test_missing_acl_file(tmp_path: Path) -> None:
    with pytest.raises(AclError, match="cannot read ACL file"):
        Acl.load(tmp_path / "nope.toml")


def test_curve_server_and_clients_need_a_running_loop(keys: dict[str, Path]) -> None:
    curve = CurveServer(keys["master"], keys["authorized"])
    with pytest.raises(RuntimeError):
        ZmqServer.bind("tcp://127.0.0.1:0", curve=curve)
    with pytest.raises(RuntimeError):
        ZmqClient.connect("tcp://127.0.0.1:1", curve=CurveClient(keys["ops"], keys["master.pub"]))
