"""Finding the process at the other end of a loopback TCP connection (the Mesos executor bridge
serves only its own executor)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from agora.agent.executors.loopback_peer import descendants, holds_socket, socket_inode


def test_the_client_socket_is_found_in_the_process_that_holds_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server_port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", server_port))
        accepted, _ = server.accept()
        try:
            client_port = client.getsockname()[1]
            inode = socket_inode(client_port, server_port)
            assert inode is not None
            assert holds_socket([os.getpid()], inode) == os.getpid()
            assert socket_inode(server_port, client_port) != inode  # the server's end
            assert socket_inode(client_port, server_port + 1 if server_port < 65535 else 1) is None
        finally:
            client.close()
            accepted.close()
    assert socket_inode(client_port, server_port) is None  # closed: no longer established


def test_only_descendants_count() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert list(descendants(child.pid)) == [child.pid]
        assert child.pid in set(descendants(os.getpid()))
        assert os.getpid() not in set(descendants(child.pid))
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port)) as mine:
                inode = socket_inode(mine.getsockname()[1], port)
                assert inode is not None
                assert holds_socket(descendants(child.pid), inode) is None  # ours, not theirs
    finally:
        child.kill()
        child.wait()
