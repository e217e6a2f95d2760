"""Three master processes on ephemeral ports, each serving its operator HTTP API, for tests that
stop, resume or kill masters and read what each says over HTTP.

Requests can be written while a master is stopped (SIGSTOP) on a connection opened before: the
kernel keeps the bytes, and the master reads them the moment it resumes (:class:`RawRequest`).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agora.sdk.cli.cluster import free_ports

from support.master_process import clean_env
from support.polling import wait_for

#: Seconds a master may take to bind, to answer, or to exit once told to.
DEADLINE = 10.0


class HttpGroup:
    """Masters started with ``start``; all of them stopped on the way out of :func:`http_group`."""

    def __init__(self, tmp: Path, election_timeout: float) -> None:
        self.tmp = tmp
        self.election_timeout = election_timeout
        self.endpoints = [f"tcp://127.0.0.1:{p}" for p in free_ports(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _file(self, endpoint: str) -> Path:
        return self.tmp / f"master-{self.endpoints.index(endpoint)}.endpoint"

    def start(self, endpoint: str) -> None:
        i = self.endpoints.index(endpoint)
        t = self.election_timeout
        log = open(self.tmp / f"master-{i}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.procs[endpoint] = subprocess.Popen(
            [
                *(sys.executable, "-m", "agora.master.server"),
                *("--bind", endpoint, "--advertise", endpoint),
                *("--masters", ",".join(self.endpoints), "--insecure"),
                *("--work-dir", str(self.tmp / f"master-{i}")),
                *("--endpoint-file", str(self._file(endpoint))),
                *("--http-port", "0"),
                *("--election-timeout", str(t), "--election-heartbeat", str(t / 10)),
                *("--history", str(self.tmp / "history.jsonl")),
                *("--log-format", "json"),
            ],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def http_url(self, endpoint: str) -> str:
        """The master's operator API, once it serves it."""
        http_file = self._file(endpoint).with_name(self._file(endpoint).name + ".http")

        def ready() -> str | None:
            proc = self.procs[endpoint]
            if proc.poll() is not None:
                raise AssertionError(f"master {endpoint} exited {proc.returncode}")
            return (http_file.exists() and http_file.read_text().strip()) or None

        return wait_for(ready, DEADLINE, f"{endpoint}'s HTTP API")

    def health(self, endpoint: str) -> dict[str, Any] | None:
        """``GET /health`` (None when it does not answer within a second)."""
        try:
            with urllib.request.urlopen(self.http_url(endpoint) + "/health", timeout=1.0) as resp:
                body: dict[str, Any] = json.load(resp)
                return body
        except (OSError, urllib.error.URLError):
            return None

    def leader(self, among: list[str] | None = None) -> tuple[str, int] | None:
        """(endpoint, epoch) once exactly one of ``among`` (default: all running) says it leads."""
        claims = []
        for endpoint in among if among is not None else list(self.procs):
            body = self.health(endpoint)
            if body is not None and body.get("leading"):
                claims.append((endpoint, int(body["epoch"])))
        return claims[0] if len(claims) == 1 else None

    def signal(self, endpoint: str, sig: signal.Signals) -> None:
        self.procs[endpoint].send_signal(sig)

    def kill(self, endpoint: str) -> None:
        """SIGKILL the master and reap it (it is not restarted)."""
        proc = self.procs.pop(endpoint)
        proc.kill()
        proc.wait(timeout=DEADLINE)

    def state(self, endpoint: str, timeout: float = 30.0) -> dict[str, Any]:
        """``GET /state`` of the master (the group runs ``--insecure``: no token needed)."""
        with urllib.request.urlopen(self.http_url(endpoint) + "/state", timeout=timeout) as resp:
            body: dict[str, Any] = json.load(resp)
            return body

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=DEADLINE)
        self.procs.clear()


@contextmanager
def http_group(tmp: Path, election_timeout: float = 0.5) -> Iterator[HttpGroup]:
    g = HttpGroup(tmp, election_timeout)
    try:
        for endpoint in g.endpoints:
            g.start(endpoint)
        yield g
    finally:
        g.stop_all()


class RawRequest:
    """One HTTP/1.1 request on a connection opened now, sent later with :meth:`send` (which
    works while the server is stopped) and read with :meth:`response`."""

    def __init__(self, base_url: str, path: str) -> None:
        host, _, port = base_url.removeprefix("http://").rpartition(":")
        self._path = path
        self._host = host
        self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=DEADLINE)

    def send(self) -> None:
        request = f"GET {self._path} HTTP/1.1\r\nHost: {self._host}\r\nConnection: close\r\n\r\n"
        self._sock.sendall(request.encode())

    def response(self) -> tuple[int, str]:
        """(status, body) once the server closes the connection."""
        chunks = []
        while chunk := self._sock.recv(65536):
            chunks.append(chunk)
        self.close()
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, body.decode()

    def close(self) -> None:
        self._sock.close()
