"""The client side of master failover: one DEALER per master, traffic only with the leader.

A :class:`MasterLink` connects a :class:`ZmqClient` to every master it knows and follows the one
that leads. It switches to a master only when that master itself says it leads (``LEADER`` with
``leader == responder``) at an epoch higher than the one it follows, or when the master it
followed re-confirms at an epoch at least as high. Anything else a master says about the leader is
a hint: the named master is asked ``DETECT_LEADER`` at once. ``LEADER`` frames are consumed here;
``recv`` only ever returns frames of the current leader.

Given a single endpoint, the link assumes that master leads as soon as its handshake completes
(masters without election never answer ``DETECT_LEADER``); once any master speaks ``LEADER`` the
link follows the election rules above.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import structlog
import zmq
import zmq.asyncio
from agora.sdk.discovery import normalize_endpoint
from agora.sdk.messages import DetectLeader, LeaderInfo, Message
from agora.sdk.transport._zmq_io import DEFAULT_HWM, make_context
from agora.sdk.transport.base import Client, Dial, Received, TransportClosed
from agora.sdk.transport.zmq_client import ZmqClient

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["MAX_MASTERS", "MasterLink"]

log = structlog.get_logger(__name__)

#: Most master sockets one link keeps (the group size is 1, 3 or 5; names may be spelled twice).
MAX_MASTERS: Final = 16
#: How long one DETECT_LEADER may wait on a backed-up socket before the prober moves on.
_PROBE_SEND_TIMEOUT: Final = 0.5
_JITTER: Final = 0.2
#: Longest wait between ZeroMQ's attempts to reach a master that is down. Short, so that after
#: the whole group was down a while every client is connected again (and hears the new leader's
#: push) within about a second of the masters' return, not after a 5 s backoff.
RECONNECT_MAX: Final = 1.0
Callback = Callable[[], None]


class MasterLink:
    """A :class:`~agora.sdk.transport.Client` that talks to whichever master leads.

    Create with :meth:`connect` from a coroutine. ``connected`` is True iff a leader is known and
    its socket's handshake is up; ``on_connected`` / ``on_disconnected`` run on those transitions
    (a switch of leader fires both, in that order). ``send`` with no leader drops the message.
    """

    def __init__(
        self,
        endpoints: tuple[str, ...],
        *,
        curve: CurveClient | None,
        context: zmq.asyncio.Context,
        owns_context: bool,
        on_connected: Callback | None,
        on_disconnected: Callback | None,
        probe_interval: float,
        search_interval: float,
        hwm: int,
        dial: Dial | None = None,
    ) -> None:
        self._given = endpoints
        self._dial = dial
        self._curve = curve
        self._context = context
        self._owns_context = owns_context
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._probe_interval = probe_interval
        self._search_interval = search_interval
        self._hwm = hwm
        self._clients: dict[str, Client] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._aliases: dict[str, str] = {}  # a master's own name -> the endpoint we dial
        self._refused: set[str] = set()  # names beyond MAX_MASTERS
        self._inbox: deque[tuple[str, Received]] = deque()
        self._readers: list[asyncio.Future[None]] = []
        self._pending_probes: set[str] = set()
        self._wake = asyncio.Event()
        self._up = asyncio.Event()
        # Several masters (or any master speaking LEADER): follow only confirmed leaders.
        self._elected = len(endpoints) > 1
        self._closed = False
        self.leader: str | None = None
        self.epoch: int = 0
        self._last_leader: str | None = None
        self._confirmed_once = False
        self._announced: str | None = None
        self._prober: asyncio.Task[None] | None = None

    @classmethod
    def connect(
        cls,
        endpoints: Sequence[str],
        *,
        curve: CurveClient | None = None,
        context: zmq.asyncio.Context | None = None,
        on_connected: Callback | None = None,
        on_disconnected: Callback | None = None,
        probe_interval: float = 5.0,
        search_interval: float = 0.25,
        hwm: int = DEFAULT_HWM,
        dial: Dial | None = None,
    ) -> MasterLink:
        """Connect to every master in ``endpoints``; must be called with a running event loop.

        ``dial``: how to make the socket to one master instead of ZeroMQ (the in-process
        transport's ``lambda e, up, down: hub.client(name_of(e), on_connected=up,
        on_disconnected=down)``, for masters in one process); ``curve`` is then unused."""
        loop = asyncio.get_running_loop()
        unique = tuple(dict.fromkeys(normalize_endpoint(e) for e in endpoints if e.strip()))
        if not unique:
            raise ValueError("MasterLink needs at least one master endpoint")
        if probe_interval <= 0 or search_interval <= 0:
            raise ValueError("probe_interval and search_interval must be positive")
        if len(unique) > MAX_MASTERS:
            log.warning("master_link_too_many_masters", given=len(unique), limit=MAX_MASTERS)
        ctx, owned = make_context(context)
        link = cls(
            unique[:MAX_MASTERS],
            curve=curve,
            context=ctx,
            owns_context=owned,
            on_connected=on_connected,
            on_disconnected=on_disconnected,
            probe_interval=probe_interval,
            search_interval=search_interval,
            hwm=hwm,
            dial=dial,
        )
        try:
            for endpoint in link._given:
                link._add(endpoint, strict=True)
        except BaseException:
            link.close()
            raise
        link._prober = loop.create_task(link._probe_loop())
        return link

    # -- the Client protocol ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The current leader's endpoint, or the first endpoint while none is known."""
        return self.leader if self.leader is not None else self._given[0]

    @property
    def connected(self) -> bool:
        return self._announced is not None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def masters(self) -> tuple[str, ...]:
        """Every master endpoint the link has a socket for."""
        return tuple(self._clients)

    @property
    def handshake_error(self) -> str | None:
        """Why the last handshake failed: of the leader's socket, else of any socket."""
        clients = self._clients
        if self.leader is not None:
            return _handshake_error(clients[self.leader])
        return next((e for c in clients.values() if (e := _handshake_error(c))), None)

    def recv_nowait(self) -> Received | None:
        if self._closed:
            raise TransportClosed("master link is closed")
        return self._inbox.popleft()[1] if self._inbox else None

    async def recv(self) -> Received:
        while True:
            received = self.recv_nowait()
            if received is not None:
                return received
            future = asyncio.get_running_loop().create_future()
            self._readers.append(future)
            try:
                await future
            finally:
                if future in self._readers:
                    self._readers.remove(future)

    async def send(self, message: Message, epoch: int = 0) -> None:
        """Send to the leader; with no leader known the message is dropped (callers re-send
        from ``on_connected``)."""
        if self._closed:
            raise TransportClosed("master link is closed")
        if self.leader is None:
            log.debug("master_link_send_dropped", message=message.NAME, why="no leader")
            return
        await self._clients[self.leader].send(message, epoch)

    async def wait_leader(self, timeout: float) -> str:
        """The leader's endpoint once the link is connected; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if self._closed:
                raise TransportClosed("master link is closed")
            if self._announced is not None:
                return self._announced
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no master confirmed its leadership within {timeout} s")
            try:
                async with asyncio.timeout(left):
                    await self._up.wait()
            except TimeoutError:
                continue

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._prober is not None:
            self._prober.cancel()
        for task in self._pumps.values():
            task.cancel()
        for client in self._clients.values():
            client.close()
        self._inbox.clear()
        error = TransportClosed("master link is closed")
        for future in self._readers:
            if not future.done():
                future.set_exception(error)
        self._up.set()  # wake wait_leader, which then raises
        if self._owns_context:
            self._context.destroy(linger=0)

    # -- sockets -----------------------------------------------------------------------------

    def _add(self, endpoint: str, *, strict: bool = False) -> None:
        if endpoint in self._clients or self._closed:
            return
        if len(self._clients) >= MAX_MASTERS:
            if endpoint not in self._refused:  # warn once: every LEADER names them again
                self._refused.add(endpoint)
                log.warning("master_link_too_many_masters", endpoint=endpoint, limit=MAX_MASTERS)
            return
        up, down = (lambda: self._socket_up(endpoint)), (lambda: self._socket_down(endpoint))
        try:
            client: Client
            if self._dial is not None:
                client = self._dial(endpoint, up, down)
            else:
                client = ZmqClient.connect(
                    endpoint,
                    curve=self._curve,
                    context=self._context,
                    on_connected=up,
                    on_disconnected=down,
                    hwm=self._hwm,
                    reconnect_max=RECONNECT_MAX,
                )
        except zmq.ZMQError as exc:
            if strict:
                raise
            log.warning("master_link_bad_endpoint", endpoint=endpoint, error=str(exc))
            return
        self._clients[endpoint] = client
        self._pumps[endpoint] = asyncio.get_running_loop().create_task(self._pump(endpoint))
        log.debug("master_link_master_added", endpoint=endpoint)

    def _resolve(self, name: str) -> str:
        endpoint = normalize_endpoint(name)
        return self._aliases.get(endpoint, endpoint)

    def _socket_up(self, endpoint: str) -> None:
        if not self._elected and self.leader is None and self._last_leader in (None, endpoint):
            self._adopt(endpoint, self.epoch)  # a single master without election: it leads
        elif self._elected:
            self._probe_soon(endpoint)
        self._update()

    def _socket_down(self, endpoint: str) -> None:
        if endpoint == self.leader:
            log.info("master_link_leader_unreachable", leader=endpoint, epoch=self.epoch)
            self._drop_leader()
        self._update()

    async def _pump(self, endpoint: str) -> None:
        client = self._clients[endpoint]
        while True:
            try:
                received = await client.recv()
            except TransportClosed:
                return
            try:
                self._on_frame(endpoint, received)
            except Exception:
                log.exception("master_link_frame_failed", endpoint=endpoint)

    # -- leadership --------------------------------------------------------------------------

    def _on_frame(self, endpoint: str, received: Received) -> None:
        if isinstance(received.message, LeaderInfo):
            self._on_leader_info(endpoint, received.message)
            return
        if endpoint == self.leader:
            if received.epoch > self.epoch:
                self._probe_soon(endpoint)  # re-elected under us: let it confirm the new epoch
            self._deliver(endpoint, received)
            return
        if received.epoch > self.epoch:
            log.debug("master_link_higher_epoch_seen", endpoint=endpoint, epoch=received.epoch)
            self._probe_soon(endpoint)

    def _on_leader_info(self, endpoint: str, info: LeaderInfo) -> None:
        self._aliases.setdefault(normalize_endpoint(info.responder), endpoint)
        if not self._elected:
            self._elected = True
            self._wake.set()
        for name in info.masters:
            self._add(self._resolve(name))
        claims = info.leader is not None and normalize_endpoint(info.leader) == normalize_endpoint(
            info.responder
        )
        if claims:
            self._on_claim(endpoint, info.epoch)
        else:
            if endpoint == self.leader:
                log.info("master_link_leader_stepped_down", leader=endpoint, says=info.leader)
                self._drop_leader()
            if info.leader is not None and info.epoch > self.epoch:
                target = self._resolve(info.leader)
                self._add(target)
                self._probe_soon(target)
        self._update()

    def _on_claim(self, endpoint: str, epoch: int) -> None:
        same = endpoint == self.leader or (self.leader is None and endpoint == self._last_leader)
        if same and epoch >= self.epoch:
            if endpoint != self.leader:
                log.info("master_link_leader_reconfirmed", leader=endpoint, epoch=epoch)
            self._adopt(endpoint, epoch)
        elif epoch > self.epoch or not self._confirmed_once:
            log.info("master_link_leader_changed", leader=endpoint, epoch=epoch, was=self.leader)
            self._adopt(endpoint, epoch)
        else:
            log.debug("master_link_stale_claim", endpoint=endpoint, epoch=epoch, current=self.epoch)

    def _adopt(self, endpoint: str, epoch: int) -> None:
        previous = self._last_leader
        if previous is not None and previous != endpoint:
            before = len(self._inbox)
            self._inbox = deque(item for item in self._inbox if item[0] != previous)
            if len(self._inbox) != before:
                log.debug("master_link_old_frames_dropped", count=before - len(self._inbox))
        self.leader = self._last_leader = endpoint
        self.epoch = max(self.epoch, epoch)
        self._confirmed_once = True

    def _drop_leader(self) -> None:
        self.leader = None
        self._wake.set()  # search now

    def _update(self) -> None:
        """Fire on_disconnected / on_connected when the announced leader changes."""
        if self._closed:
            return
        leader = self.leader
        target = leader if leader is not None and self._clients[leader].connected else None
        if target == self._announced:
            return
        if self._announced is not None:
            self._announced = None
            self._up.clear()
            log.info("master_link_disconnected")
            self._call(self._on_disconnected)
        if target is not None:
            self._announced = target
            self._up.set()
            log.info("master_link_connected", leader=target, epoch=self.epoch)
            self._call(self._on_connected)

    def _call(self, callback: Callback | None) -> None:
        if callback is None:
            return
        try:
            callback()
        except Exception:
            log.exception("master_link_callback_failed")

    def _deliver(self, endpoint: str, received: Received) -> None:
        self._inbox.append((endpoint, received))
        for future in self._readers:
            if not future.done():
                future.set_result(None)
                break

    # -- probing -----------------------------------------------------------------------------

    def _probe_soon(self, endpoint: str) -> None:
        if self._elected and endpoint not in self._pending_probes:
            self._pending_probes.add(endpoint)
            self._wake.set()

    def _interval(self) -> float:
        if self.leader is None:
            return self._search_interval
        return self._probe_interval * random.uniform(1 - _JITTER, 1 + _JITTER)

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        searching = True
        while True:
            self._wake.clear()
            timeout: float | None = None
            if self._elected:
                now = loop.time()
                if (self.leader is None) != searching:  # search mode changed: new schedule
                    searching = self.leader is None
                    next_round = now if searching else now + self._interval()
                if now >= next_round:
                    self._pending_probes.update(self._clients)
                    next_round = now + self._interval()
                await self._send_probes()
                timeout = max(0.0, next_round - loop.time())
            else:
                self._pending_probes.clear()
            try:
                async with asyncio.timeout(timeout):  # no inner task, unlike wait_for
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _send_probes(self) -> None:
        pending, self._pending_probes = self._pending_probes, set()
        for endpoint in pending:
            client = self._clients.get(endpoint)
            if client is None or not client.connected:
                continue  # probed when its handshake completes
            try:
                async with asyncio.timeout(_PROBE_SEND_TIMEOUT):
                    await client.send(DetectLeader())
            except TimeoutError:
                log.warning("master_link_probe_backlogged", endpoint=endpoint)
            except TransportClosed:
                return


def _handshake_error(client: Client) -> str | None:
    """A ZeroMQ socket's last handshake failure (other transports have none)."""
    error: str | None = getattr(client, "handshake_error", None)
    return error
