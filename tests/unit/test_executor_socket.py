"""The agent's executor socket: a Unix socket in the run directory by default, with the modes its
executors can use; TCP loopback when the path is too long or a bind is asked for; a stale socket
file from a dead agent removed before the same path is bound again."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import zmq
from agora.agent.containers.containerizer import AGENT_DIR_IN_ROOTFS, endpoint_in_image
from agora.agent.server.executor_socket import (
    TCP_FALLBACK,
    SocketModes,
    bind_executor_socket,
    choose_endpoint,
    ipc_path,
    socket_dir,
    socket_modes,
)

PRIVATE = SocketModes(directory=0o700, socket=0o600)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_modes_are_private_unless_executors_may_run_as_other_users() -> None:
    assert socket_modes(switch_user=True, euid=0) == SocketModes(0o711, 0o666)
    assert socket_modes(switch_user=False, euid=0) == PRIVATE
    assert socket_modes(switch_user=True, euid=1000) == PRIVATE


def test_the_default_is_the_unix_socket_in_the_run_dir() -> None:
    assert choose_endpoint("", "/var/lib/agora") == (
        "ipc:///var/lib/agora/run/executors.sock",
        "default",
    )
    assert choose_endpoint("tcp://127.0.0.1:0", "/w") == ("tcp://127.0.0.1:0", "--executor-bind")
    assert choose_endpoint("", "/w", has_ipc=False)[0] == TCP_FALLBACK


def test_a_path_too_long_for_a_unix_socket_falls_back_to_loopback() -> None:
    work_dir = "/" + "d" * (zmq.IPC_PATH_MAX_LEN - len("/run/executors.sock"))
    endpoint, why = choose_endpoint("", work_dir)
    assert endpoint == TCP_FALLBACK
    assert "longer than a Unix socket path" in why
    fits = work_dir[:-1]
    assert choose_endpoint("", fits)[0] == f"ipc://{fits}/run/executors.sock"


def test_ipc_path_and_the_endpoint_inside_an_image() -> None:
    assert ipc_path("ipc:///w/run/executors.sock") == "/w/run/executors.sock"
    assert ipc_path("tcp://127.0.0.1:5051") is None
    assert socket_dir("ipc:///w/run/executors.sock") == "/w/run"
    assert socket_dir("tcp://127.0.0.1:5051") is None
    assert endpoint_in_image("ipc:///w/run/executors.sock") == (
        f"ipc://{AGENT_DIR_IN_ROOTFS}/executors.sock"
    )
    assert endpoint_in_image("tcp://127.0.0.1:5051") == "tcp://127.0.0.1:5051"


def test_binds_the_socket_with_the_modes(tmp_path: Path) -> None:
    server = bind_executor_socket(None, "", str(tmp_path), PRIVATE)
    assert server is not None
    try:
        path = tmp_path / "run" / "executors.sock"
        assert server.endpoint == f"ipc://{path}"
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert (_mode(path.parent), _mode(path)) == (0o700, 0o600)
    finally:
        server.close()


def test_a_stale_socket_is_replaced_and_the_directory_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    path = run_dir / "executors.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, as after a SIGKILLed agent
    inode = os.stat(run_dir).st_ino
    modes = SocketModes(0o711, 0o666)
    server = bind_executor_socket(f"ipc://{path}", "", str(tmp_path), modes)
    assert server is not None
    try:
        assert server.endpoint == f"ipc://{path}"
        assert os.stat(run_dir).st_ino == inode  # containers' bind mounts still show it
        assert (_mode(run_dir), _mode(path)) == (0o711, 0o666)
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(path))  # somebody listens there again
        client.close()
    finally:
        server.close()


def test_a_file_in_the_sockets_place_is_left_alone_and_loopback_used(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    squatter = tmp_path / "run" / "executors.sock"
    squatter.write_text("not a socket\n")
    server = bind_executor_socket(f"ipc://{squatter}", "", str(tmp_path), PRIVATE)
    assert server is not None
    try:
        assert server.endpoint.startswith("tcp://127.0.0.1:")
        assert squatter.read_text() == "not a socket\n"
    finally:
        server.close()


def test_an_explicit_bind_that_fails_is_not_replaced(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert bind_executor_socket(None, f"tcp://127.0.0.1:{port}", str(tmp_path), PRIVATE) is None
    finally:
        taken.close()


@pytest.mark.parametrize("recorded", ["tcp://127.0.0.1:0", None])
def test_an_explicit_tcp_bind_makes_no_socket_file(tmp_path: Path, recorded: str | None) -> None:
    server = bind_executor_socket(recorded, "tcp://127.0.0.1:0", str(tmp_path), PRIVATE)
    assert server is not None
    try:
        assert server.endpoint.startswith("tcp://127.0.0.1:")
        assert not (tmp_path / "run").exists()
    finally:
        server.close()
