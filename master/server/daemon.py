"""The master's I/O shell: the ROUTER socket and the timers on one side, ``Master`` on the other.

One task receives: it takes a frame, drains every frame already queued (``recv_nowait``) and, for
each, decodes (the transport did), checks the ACL, calls ``Master.handle`` and sends the resulting
actions at once. A second task ticks the core every ``tick_interval`` seconds and reports peers
silent for ``peer_timeout`` as disconnected. Both go through one lock around "call the core, send
its actions", so messages leave in the order the core produced them.

The core is given wall-clock time (``time.time()``): it stamps task statuses with ``now`` and all
of its timers are relative. Peer liveness uses the monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import structlog
import zmq
from agora.master.core import Master, Send
from agora.master.server.config import DaemonSettings
from agora.master.server.stats import DaemonStats
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    Error,
    ErrorCode,
    Heartbeat,
    Message,
    RegisterAgent,
    ReregisterAgent,
    Subscribe,
    Subscribed,
    Teardown,
    UnregisterAgent,
)
from agora.sdk.messages.operator import OperatorKill
from agora.sdk.transport import Acl, CurveServer, Received, Server, ZmqServer

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["MasterDaemon", "serve"]

log = structlog.get_logger(__name__)

#: Frames handled per receive turn before yielding to the ticker.
MAX_BATCH: Final = 1024


class MasterDaemon:
    """Moves messages between a :class:`Server` and a :class:`Master` until :meth:`stop`."""

    def __init__(
        self,
        core: Master,
        server: Server,
        *,
        tick_interval: float,
        peer_timeout: float,
        acl: Acl | None = None,
        authenticated: bool = False,
        clock: Callable[[], float] = time.time,
        debug: bool = False,
        stats: DaemonStats | None = None,
    ) -> None:
        """``authenticated``: CURVE is on, so every frame carries the sender's principal."""
        self._core = core
        self._server = server
        self._tick_interval = tick_interval
        self._peer_timeout = peer_timeout
        self._acl = acl
        self._authenticated = authenticated
        self._checked = authenticated or acl is not None
        self._clock = clock
        self._debug = debug
        #: Plain counters for the operator API's metrics, read at scrape time.
        self.stats = stats if stats is not None else DaemonStats()
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        #: peer -> monotonic time of its last frame; insertion order = least recently heard first.
        self._last_seen: dict[str, float] = {}

    @property
    def core(self) -> Master:
        return self._core

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return (safe from a signal handler)."""
        self._stopped.set()

    async def run(self) -> int:
        """Serve until :meth:`stop`; 0 on a requested stop, 1 if a loop died."""
        workers: list[asyncio.Task[None]] = [
            asyncio.create_task(self._receive_loop(), name="master-receive"),
            asyncio.create_task(self._tick_loop(), name="master-tick"),
        ]
        stopper = asyncio.create_task(self._stopped.wait(), name="master-stop")
        everything: list[asyncio.Task[Any]] = [*workers, stopper]
        rc = 0
        try:
            done, _ = await asyncio.wait(everything, return_when=asyncio.FIRST_COMPLETED)
            for task in workers:
                if task in done:
                    exc = task.exception()
                    log.error("master_loop_died", loop=task.get_name(), exc_info=exc)
                    rc = 1
        finally:
            for task in everything:
                task.cancel()
            await asyncio.gather(*everything, return_exceptions=True)
        return rc

    # ------------------------------------------------------------------ receiving

    async def _receive_loop(self) -> None:
        server = self._server
        while True:
            received: Received | None = await server.recv()
            handled = 0
            while received is not None:
                await self._dispatch(received)
                handled += 1
                if handled >= MAX_BATCH:
                    break
                received = server.recv_nowait()
            # One event-triggered allocation for the whole burst, not one per message.
            async with self._lock:
                started = time.perf_counter()
                actions = self._core.allocate_freed(self._clock())
                self.stats.observe_allocation(time.perf_counter() - started)
                await self._perform(actions)
            if handled >= MAX_BATCH:
                await asyncio.sleep(0)  # let the ticker run under a sustained burst

    async def _dispatch(self, received: Received) -> None:
        peer = received.peer
        seen = self._last_seen
        seen.pop(peer, None)
        seen[peer] = time.monotonic()
        message = received.message
        if message is None:
            self.stats.bad_frames_received += 1
            await self._bad_frame(peer, received.error)
            return
        self.stats.messages_received += 1
        if type(message) is Heartbeat:
            return  # liveness only
        if self._checked:
            checked = self._authorize(peer, message, received.principal)
            if isinstance(checked, Send):
                async with self._lock:
                    await self._perform((checked,))
                return
            message = checked
        if self._debug:
            log.debug("received", peer=peer, message=message.NAME)
        if type(message) in _LOGGED_CALLS:
            log.info(_LOGGED_CALLS[type(message)], peer=peer, **_fields(message))
        async with self._lock:
            try:
                actions = self._core.handle(peer, message, self._clock(), allocate=False)
            except Exception:
                log.exception("core_failed", peer=peer, message=message.NAME)
                actions = [self._error(peer, ErrorCode.INTERNAL, f"{message.NAME} failed")]
            await self._perform(actions)

    async def _bad_frame(self, peer: str, error: ProtocolError | None) -> None:
        reason = str(error) if error is not None else "bad frame"
        log.warning("bad_frame", peer=peer, error=reason)
        async with self._lock:
            await self._perform((self._error(peer, ErrorCode.BAD_REQUEST, reason),))

    def _authorize(self, peer: str, message: Message, principal: str | None) -> Message | Send:
        """The message to hand the core, or the ERROR FORBIDDEN to answer instead.

        With CURVE, a SUBSCRIBE's ``framework_info.principal`` must be the connection's principal
        (it is filled in when left empty). The ACL (if any) is checked against the principal,
        which is None when CURVE is off (then only ``"*"`` entries match).
        """
        authenticated = self._authenticated
        if authenticated and principal is None:  # the ZAP handler admitted no such peer
            return self._forbid(peer, principal, message, "unauthenticated connection")
        acl = self._acl
        if isinstance(message, Subscribe):
            info = message.framework_info
            if authenticated and info.principal is not None and info.principal != principal:
                why = f"framework principal {info.principal!r} is not the connection's"
                return self._forbid(peer, principal, message, why)
            if acl is not None:
                denied = acl.may_use_roles(principal, info.roles)
                if denied is not None:
                    why = f"role {denied!r} is not allowed"
                    return self._forbid(peer, principal, message, why)
            if authenticated and info.principal is None:
                message = replace(message, framework_info=replace(info, principal=principal))
        elif acl is None:
            pass
        elif isinstance(message, RegisterAgent | ReregisterAgent):
            if not acl.may_register_agent(principal):
                return self._forbid(peer, principal, message, "may not register agents")
        elif isinstance(message, OperatorKill) and not acl.may_operate(principal):
            return self._forbid(peer, principal, message, "may not make operator calls")
        return message

    def _forbid(self, peer: str, principal: str | None, message: Message, why: str) -> Send:
        log.warning("forbidden", peer=peer, principal=principal, message=message.NAME, reason=why)
        return self._error(peer, ErrorCode.FORBIDDEN, f"{message.NAME} forbidden: {why}")

    def _error(self, peer: str, code: ErrorCode, text: str) -> Send:
        return Send(to=peer, message=Error(message=text, code=code), epoch=self._core.epoch)

    # ------------------------------------------------------------------ timers

    async def _tick_loop(self) -> None:
        interval = self._tick_interval
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                now = self._clock()
                started = time.perf_counter()
                try:
                    actions = self._core.tick(now)
                except Exception:
                    log.exception("core_tick_failed")
                    actions = []
                self.stats.observe_allocation(time.perf_counter() - started)
                await self._perform(actions)
                await self._expire_peers(now)

    async def _expire_peers(self, now: float) -> None:
        seen = self._last_seen
        if not seen:
            return
        cutoff = time.monotonic() - self._peer_timeout
        silent: list[str] = []
        for peer, at in seen.items():
            if at > cutoff:
                break
            silent.append(peer)
        for peer in silent:
            del seen[peer]
            if self._debug:
                log.debug("peer_silent", peer=peer)
            try:
                actions = self._core.disconnected(peer, now)
            except Exception:
                log.exception("core_disconnected_failed", peer=peer)
                continue
            await self._perform(actions)

    # ------------------------------------------------------------------ sending

    async def _perform(self, actions: Iterable[Send]) -> None:
        send = self._server.send
        for action in actions:
            message = action.message
            if type(message) in _LOGGED_EVENTS:
                self._log_event(action)
            try:
                delivered = await send(action.to, message, action.epoch)
            except (ProtocolError, zmq.ZMQError) as exc:
                log.error("send_failed", peer=action.to, message=message.NAME, error=str(exc))
                continue
            if not delivered and self._debug:
                log.debug("undeliverable", peer=action.to, message=message.NAME)

    def _log_event(self, action: Send) -> None:
        message = action.message
        if isinstance(message, AgentRegistered | AgentReregistered):
            agent = self._core.state.agents.get(message.agent_id)
            log.info(
                _LOGGED_EVENTS[type(message)],
                agent_id=message.agent_id,
                hostname=agent.info.hostname if agent is not None else None,
                peer=action.to,
            )
        elif isinstance(message, Subscribed):
            fw = self._core.state.frameworks.get(message.framework_id)
            log.info(
                "framework_subscribed",
                framework_id=message.framework_id,
                name=fw.info.name if fw is not None else None,
                roles=list(fw.info.roles) if fw is not None else None,
                peer=action.to,
            )


_LOGGED_EVENTS: Final[dict[type[Message], str]] = {
    AgentRegistered: "agent_registered",
    AgentReregistered: "agent_reregistered",
    Subscribed: "framework_subscribed",
}

_LOGGED_CALLS: Final[dict[type[Message], str]] = {
    Teardown: "framework_teardown",
    UnregisterAgent: "agent_unregistering",
    OperatorKill: "operator_kill",
}


def _fields(message: Message) -> dict[str, object]:
    if isinstance(message, Teardown):
        return {"framework_id": message.framework_id}
    if isinstance(message, OperatorKill):
        return {"task_id": message.task_id, "framework_id": message.framework_id}
    return {}


# ---------------------------------------------------------------------- the process


async def serve(settings: DaemonSettings) -> int:
    """Bind, serve until SIGTERM/SIGINT, clean up. Returns the process exit status."""
    try:
        lock = _lock_work_dir(settings.work_dir)
    except OSError as exc:
        log.error("work_dir_unusable", work_dir=str(settings.work_dir), error=str(exc))
        return 1
    try:
        return await _serve_locked(settings)
    finally:
        lock.close()


async def _serve_locked(settings: DaemonSettings) -> int:
    curve: CurveServer | None = None
    acl: Acl | None = None
    try:
        if settings.curve_secret_key is not None and settings.curve_authorized_keys is not None:
            curve = CurveServer(settings.curve_secret_key, settings.curve_authorized_keys)
        if settings.acl is not None:
            acl = Acl.load(settings.acl)
    except (OSError, ValueError) as exc:
        log.error("security_config_unusable", error=str(exc))
        return 1
    try:
        server = ZmqServer.bind(settings.bind, curve=curve)
    except (OSError, ValueError, zmq.ZMQError) as exc:
        log.error("bind_failed", bind=settings.bind, error=str(exc))
        return 1
    endpoint_file = settings.endpoint_file
    http: web.AppRunner | None = None
    try:
        config = replace(settings.master, address=server.endpoint)
        daemon = MasterDaemon(
            Master(config),
            server,
            tick_interval=settings.tick_interval,
            peer_timeout=settings.peer_timeout,
            acl=acl,
            authenticated=curve is not None,
            debug=settings.log_level == "debug",
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.stop)
        if settings.http_port is not None:
            # Imported here: aiohttp and prometheus_client cost a master without HTTP ~150 ms.
            from agora.master.server.http import make_app, start_http

            try:
                app = make_app(daemon.core, daemon.stats)
                http, http_url = await start_http(app, settings.http_bind, settings.http_port)
            except OSError as exc:
                log.error(
                    "http_bind_failed",
                    host=settings.http_bind,
                    port=settings.http_port,
                    error=str(exc),
                )
                return 1
            log.info("http_listening", url=http_url)
            if endpoint_file is not None:
                # Before the endpoint file: whoever sees that one finds this one too.
                _write_atomically(_http_file(endpoint_file), http_url + "\n")
        if endpoint_file is not None:
            _write_atomically(endpoint_file, server.endpoint + "\n")
        log.info(
            "master_bound",
            endpoint=server.endpoint,
            master_id=config.master_id,
            epoch=config.epoch,
            curve=curve is not None,
            acl=str(settings.acl) if settings.acl is not None else None,
            work_dir=str(settings.work_dir),
            pid=os.getpid(),
        )
        rc = await daemon.run()
        log.info("master_stopped", endpoint=server.endpoint, status=rc)
        return rc
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if http is not None:
            try:
                await http.cleanup()
            except Exception:
                log.exception("http_shutdown_failed")
        server.close()
        if endpoint_file is not None:
            for path in (endpoint_file, _http_file(endpoint_file)):
                with contextlib.suppress(OSError):
                    path.unlink()


def _lock_work_dir(work_dir: Path) -> IO[str]:
    """Create the work dir and take its lock: one master per work dir."""
    work_dir.mkdir(parents=True, exist_ok=True)
    handle = (work_dir / "master.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise OSError(f"another master holds {work_dir / 'master.lock'}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _http_file(endpoint_file: Path) -> Path:
    """Where the operator API's URL goes: ``<endpoint-file>.http``."""
    return endpoint_file.with_name(endpoint_file.name + ".http")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
