"""The asyncio scheduler driver: one framework's link to the master.

``SchedulerDriver`` subscribes (retrying with jittered, capped backoff until SUBSCRIBED), turns
master events into :class:`~agora.sdk.scheduler.Scheduler` callbacks and master calls into
messages. Calls are plain methods that queue a message and return at once: they are safe from
callbacks (sync or async) and, for the calls, from other threads. One receive task dispatches
events in arrival order (draining bursts in one turn), one send task flushes queued calls, and
a supervisor task owns (re-)subscription, liveness and shutdown. What the driver knows and
decides (the subscription, the offers held, the queued calls, what an ERROR means) is its
sans-IO :class:`~agora.sdk.scheduler.core.SchedulerCore`; this module is the asyncio shell
around it, the calls are :mod:`agora.sdk.scheduler._call_methods` and the handling of each
event :mod:`agora.sdk.scheduler._events`.

Liveness: the driver sends HEARTBEAT every ``heartbeat_interval`` seconds. When the transport
reports the link down, or the master is silent for 3 x the ``heartbeat_interval_seconds`` it
announced in SUBSCRIBED, the scheduler's ``disconnected`` runs and the driver re-subscribes with
its framework id (tasks survive within the framework's ``failover_timeout``). Calls made while
re-subscribing are held and sent after SUBSCRIBED. Offers do not survive a re-subscription:
the driver reports every offer it still holds as rescinded when SUBSCRIBED arrives again.

Errors: an ERROR that ends the framework's subscription (FORBIDDEN on subscribing or after being
replaced by another scheduler, FRAMEWORK_REMOVED, BAD_REQUEST on the first SUBSCRIBE) reaches
``Scheduler.error`` and then stops the driver; ``run()``/``join()`` raise :class:`DriverError`.
Any other ERROR reaches ``Scheduler.error`` and the driver carries on.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from agora.sdk.discovery import master_address, parse_masters
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import FrameworkID
from agora.sdk.logs import default_logging
from agora.sdk.messages import (
    Error,
    ErrorCode,
    FrameworkInfo,
    Heartbeat,
    MasterInfo,
    Message,
    Reconcile,
    Teardown,
)
from agora.sdk.scheduler._backoff import RestartableWait
from agora.sdk.scheduler._call_methods import CallMethods
from agora.sdk.scheduler._events import EventHandlers
from agora.sdk.scheduler._guard import DriverError, SafeLog, short_traceback
from agora.sdk.scheduler.core import SchedulerCore
from agora.sdk.scheduler.scheduler import Scheduler
from agora.sdk.transport import Client, MasterLink, discover_client
from agora.sdk.transport.base import TransportClosed
from tenacity import AsyncRetrying, RetryCallState, retry_if_result

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["DriverError", "SchedulerDriver"]


log = SafeLog(__name__)

#: Most received messages dispatched in one turn of the receive loop.
_BATCH: Final = 1024
#: How long ``stop()`` waits for the master to confirm a TEARDOWN.
TEARDOWN_TIMEOUT: Final = 2.0
_CALLBACKS: Final = (
    "registered",
    "reregistered",
    "offers",
    "offer_rescinded",
    "status_update",
    "framework_message",
    "agent_lost",
    "executor_lost",
    "gang_expired",
    "error",
    "disconnected",
    "inverse_offers",
    "inverse_offer_rescinded",
)

#: ZmqClient.handshake_error when the server's ZAP handler refused our CURVE key.
_AUTH_FAILED: Final = "authentication failed"
#: Makes the driver's link to the master from its (link up, link down) callbacks.
LinkFactory: TypeAlias = Callable[[Callable[[], None], Callable[[], None]], Client]


class SchedulerDriver(CallMethods, EventHandlers):
    """Runs ``scheduler`` for ``framework`` against the master at ``master`` (asyncio).

    ``master``: a ZeroMQ endpoint; ``None`` finds it as the CLI does (``$AGORA_MASTER``, then the
    address ``agora local`` wrote under ``$AGORA_HOME``, then tcp://127.0.0.1:5050).

    ``framework.framework_id`` set: re-subscribe as that framework (scheduler failover).
    ``implicit_acknowledgements``: acknowledge each update that carries a uuid after
    ``status_update`` returns (or raises); otherwise call :meth:`acknowledge`.
    ``heartbeat_interval``: seconds between the driver's HEARTBEATs to the master.
    ``subscribe_backoff``: (floor, cap) in seconds of the jittered exponential wait between
    SUBSCRIBE attempts. A master confirming that it leads (its push or its answer to the link's
    probe) ends the wait at once and starts the backoff over from the floor.
    ``link``: how to reach the master instead of ZeroMQ: called with the two callbacks
    (link up, link down), it returns the :class:`~agora.sdk.transport.Client` to use, e.g.
    ``lambda up, down: hub.client("master", on_connected=up, on_disconnected=down)`` to run a
    framework in one process with a master on an :class:`~agora.sdk.transport.InprocHub`
    (``master`` and ``curve`` are then unused).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        framework: FrameworkInfo,
        master: str | None = None,
        *,
        implicit_acknowledgements: bool = True,
        curve: CurveClient | None = None,
        heartbeat_interval: float = 5.0,
        subscribe_backoff: tuple[float, float] = (0.25, 5.0),
        link: LinkFactory | None = None,
    ) -> None:
        if heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        lo, hi = subscribe_backoff
        if not 0 < lo <= hi:
            raise ValueError("subscribe_backoff must be (floor, cap) with 0 < floor <= cap")
        self._scheduler = scheduler
        self._core = SchedulerCore(framework, implicit_acknowledgements=implicit_acknowledgements)
        self._master = master_address(master)
        default_logging()
        # No credentials given: this user's keys in $AGORA_HOME/keys, if agora local wrote them.
        self._curve = curve if curve is not None else discover_client()
        self._heartbeat_interval = heartbeat_interval
        self._backoff = (lo, hi)
        self._subscribe_wait = RestartableWait(lo, hi)
        #: What callbacks receive as ``driver`` (the blocking driver substitutes itself).
        self._facade: Any = self
        self._callbacks: dict[str, Callable[..., Any]] = {
            # (a scheduler written before inverse offers, not based on Scheduler, ignores them)
            name: getattr(scheduler, name, getattr(Scheduler, name).__get__(scheduler))
            for name in _CALLBACKS
        }

        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._link = link
        self._client: Client | None = None
        self._tasks: list[asyncio.Task[None]] = []

        self._started = False
        self._need_subscribe = True
        self._notify_disconnected = False
        self._stop_requested = False
        self._failover = False
        self._error: DriverError | None = None
        self._last_seen = 0.0
        self._silence_limit: float | None = None

        self._handlers: dict[type[Message], Callable[[Any], Awaitable[None]]] = self.handlers()

    # ------------------------------------------------------------------ lifecycle

    @property
    def framework_id(self) -> FrameworkID | None:
        return self._core.framework_id

    @property
    def master_info(self) -> MasterInfo | None:
        return self._core.master_info

    @property
    def subscribed(self) -> bool:
        return self._core.subscribed

    @property
    def stopped(self) -> bool:
        return self._stop_requested

    async def start(self) -> None:
        """Connect and subscribe; returns once SUBSCRIBED (raises DriverError if refused)."""
        if self._started:
            await self._wait_subscribed()
            return
        if self._stop_requested:
            raise RuntimeError("this driver was stopped; create a new one")
        self._started = True
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._send_wake = asyncio.Event()
        self._kick = asyncio.Event()
        self._subscribe_wake = asyncio.Event()
        self._subscribed_evt = asyncio.Event()
        self._finished = asyncio.Event()
        self._teardown_ack = asyncio.Event()
        self._cb_lock = asyncio.Lock()
        try:
            up, down = self._on_transport_connected, self._on_transport_disconnected
            if self._link is not None:
                self._client = self._link(up, down)
            else:
                self._client = MasterLink.connect(
                    parse_masters(self._master),
                    curve=self._curve,
                    on_connected=up,
                    on_disconnected=down,
                )
        except BaseException:
            self._stop_requested = True
            self._finished.set()
            raise
        self._tasks = [
            loop.create_task(self._recv_loop(), name="agora-driver-recv"),
            loop.create_task(self._send_loop(), name="agora-driver-send"),
            loop.create_task(self._supervise(), name="agora-driver-supervisor"),
        ]
        if self._core.outbox:  # calls made before start() (framework id known up front)
            self._send_wake.set()
        try:
            await self._wait_subscribed()
        except asyncio.CancelledError:
            self._request_stop(True, None)  # e.g. start() under a timeout: do not leak the driver
            raise

    async def run(self) -> None:
        """Start if needed, then dispatch events until :meth:`stop` (or a fatal error).

        Cancelling ``run()`` (or ``start()``) aborts the driver as ``stop(failover=True)`` does.
        """
        try:
            await self.start()
            await self.join()
        except asyncio.CancelledError:
            self._request_stop(True, None)
            raise

    async def join(self) -> None:
        """Wait until the driver has stopped; raises DriverError if the master ended it."""
        if not self._started:
            if self._stop_requested:
                return
            raise RuntimeError("the driver was not started")
        await self._finished.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._error is not None:
            raise self._error

    def stop(self, *, failover: bool = False) -> None:
        """Stop the driver. Without ``failover`` the framework is torn down first (its tasks are
        killed); with it the master keeps the framework for its ``failover_timeout`` so another
        driver may re-subscribe with the same id. Returns at once; ``await join()`` to wait."""
        self._in_loop(self._request_stop, failover, None)

    def abort(self) -> None:
        """Same as ``stop(failover=True)``."""
        self.stop(failover=True)

    async def __aenter__(self) -> SchedulerDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        await self.join()

    def _request_stop(self, failover: bool, error: DriverError | None) -> None:
        if self._stop_requested:
            return
        self._stop_requested = True
        self._failover = failover
        if error is not None:
            self._error = error
        if self._started:
            self._kick.set()
            self._subscribe_wake.set()

    def _fail(self, error: DriverError) -> None:
        log.error("scheduler_driver_failed", error=str(error), code=_code(error.code))
        self._request_stop(True, error)

    async def _wait_subscribed(self) -> None:
        if not self._subscribed_evt.is_set() and not self._finished.is_set():
            waiters = [
                asyncio.ensure_future(self._subscribed_evt.wait()),
                asyncio.ensure_future(self._finished.wait()),
            ]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        if self._finished.is_set() or self._stop_requested:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._error is not None:
                raise self._error
            if not self._core.registered_once:
                raise DriverError("the driver stopped before it subscribed")

    # ------------------------------------------------------------------ supervisor

    async def _supervise(self) -> None:
        try:
            await self._supervise_loop()
            await self._graceful_stop()
        except Exception:
            log.exception("scheduler_driver_supervisor_failed")
            if self._error is None:
                self._error = DriverError("internal error in the scheduler driver")
        finally:
            self._close_now()

    async def _supervise_loop(self) -> None:
        hb = self._heartbeat_interval
        next_heartbeat = time.monotonic() + hb
        while not self._stop_requested:
            if self._notify_disconnected:
                self._notify_disconnected = False
                async with self._cb_lock:
                    await self._invoke("disconnected")
                continue
            if self._need_subscribe:
                await self._subscribe()
                continue
            now = time.monotonic()
            deadline = next_heartbeat
            limit = self._silence_limit
            if limit is not None and self._core.subscribed:
                deadline = min(deadline, self._last_seen + limit)
            delay = deadline - now
            if delay > 0 and not self._kick.is_set():
                try:
                    async with asyncio.timeout(delay):
                        await self._kick.wait()
                except TimeoutError:
                    pass
            self._kick.clear()
            now = time.monotonic()
            if self._stop_requested:
                break
            if limit is not None and self._core.subscribed and now - self._last_seen > limit:
                # If the loop itself was stalled (a slow callback), the master's messages may be
                # waiting unread: give the receive task a moment before calling the master gone.
                await asyncio.sleep(min(0.1, limit / 10))
                now = time.monotonic()
                if self._core.subscribed and now - self._last_seen > limit:
                    self._lost(f"master silent for {now - self._last_seen:.1f}s")
                continue
            if now >= next_heartbeat:
                next_heartbeat = now + hb
                if self._core.subscribed:
                    await self._send_now(Heartbeat())

    async def _subscribe(self) -> None:
        self._subscribe_wait = RestartableWait(*self._backoff)
        retrying = AsyncRetrying(
            wait=self._subscribe_wait,
            retry=retry_if_result(lambda done: not done),
            sleep=self._subscribe_sleep,
            before_sleep=_log_retry,
        )
        await retrying(self._subscribe_attempt)

    async def _subscribe_attempt(self) -> bool:
        core = self._core
        if core.subscribed or self._stop_requested:
            return True
        client = self._client
        assert client is not None
        if not client.connected and getattr(client, "handshake_error", None) == _AUTH_FAILED:
            # The master's ZAP handler rejected our CURVE key: retrying will not change that.
            why = f"the master at {self._master} rejected this client's key ({_AUTH_FAILED})"
            async with self._cb_lock:
                await self._invoke("error", why)
            self._fail(DriverError(why, ErrorCode.FORBIDDEN))
            return True
        if core.subscribe_pending(client.connected):
            return False  # the last SUBSCRIBE is queued for the coming connection
        message = core.subscribe()
        self._subscribe_wake.clear()
        try:
            await client.send(message)
        except ProtocolError as exc:
            self._fail(DriverError(f"cannot subscribe: {exc}", ErrorCode.BAD_REQUEST))
            return True
        return False

    async def _subscribe_sleep(self, seconds: float) -> None:
        if self._core.subscribed or self._stop_requested:
            return
        try:
            async with asyncio.timeout(seconds):
                await self._subscribe_wake.wait()
        except TimeoutError:
            pass

    def _lost(self, reason: str) -> None:
        """The subscription is gone (link down, master silent or forgot us): re-subscribe."""
        if self._stop_requested:
            return
        self._disconnected(self._core.lost(), reason)

    def _disconnected(self, was_subscribed: bool, reason: str) -> None:
        if self._stop_requested:
            return
        if was_subscribed:
            log.info("master_lost", reason=reason, framework_id=self.framework_id)
            self._subscribed_evt.clear()
            self._notify_disconnected = True
        self._need_subscribe = True
        self._kick.set()

    def _on_transport_connected(self) -> None:
        """A master confirmed that it leads (the link follows only such a confirmation, at an
        epoch at least the newest seen): subscribe to it now and start the backoff over, however
        long it had grown while no master led."""
        log.debug("scheduler_transport_connected", master=self._master)
        if not self._core.subscribed and not self._stop_requested:
            self._subscribe_wait.restart()
            self._subscribe_wake.set()

    def _on_transport_disconnected(self) -> None:
        self._disconnected(self._core.connection_lost(), "transport disconnected")

    async def _graceful_stop(self) -> None:
        if self._failover or self._error is not None:
            return
        fid = self.framework_id
        if fid is None or not self._core.registered_once:
            return
        if not self._core.subscribed:
            log.warning(
                "teardown_skipped",
                framework_id=fid,
                reason="not subscribed; the master removes the framework after failover_timeout",
            )
            return
        await self._flush()
        await self._send_now(Teardown(framework_id=fid))
        # The master answers nothing to TEARDOWN; a call after it is refused once the framework
        # is gone, which confirms the TEARDOWN was processed before the socket closes.
        await self._send_now(Reconcile(framework_id=fid, tasks=()))
        try:
            async with asyncio.timeout(TEARDOWN_TIMEOUT):
                await self._teardown_ack.wait()
        except TimeoutError:
            log.warning("teardown_unconfirmed", framework_id=fid)

    def _close_now(self) -> None:
        self._stop_requested = True
        self._core.lost()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self._client is not None:
            self._client.close()
        self._finished.set()
        self._subscribe_wake.set()

    # ------------------------------------------------------------------ sending

    async def _send_now(self, message: Message) -> None:
        client = self._client
        assert client is not None
        try:
            await client.send(message)
        except ProtocolError as exc:
            log.error("unencodable_call", message=message.NAME, error=str(exc))
        except TransportClosed:
            pass

    async def _flush(self) -> None:
        while (message := self._core.next_call()) is not None:
            await self._send_now(message)

    async def _send_loop(self) -> None:
        client = self._client
        assert client is not None
        core = self._core
        wake = self._send_wake
        while True:
            await wake.wait()
            wake.clear()
            while core.subscribed and (message := core.next_call()) is not None:
                try:
                    await client.send(message)
                except ProtocolError as exc:
                    log.error("unencodable_call", message=message.NAME, error=str(exc))
                except TransportClosed:
                    return

    def _queued(self) -> None:
        """A call was queued: wake the sender (from any thread)."""
        if not self._started:
            return
        if threading.get_ident() == self._loop_thread:
            self._send_wake.set()
        else:
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._send_wake.set)

    def _call(self, name: str, make: Callable[..., Message], *args: Any) -> None:
        """Make a call through the core (ValueError now if it could never be sent)."""
        if self._stop_requested:
            log.debug("call_after_stop_dropped", call=name)
            return
        make(*args)
        self._queued()

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` now if on the driver's loop thread (or not started), else on the loop."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            fn(*args)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------------ receiving

    async def _recv_loop(self) -> None:
        client = self._client
        assert client is not None
        handlers = self._handlers
        core = self._core
        while True:
            try:
                batch = [await client.recv()]
                while len(batch) < _BATCH:
                    more = client.recv_nowait()
                    if more is None:
                        break
                    batch.append(more)
            except TransportClosed:
                return
            self._last_seen = time.monotonic()
            async with self._cb_lock:
                for received in batch:
                    message = received.message
                    if message is None:
                        log.warning("bad_frame_from_master", error=str(received.error))
                        continue
                    epoch = received.epoch
                    if not core.fresh(epoch):
                        log.info("stale_master_message", epoch=epoch, newest=core.newest_epoch)
                        continue
                    if self._stop_requested:
                        self._while_stopping(message)
                        continue
                    handler = handlers.get(type(message))
                    if handler is None:
                        log.warning("unexpected_message", message=message.NAME)
                        continue
                    try:
                        await handler(message)
                    except Exception:
                        log.exception("event_handling_failed", message=message.NAME)

    def _while_stopping(self, message: Message) -> None:
        if isinstance(message, Error) and message.code in (
            ErrorCode.FRAMEWORK_REMOVED,
            ErrorCode.NOT_SUBSCRIBED,
        ):
            self._teardown_ack.set()

    async def _invoke(self, name: str, *args: Any) -> bool:
        """Run the scheduler's callback; False if it raised (logged with its innermost
        frames)."""
        try:
            result = self._callbacks[name](self._facade, *args)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception as exc:
            log.error("scheduler_callback_failed", callback=name, error=short_traceback(exc))
            return False
        return True


def _code(code: ErrorCode | None) -> str | None:
    return code.value if code is not None else None


def _log_retry(state: RetryCallState) -> None:
    if state.attempt_number > 1 and state.next_action is not None:
        log.info("subscribe_retry", attempt=state.attempt_number, wait=state.next_action.sleep)
