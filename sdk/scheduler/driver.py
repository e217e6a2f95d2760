"""The asyncio scheduler driver: one framework's link to the master.

``SchedulerDriver`` subscribes (retrying with jittered, capped backoff until SUBSCRIBED), turns
master events into :class:`~agora.sdk.scheduler.Scheduler` callbacks and master calls into
messages. Calls are plain methods that queue a message and return at once: they are safe from
callbacks (sync or async) and, for the calls, from other threads. One receive task dispatches
events in arrival order (draining bursts in one turn), one send task flushes queued calls, and
a supervisor task owns (re-)subscription, liveness and shutdown.

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
import contextlib
import inspect
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

import structlog
from agora.sdk.batching import BATCHES, FEATURES, coalesce
from agora.sdk.discovery import master_address, parse_masters
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID, new_kill_id
from agora.sdk.logs import default_logging
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    Decline,
    Error,
    ErrorCode,
    ExecutorInfo,
    Failure,
    Filters,
    FrameworkInfo,
    FrameworkMessage,
    GangExpired,
    GangRequest,
    Heartbeat,
    Kill,
    Launch,
    LaunchGroup,
    MasterInfo,
    Message,
    Offer,
    Offers,
    Operation,
    Reconcile,
    ReconcileTask,
    Request,
    Rescind,
    Revive,
    SendMessage,
    Shutdown,
    Subscribe,
    Subscribed,
    Suppress,
    TaskGroupInfo,
    TaskInfo,
    TaskStatus,
    Teardown,
    Update,
    Updates,
)
from agora.sdk.messages.common import MAX_BATCH_ITEMS
from agora.sdk.scheduler._backoff import RestartableWait
from agora.sdk.scheduler._guard import checked, short_traceback
from agora.sdk.scheduler.calls import OfferRef, Offers_
from agora.sdk.scheduler.scheduler import Scheduler
from agora.sdk.scheduler.spec import TaskSpec, task_infos_for
from agora.sdk.transport import MasterLink, discover_client
from agora.sdk.transport.base import TransportClosed
from msgspec.structs import replace
from tenacity import AsyncRetrying, RetryCallState, retry_if_result

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["DriverError", "SchedulerDriver"]


class _Log:
    """The module's structlog logger, except that a failing logger (say, a closed stream) is
    ignored: logging must never be what stops the driver."""

    def __init__(self, name: str) -> None:
        self._log = structlog.get_logger(name)

    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # nowhere left to report it
            getattr(self._log, level)(event, **kw)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._emit("exception", event, kw)


log = _Log(__name__)

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
)

#: ZmqClient.handshake_error when the server's ZAP handler refused our CURVE key.
_AUTH_FAILED: Final = "authentication failed"
#: Refusals meaning "subscribe again" once the framework has been registered.
_RESUBSCRIBE: Final = frozenset(
    {ErrorCode.NOT_SUBSCRIBED, ErrorCode.UNKNOWN_FRAMEWORK, ErrorCode.NOT_LEADER}
)


class DriverError(RuntimeError):
    """The driver stopped because the master ended the subscription (``code`` says why)."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class SchedulerDriver:
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
    ) -> None:
        if heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        lo, hi = subscribe_backoff
        if not 0 < lo <= hi:
            raise ValueError("subscribe_backoff must be (floor, cap) with 0 < floor <= cap")
        self._scheduler = scheduler
        self._info = framework
        self._master = master_address(master)
        default_logging()
        self._implicit = implicit_acknowledgements
        # No credentials given: this user's keys in $AGORA_HOME/keys, if agora local wrote them.
        self._curve = curve if curve is not None else discover_client()
        self._heartbeat_interval = heartbeat_interval
        self._backoff = (lo, hi)
        self._subscribe_wait = RestartableWait(lo, hi)
        #: What callbacks receive as ``driver`` (the blocking driver substitutes itself).
        self._facade: Any = self
        self._callbacks: dict[str, Callable[..., Any]] = {
            name: getattr(scheduler, name) for name in _CALLBACKS
        }

        self.framework_id: FrameworkID | None = framework.framework_id
        self.master_info: MasterInfo | None = None

        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._client: MasterLink | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: deque[Message] = deque()
        self._offers: dict[OfferID, Offer] = {}
        self._suppressed: set[str] = set()

        self._started = False
        self._subscribed = False
        self._registered_once = False
        self._need_subscribe = True
        self._notify_disconnected = False
        self._stop_requested = False
        self._failover = False
        self._error: DriverError | None = None
        self._last_seen = 0.0
        self._silence_limit: float | None = None
        self._max_epoch = 0
        #: Transport reconnections so far, and the count when SUBSCRIBED last arrived / the last
        #: SUBSCRIBE went out (tells a stale refusal from a real one, and a queued SUBSCRIBE).
        self._conn_gen = 0
        self._sub_gen = 0
        self._subscribe_sent_gen = -1

        self._handlers: dict[type[Message], Callable[[Any], Awaitable[None]]] = {
            Subscribed: self._on_subscribed,
            Offers: self._on_offers,
            Rescind: self._on_rescind,
            Update: self._on_update,
            Updates: self._on_updates,
            FrameworkMessage: self._on_framework_message,
            Failure: self._on_failure,
            Error: self._on_error,
            Heartbeat: self._on_heartbeat,
            GangExpired: self._on_gang_expired,
        }

    # ------------------------------------------------------------------ lifecycle

    @property
    def subscribed(self) -> bool:
        return self._subscribed

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
            self._client = MasterLink.connect(
                parse_masters(self._master),
                curve=self._curve,
                on_connected=self._on_transport_connected,
                on_disconnected=self._on_transport_disconnected,
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
        if self._outbox:  # calls made before start() (framework id known up front)
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
            if not self._registered_once:
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
            if limit is not None and self._subscribed:
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
            if limit is not None and self._subscribed and now - self._last_seen > limit:
                # If the loop itself was stalled (a slow callback), the master's messages may be
                # waiting unread: give the receive task a moment before calling the master gone.
                await asyncio.sleep(min(0.1, limit / 10))
                now = time.monotonic()
                if self._subscribed and now - self._last_seen > limit:
                    self._lost(f"master silent for {now - self._last_seen:.1f}s")
                continue
            if now >= next_heartbeat:
                next_heartbeat = now + hb
                if self._subscribed:
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
        if self._subscribed or self._stop_requested:
            return True
        client = self._client
        assert client is not None
        if not client.connected and client.handshake_error == _AUTH_FAILED:
            # The master's ZAP handler rejected our CURVE key: retrying will not change that.
            why = f"the master at {self._master} rejected this client's key ({_AUTH_FAILED})"
            async with self._cb_lock:
                await self._invoke("error", why)
            self._fail(DriverError(why, ErrorCode.FORBIDDEN))
            return True
        if not client.connected and self._subscribe_sent_gen == self._conn_gen:
            return False  # the last SUBSCRIBE is queued for the coming connection
        info = self._info
        if self.framework_id is not None:
            info = replace(info, framework_id=self.framework_id)
        message = Subscribe(
            framework_info=info,
            suppressed_roles=tuple(sorted(self._suppressed)),
            features=FEATURES,
        )
        self._subscribe_wake.clear()
        self._subscribe_sent_gen = self._conn_gen
        try:
            await client.send(message)
        except ProtocolError as exc:
            self._fail(DriverError(f"cannot subscribe: {exc}", ErrorCode.BAD_REQUEST))
            return True
        return False

    async def _subscribe_sleep(self, seconds: float) -> None:
        if self._subscribed or self._stop_requested:
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
        if self._subscribed:
            log.info("master_lost", reason=reason, framework_id=self.framework_id)
            self._subscribed = False
            self._subscribed_evt.clear()
            self._notify_disconnected = True
        self._need_subscribe = True
        self._kick.set()

    def _on_transport_connected(self) -> None:
        """A master confirmed that it leads (the link follows only such a confirmation, at an
        epoch at least the newest seen): subscribe to it now and start the backoff over, however
        long it had grown while no master led."""
        log.debug("scheduler_transport_connected", master=self._master)
        if not self._subscribed and not self._stop_requested:
            self._subscribe_wait.restart()
            self._subscribe_wake.set()

    def _on_transport_disconnected(self) -> None:
        self._conn_gen += 1
        self._lost("transport disconnected")

    async def _graceful_stop(self) -> None:
        if self._failover or self._error is not None:
            return
        fid = self.framework_id
        if fid is None or not self._registered_once:
            return
        if not self._subscribed:
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
        self._subscribed = False
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
        out = self._outbox
        while out:
            await self._send_now(out.popleft())

    async def _send_loop(self) -> None:
        client = self._client
        assert client is not None
        out = self._outbox
        wake = self._send_wake
        while True:
            await wake.wait()
            wake.clear()
            while out and self._subscribed:
                message = out.popleft()
                if type(message) is Acknowledge and out:
                    message = self._acknowledgements(message)
                try:
                    await client.send(message)
                except ProtocolError as exc:
                    log.error("unencodable_call", message=message.NAME, error=str(exc))
                except TransportClosed:
                    return

    def _acknowledgements(self, first: Acknowledge) -> Message:
        """``first`` and every acknowledgement queued behind it, as one message if the master
        reads batches. They overtake the other calls queued between them, which keep their
        order: an update acknowledged a little earlier is never wrong, and a scheduler that
        launches as its tasks end interleaves its ACCEPTs with them."""
        info = self.master_info
        if info is None or BATCHES not in info.features:
            return first
        out = self._outbox
        acks: list[Message] = [first]
        others: list[Message] = []
        while out and len(acks) < MAX_BATCH_ITEMS:
            message = out.popleft()
            (acks if type(message) is Acknowledge else others).append(message)
        out.extendleft(reversed(others))
        (merged,) = coalesce(acks)
        return merged

    def _enqueue(self, message: Message) -> None:
        """Queue a call for the master; ValueError now if it could never be sent."""
        checked(message)
        if self._stop_requested:
            log.debug("call_after_stop_dropped", message=message.NAME)
            return
        self._outbox.append(message)
        if not self._started:
            return
        if threading.get_ident() == self._loop_thread:
            self._send_wake.set()
        else:
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._send_wake.set)

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
                    if epoch < self._max_epoch:
                        log.info("stale_master_message", epoch=epoch, newest=self._max_epoch)
                        continue
                    self._max_epoch = epoch
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

    async def _on_subscribed(self, m: Subscribed) -> None:
        was_subscribed = self._subscribed
        self.framework_id = m.framework_id
        self.master_info = m.master_info
        hb = m.heartbeat_interval_seconds
        self._silence_limit = 3 * hb if hb > 0 else None
        self._subscribed = True
        self._need_subscribe = False
        self._sub_gen = self._conn_gen
        self._subscribe_wake.set()
        # The master closed every offer of the previous subscription.
        void = list(self._offers)
        self._offers.clear()
        for offer_id in void:
            await self._invoke("offer_rescinded", offer_id)
        if not self._registered_once:
            self._registered_once = True
            log.info("framework_registered", framework_id=m.framework_id)
            await self._invoke("registered", m.framework_id, m.master_info)
        elif not was_subscribed:
            log.info("framework_reregistered", framework_id=m.framework_id)
            await self._invoke("reregistered", m.master_info)
        self._subscribed_evt.set()
        if self._outbox:
            self._send_wake.set()

    async def _on_offers(self, m: Offers) -> None:
        offers = list(m.offers)
        known = self._offers
        for offer in offers:
            known[offer.offer_id] = offer
        if not await self._invoke("offers", offers):
            # What the failed callback left held would stay out of every framework's reach.
            left = [o.offer_id for o in offers if o.offer_id in known]
            if left:
                log.warning("offers_declined_after_callback_failed", offers=len(left))
                self.decline(left)

    async def _on_rescind(self, m: Rescind) -> None:
        self._offers.pop(m.offer_id, None)
        await self._invoke("offer_rescinded", m.offer_id)

    async def _on_updates(self, m: Updates) -> None:
        for status in m.statuses:
            await self._on_update(Update(status=status))

    async def _on_update(self, m: Update) -> None:
        status = m.status
        await self._invoke("status_update", status)
        if (
            self._implicit
            and status.uuid is not None
            and status.agent_id is not None
            and self.framework_id is not None
        ):
            self._outbox.append(
                Acknowledge(
                    framework_id=self.framework_id,
                    agent_id=status.agent_id,
                    task_id=status.task_id,
                    uuid=status.uuid,
                )
            )
            self._send_wake.set()

    async def _on_framework_message(self, m: FrameworkMessage) -> None:
        await self._invoke("framework_message", m.agent_id, m.executor_id, m.data)

    async def _on_failure(self, m: Failure) -> None:
        if m.executor_id is None:
            await self._invoke("agent_lost", m.agent_id)
        else:
            await self._invoke("executor_lost", m.agent_id, m.executor_id, m.status)

    async def _on_heartbeat(self, _m: Heartbeat) -> None:
        return None

    async def _on_gang_expired(self, m: GangExpired) -> None:
        await self._invoke("gang_expired", m.gang_id, m.message)

    async def _on_error(self, m: Error) -> None:
        code = m.code
        fatal = False
        if code is ErrorCode.FRAMEWORK_REMOVED:
            fatal = True
        elif code is ErrorCode.FORBIDDEN:
            if self._registered_once and self._conn_gen != self._sub_gen:
                # Refused on a new connection before we re-subscribed on it: a stale call.
                log.info("call_refused_after_reconnect", error=m.message)
                self._lost("master refused a call from a new connection")
                return
            fatal = True  # subscription forbidden, or replaced by another scheduler
        elif code is ErrorCode.BAD_REQUEST and not self._registered_once:
            fatal = True  # the SUBSCRIBE itself was refused
        elif code in _RESUBSCRIBE and self._registered_once:
            log.info("master_forgot_framework", error=m.message, code=code.value)
            self._lost(f"master: {m.message}")
            return
        log.warning("master_error", error=m.message, code=code.value)
        await self._invoke("error", m.message)
        if fatal:
            self._fail(DriverError(m.message, code))

    # ------------------------------------------------------------------ calls

    def _fid(self) -> FrameworkID:
        fid = self.framework_id
        if fid is None:
            raise RuntimeError("the driver has not subscribed yet (no framework id)")
        return fid

    def _resolve(self, offers: Offers_) -> tuple[list[OfferID], list[Offer] | None]:
        """Offer ids, and the Offer records when every one is known (else None)."""
        items: Sequence[OfferRef]
        items = [offers] if isinstance(offers, Offer | str) else list(offers)
        ids: list[OfferID] = []
        records: list[Offer] | None = []
        for item in items:
            if isinstance(item, Offer):
                ids.append(item.offer_id)
                if records is not None:
                    records.append(item)
            else:
                offer_id = OfferID(item)
                ids.append(offer_id)
                known = self._offers.get(offer_id)
                if known is None:
                    records = None
                elif records is not None:
                    records.append(known)
        return ids, records

    def _consume(self, offer_ids: Iterable[OfferID]) -> None:
        for offer_id in offer_ids:
            self._offers.pop(offer_id, None)

    def launch(
        self,
        offers: Offers_,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT ``offers`` (one agent's) with one LAUNCH of ``tasks``; what they leave unused
        is declined with ``filters``. TaskSpecs are placed on the offers (ValueError when they
        do not fit); an offer given by id must be one the driver still holds for that."""
        fid = self._fid()
        ids, records = self._resolve(offers)
        if any(isinstance(t, TaskSpec) for t in tasks):
            if records is None:
                raise ValueError("launching TaskSpecs needs the offers (unknown offer id given)")
            _, infos = task_infos_for(records, tasks)
        else:
            infos = [t for t in tasks if isinstance(t, TaskInfo)]
        operations: tuple[Operation, ...] = (Launch(task_infos=tuple(infos)),) if infos else ()
        call = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=operations,
            filters=filters or Filters(),
        )
        self._enqueue(call)  # checked first: a call that cannot be sent uses up no offer
        self._consume(ids)

    def launch_group(
        self,
        offers: Offers_,
        executor: ExecutorInfo,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT with one LAUNCH_GROUP: ``tasks`` start together under ``executor``."""
        fid = self._fid()
        if not executor.framework_id:
            executor = replace(executor, framework_id=fid)
        ids, records = self._resolve(offers)
        if any(isinstance(t, TaskSpec) for t in tasks):
            if records is None:
                raise ValueError("launching TaskSpecs needs the offers (unknown offer id given)")
            _, infos = task_infos_for(records, tasks)
        else:
            infos = [t for t in tasks if isinstance(t, TaskInfo)]
        group = TaskGroupInfo(tasks=tuple(replace(t, executor=None) for t in infos))
        call = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=(LaunchGroup(executor=executor, task_group=group),),
            filters=filters or Filters(),
        )
        self._enqueue(call)  # checked first: a call that cannot be sent uses up no offer
        self._consume(ids)

    def accept(
        self,
        offer_ids: Offers_,
        operations: Sequence[Operation],
        filters: Filters | None = None,
    ) -> None:
        """ACCEPT with explicit operations (LAUNCH, LAUNCH_GROUP, RESERVE, UNRESERVE)."""
        fid = self._fid()
        ids, _ = self._resolve(offer_ids)
        call = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=tuple(operations),
            filters=filters or Filters(),
        )
        self._enqueue(call)  # checked first: a call that cannot be sent uses up no offer
        self._consume(ids)

    def decline(self, offer_ids: Offers_, filters: Filters | None = None) -> None:
        """DECLINE: the offers' resources are not offered again for ``filters.refuse_seconds``."""
        fid = self._fid()
        ids, _ = self._resolve(offer_ids)
        call = Decline(framework_id=fid, offer_ids=tuple(ids), filters=filters or Filters())
        self._enqueue(call)  # checked first: a call that cannot be sent uses up no offer
        self._consume(ids)

    def revive(self, roles: Sequence[str] = ()) -> None:
        """Clear filters and resume offers for ``roles`` (() = all the framework's roles)."""
        fid = self._fid()
        if roles:
            self._suppressed.difference_update(roles)
        else:
            self._suppressed.clear()
        self._enqueue(Revive(framework_id=fid, roles=tuple(roles)))

    def suppress(self, roles: Sequence[str] = ()) -> None:
        """Stop offers for ``roles`` (() = all); kept across re-subscription."""
        fid = self._fid()
        self._suppressed.update(roles or self._info.roles)
        self._enqueue(Suppress(framework_id=fid, roles=tuple(roles)))

    def kill(self, task_id: TaskID | str, agent_id: AgentID | str | None = None) -> str:
        """KILL a task; returns the kill's id (``kill_id`` in the logs of every hop)."""
        fid = self._fid()
        agent = AgentID(agent_id) if agent_id is not None else None
        kill_id = new_kill_id()
        log.info("kill_requested", framework_id=fid, task_id=task_id, kill_id=kill_id)
        self._enqueue(
            Kill(framework_id=fid, task_id=TaskID(task_id), agent_id=agent, kill_id=kill_id)
        )
        return kill_id

    def shutdown_executor(self, agent_id: AgentID | str, executor_id: ExecutorID | str) -> None:
        """SHUTDOWN: stop one executor (its tasks become LOST/KILLED)."""
        fid = self._fid()
        self._enqueue(
            Shutdown(
                framework_id=fid, executor_id=ExecutorID(executor_id), agent_id=AgentID(agent_id)
            )
        )

    def acknowledge(self, status: TaskStatus) -> None:
        """Acknowledge an update (only needed without implicit acknowledgements)."""
        fid = self._fid()
        if status.uuid is None or status.agent_id is None:
            raise ValueError("only updates with a uuid and an agent id are acknowledged")
        self._enqueue(
            Acknowledge(
                framework_id=fid, agent_id=status.agent_id, task_id=status.task_id, uuid=status.uuid
            )
        )

    def reconcile(self, tasks: Sequence[TaskID | str | ReconcileTask | TaskStatus] = ()) -> None:
        """RECONCILE: () asks for every task the master knows (implicit); otherwise the latest
        state of each named task (a TaskStatus names its task and agent)."""
        fid = self._fid()
        items: list[ReconcileTask] = []
        for t in tasks:
            if isinstance(t, ReconcileTask):
                items.append(t)
            elif isinstance(t, TaskStatus):
                items.append(ReconcileTask(task_id=t.task_id, agent_id=t.agent_id))
            else:
                items.append(ReconcileTask(task_id=TaskID(t)))
        self._enqueue(Reconcile(framework_id=fid, tasks=tuple(items)))

    def message(self, agent_id: AgentID | str, executor_id: ExecutorID | str, data: bytes) -> None:
        """MESSAGE: opaque bytes to one executor (best effort)."""
        fid = self._fid()
        self._enqueue(
            SendMessage(
                framework_id=fid,
                agent_id=AgentID(agent_id),
                executor_id=ExecutorID(executor_id),
                data=bytes(data),
            )
        )

    def request(self, gangs: Sequence[GangRequest]) -> None:
        """REQUEST gangs (the allocator offers each whole, as one bundle)."""
        fid = self._fid()
        self._enqueue(Request(framework_id=fid, gangs=tuple(gangs)))

    def teardown(self) -> None:
        """Tear the framework down (its tasks are killed) and stop: ``stop(failover=False)``."""
        self.stop(failover=False)


def _code(code: ErrorCode | None) -> str | None:
    return code.value if code is not None else None


def _log_retry(state: RetryCallState) -> None:
    if state.attempt_number > 1 and state.next_action is not None:
        log.info("subscribe_retry", attempt=state.attempt_number, wait=state.next_action.sleep)
