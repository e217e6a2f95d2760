"""The executor side of the agent <-> executor link: the asyncio shell over :mod:`.core`.

``ExecutorDriver`` connects to the agent named in the environment the agent gave the process,
registers (retrying with jittered, capped backoff), hands the agent's messages to an
:class:`~agora.sdk.executor.Executor` and carries the executor's status updates and framework
messages back. Every status update is kept until the agent acknowledges it. When the link drops,
the driver re-registers on the new connection with the updates still unacknowledged (and the
tasks whose launch the agent has not yet seen an update for); framework messages sent meanwhile
are held (at most ``HELD_MESSAGES_MAX``) and go out once re-registered. An agent gone for longer
than the recovery timeout makes the driver call ``Executor.shutdown`` and exit with status 1.

What to do is decided by :class:`~agora.sdk.executor.core.ExecutorCore`; this shell owns the
socket, the send queue, the registration retries, the recovery timer, signals and the
executor's callbacks (running coroutines as tasks), and performs the core's actions in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from agora.sdk._lean import import_structlog_without_rich

import_structlog_without_rich()  # executors start often and log plainly: see agora.sdk._lean

import structlog  # noqa: E402
import zmq  # noqa: E402
from agora.sdk.errors import ProtocolError  # noqa: E402
from agora.sdk.executor.core import (  # noqa: E402
    HELD_MESSAGES_MAX,
    Action,
    ExecutorCore,
    Invoke,
    Note,
    Send,
    Shutdown,
)
from agora.sdk.executor.environment import (  # noqa: E402
    DEFAULT_RECOVERY_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE_PERIOD,
    EXECUTOR_ENV_VARS,
    ExecutorEnvironment,
)
from agora.sdk.executor.executor import Executor  # noqa: E402
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID  # noqa: E402
from agora.sdk.messages import (  # noqa: E402
    AgentInfo,
    ExecutorInfo,
    FrameworkInfo,
    Message,
    StatusUpdate,
    TaskStatus,
)
from agora.sdk.transport import Client, Dial, Received, TransportClosed, ZmqClient  # noqa: E402
from tenacity import AsyncRetrying, retry_if_result, wait_exponential_jitter  # noqa: E402

__all__ = [
    "DEFAULT_RECOVERY_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE_PERIOD",
    "EXECUTOR_ENV_VARS",
    "HELD_MESSAGES_MAX",
    "ExecutorDriver",
    "ExecutorEnvironment",
    "run_executor",
]

log = structlog.get_logger(__name__)

_REGISTER_BACKOFF_INITIAL: Final = 0.5
_REGISTER_BACKOFF_MAX: Final = 5.0
_FLUSH_TIMEOUT_MIN: Final = 1.0
_FLUSH_TIMEOUT_MAX: Final = 10.0


class ExecutorDriver:
    """Runs an :class:`Executor` against the agent named by the environment (asyncio).

    ``environ`` defaults to ``os.environ``; a missing or bad AGORA_* variable raises ValueError.
    ``dial`` makes the link to the agent instead of a ZeroMQ DEALER (for an agent in the same
    process, the in-process transport's ``lambda e, up, down: hub.client(name, on_connected=up,
    on_disconnected=down)``); it is called once, from :meth:`run`.

    The calls (``send_status_update``, ``send_framework_message``, ``stop``) are plain methods
    that queue work for the driver's loop; call them from that loop (e.g. from callbacks).
    """

    def __init__(
        self,
        executor: Executor,
        *,
        environ: Mapping[str, str] | None = None,
        dial: Dial | None = None,
    ) -> None:
        self._executor = executor
        self._env = ExecutorEnvironment.from_environ(os.environ if environ is None else environ)
        self._core = ExecutorCore(self._env)
        self._dial = dial
        self._client: Client | None = None
        self._outbox: deque[Message] = deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()
        self._all_acked = asyncio.Event()
        self._all_acked.set()
        self._wake = asyncio.Event()
        self._registrar: asyncio.Task[None] | None = None
        self._recovery_timer: asyncio.TimerHandle | None = None
        self._recovery_timer_at: float | None = None
        self._done: asyncio.Future[int] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # ----------------------------------------------------------------- read-only state

    @property
    def environment(self) -> ExecutorEnvironment:
        return self._env

    @property
    def framework_id(self) -> FrameworkID:
        return self._env.framework_id

    @property
    def executor_id(self) -> ExecutorID:
        return self._env.executor_id

    @property
    def agent_id(self) -> AgentID | None:
        return self._core.agent_id

    @property
    def sandbox(self) -> str:
        return self._env.sandbox

    @property
    def framework_info(self) -> FrameworkInfo | None:
        """The framework's info from the agent (None until registered)."""
        return self._core.framework_info

    @property
    def executor_info(self) -> ExecutorInfo | None:
        return self._core.executor_info

    @property
    def agent_info(self) -> AgentInfo | None:
        return self._core.agent_info

    @property
    def registered(self) -> bool:
        """True while registered with the agent on the current connection."""
        return self._core.registered

    @property
    def stopping(self) -> bool:
        """True once shutdown or stop has begun."""
        return self._core.stopping or (self._done is not None and self._done.done())

    @property
    def unacknowledged_updates(self) -> tuple[StatusUpdate, ...]:
        return self._core.unacknowledged_updates

    # ----------------------------------------------------------------- calls

    def send_status_update(self, status: TaskStatus, *, keep_uuid: bool = False) -> None:
        """Send ``status`` to the agent, and again on re-registration until it is acknowledged.

        Fills in ``uuid`` (fresh uuid4 bytes, unless ``keep_uuid`` and the status has one: an
        executor relaying another's updates keeps their ids), ``timestamp`` (now), ``source``
        (EXECUTOR), ``executor_id`` and ``agent_id``. Raises :class:`ProtocolError` when the
        status breaks its schema (e.g. an over-long message).
        """
        uuid = status.uuid if keep_uuid and status.uuid is not None else _uuid4()
        actions = self._core.send_status_update(status, uuid, time.time())
        self._all_acked.clear()
        self._perform(actions)

    def send_framework_message(self, data: bytes) -> None:
        """Send ``data`` to the framework's scheduler (best effort, like Mesos).

        Held while the agent link is down and sent once re-registered (oldest dropped beyond
        ``HELD_MESSAGES_MAX``).
        """
        self._perform(self._core.send_framework_message(data))

    def stop(self) -> None:
        """Stop the driver: ``run()`` returns 0 once pending updates are acknowledged (bounded)."""
        self._finish(0)

    # ----------------------------------------------------------------- run

    async def run(self) -> int:
        """Connect, register and dispatch until stopped; returns the process exit status.

        0 after a shutdown (SHUTDOWN_EXECUTOR, SIGTERM, SIGINT) or ``stop()``; 1 when the agent
        stayed unreachable for the recovery timeout; 2 when the agent endpoint is unusable.
        """
        if self._done is not None:
            raise RuntimeError("ExecutorDriver.run() may be called only once")
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        env = self._env
        log.info(
            "executor_starting",
            framework_id=env.framework_id,
            executor_id=env.executor_id,
            agent=env.agent_endpoint,
        )
        try:
            client = self._connect(env.agent_endpoint)
        except zmq.ZMQError as exc:
            log.error("agent_endpoint_unusable", agent=env.agent_endpoint, error=str(exc))
            self._done.set_result(2)
            return 2
        self._client = client
        signals = self._install_signal_handlers(loop)
        workers = [
            loop.create_task(self._receive(client)),
            loop.create_task(self._send(client)),
        ]
        self._perform(self._core.start(loop.time()))
        self._start_registration()
        try:
            code = await self._done
            await self._flush()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            self._set_recovery_timer(None)
            pending = [*workers, *self._background]
            if self._registrar is not None:
                pending.append(self._registrar)
            for task in pending:
                task.cancel()
            client.close()
            await asyncio.gather(*pending, return_exceptions=True)
        log.info("executor_exiting", status=code)
        return code

    def _connect(self, endpoint: str) -> Client:
        up, down = self._on_transport_connected, self._on_transport_disconnected
        if self._dial is not None:
            return self._dial(endpoint, up, down)
        return ZmqClient.connect(endpoint, on_connected=up, on_disconnected=down)

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._on_signal, signum)
                installed.append(signum)
        return installed

    def _on_signal(self, signum: int) -> None:
        log.info("executor_signalled", signal=signal.Signals(signum).name)
        self._perform(self._core.shutdown(0))

    async def _flush(self) -> None:
        """Give the agent a bounded chance to acknowledge what is pending before the exit."""
        core = self._core
        if not core.registered or (core.all_acknowledged and not self._outbox):
            return
        timeout = min(max(self._env.shutdown_grace_period, _FLUSH_TIMEOUT_MIN), _FLUSH_TIMEOUT_MAX)
        try:
            async with asyncio.timeout(timeout):
                await self._outbox_empty.wait()
                await self._all_acked.wait()
        except TimeoutError:
            count = len(core.unacknowledged_updates)
            log.warning("executor_exit_with_unacknowledged_updates", count=count)

    def _finish(self, code: int) -> None:
        if self._done is not None and not self._done.done():
            self._core.stop()
            self._done.set_result(code)

    # ----------------------------------------------------------------- the core's actions

    def _perform(self, actions: list[Action]) -> None:
        """Carry out the core's actions in order, then follow its timer and acknowledgements."""
        for action in actions:
            if isinstance(action, Send):
                self._queue(action.message)
            elif isinstance(action, Invoke):
                self._invoke(action.callback, *action.args)
            elif isinstance(action, Note):
                getattr(log, action.level)(action.event, **dict(action.fields))
            elif isinstance(action, Shutdown):
                task = asyncio.get_running_loop().create_task(self._shutdown(action.code))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        if self._core.all_acknowledged:
            self._all_acked.set()
        self._set_recovery_timer(self._core.recovery_deadline)

    def _set_recovery_timer(self, deadline: float | None) -> None:
        """Have the loop tick the core at ``deadline`` (None: no timer)."""
        if deadline == self._recovery_timer_at:
            return
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
            self._recovery_timer = None
        self._recovery_timer_at = deadline
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._recovery_timer = loop.call_at(deadline, self._on_recovery_timer)

    def _on_recovery_timer(self) -> None:
        self._recovery_timer = None
        self._recovery_timer_at = None  # the loop may fire a hair early: _perform re-arms then
        self._perform(self._core.tick(asyncio.get_running_loop().time()))

    # ----------------------------------------------------------------- wire

    def _queue(self, message: Message) -> None:
        self._outbox.append(message)
        self._outbox_empty.clear()
        self._outbox_ready.set()

    async def _send(self, client: Client) -> None:
        outbox = self._outbox
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while outbox:
                message = outbox.popleft()
                try:
                    await client.send(message)
                except ProtocolError as exc:
                    log.error("executor_send_failed", name=message.NAME, error=str(exc))
                except TransportClosed:
                    return
            self._outbox_empty.set()

    async def _receive(self, client: Client) -> None:
        while True:
            try:
                received = await client.recv()
            except TransportClosed:
                return
            self._dispatch(received)
            while (received_now := client.recv_nowait()) is not None:
                if self._outbox:
                    # Let what the last message produced (a TASK_RUNNING) go out before the
                    # next one is handled: a burst of launches must not hold every update back.
                    await asyncio.sleep(0)
                self._dispatch(received_now)

    def _dispatch(self, received: Received) -> None:
        message = received.message
        if message is None:
            self._perform(self._core.bad_frame(received.error))
            return
        was_registered = self._core.registered
        try:
            self._perform(self._core.handle(message))
        except Exception:  # a bug handling one message must not stop the executor
            log.exception("executor_message_failed", name=message.NAME)
        if self._core.registered and not was_registered:
            self._wake.set()  # the registrar's pause ends: its work is done

    # ----------------------------------------------------------------- registration

    def _on_transport_connected(self) -> None:
        self._perform(self._core.connected())
        self._start_registration()

    def _on_transport_disconnected(self) -> None:
        self._perform(self._core.disconnected(asyncio.get_running_loop().time()))

    def _start_registration(self) -> None:
        self._wake.set()
        if self._registrar is None or self._registrar.done():
            self._registrar = asyncio.get_running_loop().create_task(self._register())

    async def _register(self) -> None:
        retrying = AsyncRetrying(
            sleep=self._pause,
            wait=wait_exponential_jitter(
                multiplier=_REGISTER_BACKOFF_INITIAL,
                max=_REGISTER_BACKOFF_MAX,
                jitter=_REGISTER_BACKOFF_INITIAL,
            ),
            retry=retry_if_result(lambda done: not done),
        )
        await retrying(self._register_attempt)

    async def _pause(self, seconds: float) -> None:
        """Sleep between registration attempts, cut short by a reply or a new connection."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _register_attempt(self) -> bool:
        self._wake.clear()
        if self._core.registered or self.stopping:
            return True
        client = self._client
        if client is None or not client.connected:
            return False  # the next connection wakes us
        message = self._core.registration()
        if message is not None:
            self._queue(message)
        return False

    # ----------------------------------------------------------------- callbacks

    async def _shutdown(self, code: int) -> None:
        try:
            result = self._executor.shutdown(self)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("executor_callback_failed", callback="shutdown")
        self._finish(code)

    def _invoke(self, name: str, *args: Any) -> None:
        try:
            result = getattr(self._executor, name)(self, *args)
        except Exception:
            log.exception("executor_callback_failed", callback=name)
            return
        if inspect.isawaitable(result):
            task = asyncio.get_running_loop().create_task(self._guard(name, result))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @staticmethod
    async def _guard(name: str, awaitable: Any) -> None:
        try:
            await awaitable
        except Exception:
            log.exception("executor_callback_failed", callback=name)


def _uuid4() -> bytes:
    """The 16 bytes of a random (version 4) UUID, without building a uuid.UUID."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return bytes(raw)


def run_executor(executor: Executor) -> NoReturn:
    """Run ``executor`` under an :class:`ExecutorDriver` and exit the process with its status.

    Logging follows AGORA_LOG_FORMAT ("console" or "json", default console) and AGORA_LOG_LEVEL
    (default info), to stderr. A missing or bad AGORA_* variable exits with status 2.
    """
    from agora.sdk.logs import configure_logging

    fmt = os.environ.get("AGORA_LOG_FORMAT", "console")
    level = os.environ.get("AGORA_LOG_LEVEL", "info")
    try:
        configure_logging(fmt, level)
    except ValueError as exc:
        configure_logging()
        log.warning("bad_log_settings", error=str(exc))
    try:
        driver = ExecutorDriver(executor)
    except ValueError as exc:
        log.error("bad_executor_environment", error=str(exc))
        sys.exit(2)
    sys.exit(asyncio.run(driver.run()))
