"""The rank-0 executor's side of the launcher: a unix socket that ``mpirun``'s launchers call.

Each connection carries one launch: the launcher sends ``run {host, cmd}``; the server names it
with a fresh id and hands it to ``on_launch``; the ``out``/``exit`` messages relayed back for
that id go to :meth:`LaunchServer.deliver`, which writes them to the connection and closes it
after ``exit``. A connection that closes before its ``exit`` (the launcher was killed, sent
garbage, or the server is closing) is reported once to ``on_cancel``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from agora.frameworks.mpi.protocol import (
    UNREACHABLE,
    ProtocolError,
    decode,
    encode,
    frame,
    read_frames,
)

__all__ = ["LaunchServer"]

log = structlog.get_logger(__name__)

_READ: int = 64 * 1024


@dataclass(eq=False)
class _Launch:
    writer: asyncio.StreamWriter
    done: bool = False  # exit written, or cancelled


class _BadFrame(Exception):
    pass


class LaunchServer:
    """Serves launchers on a unix socket. ``on_launch(id, host, cmd)`` starts a launch;
    ``on_cancel(id)`` says its launcher went away before the ``exit``."""

    def __init__(
        self,
        on_launch: Callable[[str, str, str], None],
        on_cancel: Callable[[str], None],
    ) -> None:
        self._on_launch = on_launch
        self._on_cancel = on_cancel
        self._server: asyncio.AbstractServer | None = None
        self._path: str | None = None
        self._ids = itertools.count(1)
        self._launches: dict[str, _Launch] = {}
        self._handlers: set[asyncio.Task[object]] = set()

    async def start(self, path: str) -> None:
        """Listen on ``path`` (a stale socket there is replaced); only this user may connect
        (mode 0600; keep it in a private directory)."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        self._path = path
        log.info("launch_server_listening", path=path)

    def pending(self) -> set[str]:
        """Launch ids whose ``exit`` has not been delivered and whose launcher is connected."""
        return set(self._launches)

    def deliver(self, id: str, message: bytes) -> None:
        """Write ``message`` (an encoded ``out`` or ``exit``) to launch ``id``'s launcher; after
        ``exit``, close that connection. Unknown or finished ids are ignored."""
        launch = self._launches.get(id)
        if launch is None:
            return
        try:
            kind = decode(message)["t"]
        except ProtocolError as exc:
            log.warning("launch_deliver_bad_message", id=id, error=str(exc))
            return
        if kind not in ("out", "exit"):
            log.warning("launch_deliver_unexpected", id=id, type=kind)
            return
        launch.writer.write(frame(message))
        if kind == "exit":
            launch.done = True
            del self._launches[id]
            launch.writer.close()  # after the buffered frames are flushed

    async def close(self) -> None:
        """Stop listening, close every connection (``on_cancel`` for each unfinished launch),
        and remove the socket file."""
        if self._server is not None:
            self._server.close()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            self._path = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        id: str | None = None
        try:
            host, cmd = await self._read_run(reader)
            id = f"l{next(self._ids)}"
            self._launches[id] = _Launch(writer)
            log.info("launch_requested", id=id, host=host)
            try:
                self._on_launch(id, host, cmd)
            except Exception:
                log.exception("launch_failed", id=id)
                self.deliver(id, encode("exit", id=id, code=UNREACHABLE))
            # A launcher sends nothing more: wait for the connection to end, either way.
            if await reader.read(_READ):
                log.warning("launch_unexpected_data", id=id)
        except (_BadFrame, ProtocolError) as exc:
            log.warning("launch_bad_frame", id=id, error=str(exc))
        except (ConnectionError, OSError) as exc:
            log.info("launch_connection_error", id=id, error=str(exc))
        finally:
            self._handlers.discard(task)
            launch = self._launches.pop(id, None) if id is not None else None
            writer.close()
            if id is not None and launch is not None and not launch.done:
                launch.done = True
                log.info("launch_cancelled", id=id)
                try:
                    self._on_cancel(id)
                except Exception:
                    log.exception("launch_cancel_failed", id=id)

    async def _read_run(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        buffer = bytearray()
        while True:
            data = await reader.read(_READ)
            if not data:
                raise _BadFrame("connection closed before run")
            buffer += data
            frames = read_frames(buffer)
            if not frames:
                continue
            if len(frames) > 1 or buffer:
                raise _BadFrame("data after run")
            message = decode(frames[0])
            if message["t"] != "run":
                raise _BadFrame(f"expected run, got {message['t']}")
            return str(message["host"]), str(message["cmd"])
