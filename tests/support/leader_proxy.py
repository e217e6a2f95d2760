"""A TCP address that always reaches the leading master, as a load balancer health-checking
``/health`` (or a DNS name such as Mesos-DNS's ``leader.mesos``) gives Mesos clients that know
one master address only.

Each connection accepted is piped to whichever master says it leads at that moment; when no master
does (an election under way), the connection waits for one, up to a deadline. Connections piped
to a master that dies are closed, and the client reconnects through the proxy.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence

#: Seconds a new connection may wait for a leader before it is closed.
LEADER_DEADLINE = 20.0


def leading(http_urls: Sequence[str]) -> tuple[str, int] | None:
    """(host, port) of the one master whose ``/health`` says it leads, or None."""
    found = []
    for url in http_urls:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
                if json.load(resp).get("leading"):
                    host, _, port = url.removeprefix("http://").rpartition(":")
                    found.append((host, int(port)))
        except (OSError, ValueError):
            continue
    return found[0] if len(found) == 1 else None


class LeaderProxy:
    """``with LeaderProxy(urls) as proxy:`` clients connect to ``proxy.address``."""

    def __init__(self, http_urls: Sequence[str]) -> None:
        self._urls = list(http_urls)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> LeaderProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5.0)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._connect, client)

    def _connect(self, client: socket.socket) -> None:
        deadline = time.monotonic() + LEADER_DEADLINE
        upstream = None
        while upstream is None and not self._stopped.is_set() and time.monotonic() < deadline:
            where = leading(self._urls)
            if where is None:
                time.sleep(0.1)
                continue
            try:
                upstream = socket.create_connection(where, timeout=2.0)
            except OSError:
                time.sleep(0.1)
        if upstream is None:
            client.close()
            return
        client.settimeout(None)
        upstream.settimeout(None)
        with self._lock:
            self._sockets |= {client, upstream}
        self._spawn(self._pipe, upstream, client)
        self._pipe(client, upstream)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):  # either side gone: the connection is over
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets -= {source, sink}
            source.close()
