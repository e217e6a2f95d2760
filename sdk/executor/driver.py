"""The executor side of the agent <-> executor link.

``ExecutorDriver`` connects to the agent named in the environment the agent gave the process,
registers (retrying with jittered, capped backoff), hands the agent's messages to an
:class:`~agora.sdk.executor.Executor` and carries the executor's status updates and framework
messages back. Every status update is kept until the agent acknowledges it. When the link drops,
the driver re-registers on the new connection with the updates still unacknowledged (and the
tasks whose launch the agent has not yet seen an update for); framework messages sent meanwhile
are held (at most ``HELD_MESSAGES_MAX``) and go out once re-registered. An agent gone for longer
than the recovery timeout makes the driver call ``Executor.shutdown`` and exit with status 1.
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
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

from agora.sdk._lean import import_structlog_without_rich
from msgspec.structs import replace

import_structlog_without_rich()  # executors start often and log plainly: see agora.sdk._lean

import structlog  # noqa: E402
import zmq  # noqa: E402
from agora.sdk.codec import encode  # noqa: E402
from agora.sdk.errors import ProtocolError  # noqa: E402
from agora.sdk.executor.environment import (  # noqa: E402
    DEFAULT_RECOVERY_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE_PERIOD,
    EXECUTOR_ENV_VARS,
    ExecutorEnvironment,
)
from agora.sdk.executor.executor import Executor  # noqa: E402
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID  # noqa: E402
from agora.sdk.messages import (  # noqa: E402
    AgentInfo,
    ExecutorInfo,
    ExecutorRegistered,
    ExecutorReregistered,
    ExecutorToFramework,
    FrameworkInfo,
    FrameworkToExecutor,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    Message,
    RegisterExecutor,
    ReregisterExecutor,
    ShutdownExecutor,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.transport import Received, TransportClosed, ZmqClient  # noqa: E402
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

#: Framework messages held while the agent link is down (oldest dropped beyond this).
HELD_MESSAGES_MAX: Final = 1024
#: At most this many tasks / updates ride in one REREGISTER_EXECUTOR; further unacknowledged
#: updates follow as STATUS_UPDATE messages once re-registered.
_REREGISTER_ITEMS_MAX: Final = 1000
_REGISTER_BACKOFF_INITIAL: Final = 0.5
_REGISTER_BACKOFF_MAX: Final = 5.0
_FLUSH_TIMEOUT_MIN: Final = 1.0
_FLUSH_TIMEOUT_MAX: Final = 10.0


class ExecutorDriver:
    """Runs an :class:`Executor` against the agent named by the environment (asyncio).

    ``environ`` defaults to ``os.environ``; a missing or bad AGORA_* variable raises ValueError.
    The calls (``send_status_update``, ``send_framework_message``, ``stop``) are plain methods
    that queue work for the driver's loop; call them from that loop (e.g. from callbacks).
    """

    def __init__(self, executor: Executor, *, environ: Mapping[str, str] | None = None) -> None:
        self._executor = executor
        self._env = ExecutorEnvironment.from_environ(os.environ if environ is None else environ)
        self._agent_id = self._env.agent_id
        self._agent_info: AgentInfo | None = None
        self._framework_info: FrameworkInfo | None = None
        self._executor_info: ExecutorInfo | None = None
        self._client: ZmqClient | None = None
        self._outbox: deque[Message] = deque()
        self._outbox_ready = asyncio.Event()
        self._outbox_empty = asyncio.Event()
        self._outbox_empty.set()
        self._held: deque[Message] = deque(maxlen=HELD_MESSAGES_MAX)
        self._updates: dict[bytes, StatusUpdate] = {}
        self._all_acked = asyncio.Event()
        self._all_acked.set()
        self._tasks: dict[TaskID, TaskInfo] = {}
        self._session = False  # registered on the current connection
        self._ever_registered = False
        self._connects = 0
        self._wake = asyncio.Event()
        self._registrar: asyncio.Task[None] | None = None
        self._recovery_timer: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[int] | None = None
        self._stopping = False
        self._background: set[asyncio.Task[Any]] = set()
        self._handlers: dict[type[Message], Callable[[Any], None]] = {
            ExecutorRegistered: self._on_registered,
            ExecutorReregistered: self._on_reregistered,
            LaunchTask: self._on_launch_task,
            LaunchTaskGroup: self._on_launch_group,
            KillTask: self._on_kill_task,
            FrameworkToExecutor: self._on_framework_message,
            StatusUpdateAck: self._on_ack,
            ShutdownExecutor: self._on_shutdown,
        }

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
        return self._agent_id

    @property
    def sandbox(self) -> str:
        return self._env.sandbox

    @property
    def framework_info(self) -> FrameworkInfo | None:
        """The framework's info from the agent (None until registered)."""
        return self._framework_info

    @property
    def executor_info(self) -> ExecutorInfo | None:
        return self._executor_info

    @property
    def agent_info(self) -> AgentInfo | None:
        return self._agent_info

    @property
    def registered(self) -> bool:
        """True while registered with the agent on the current connection."""
        return self._session

    @property
    def stopping(self) -> bool:
        """True once shutdown or stop has begun."""
        return self._stopping or (self._done is not None and self._done.done())

    @property
    def unacknowledged_updates(self) -> tuple[StatusUpdate, ...]:
        return tuple(self._updates.values())

    # ----------------------------------------------------------------- calls

    def send_status_update(self, status: TaskStatus) -> None:
        """Send ``status`` to the agent, and again on re-registration until it is acknowledged.

        Fills in ``uuid`` (fresh uuid4 bytes), ``timestamp`` (now), ``source`` (EXECUTOR),
        ``executor_id`` and ``agent_id``. Raises :class:`ProtocolError` when the status breaks
        its schema (e.g. an over-long message).
        """
        uuid = _uuid4()
        status = replace(
            status,
            uuid=uuid,
            timestamp=time.time(),
            source=StatusSource.EXECUTOR,
            executor_id=self._env.executor_id,
            agent_id=self._agent_id,
        )
        update = StatusUpdate(framework_id=self._env.framework_id, status=status)
        message = StatusUpdateMessage(update=update)
        encode(message)  # fail here, in the caller, rather than forever on every resend
        self._updates[uuid] = update
        self._all_acked.clear()
        if self._session:
            self._queue(message)

    def send_framework_message(self, data: bytes) -> None:
        """Send ``data`` to the framework's scheduler (best effort, like Mesos).

        Held while the agent link is down and sent once re-registered (oldest dropped beyond
        ``HELD_MESSAGES_MAX``).
        """
        message = ExecutorToFramework(
            framework_id=self._env.framework_id,
            executor_id=self._env.executor_id,
            data=bytes(data),
            agent_id=self._agent_id,
        )
        if self._session:
            self._queue(message)
            return
        if len(self._held) == self._held.maxlen:
            log.warning("framework_message_dropped", reason="agent link down, hold queue full")
        self._held.append(message)

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
            client = ZmqClient.connect(
                env.agent_endpoint,
                on_connected=self._on_transport_connected,
                on_disconnected=self._on_transport_disconnected,
            )
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
        self._arm_recovery_timer()
        self._start_registration()
        try:
            code = await self._done
            await self._flush()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            self._disarm_recovery_timer()
            pending = [*workers, *self._background]
            if self._registrar is not None:
                pending.append(self._registrar)
            for task in pending:
                task.cancel()
            client.close()
            await asyncio.gather(*pending, return_exceptions=True)
        log.info("executor_exiting", status=code)
        return code

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
        self._begin_shutdown(0)

    async def _flush(self) -> None:
        """Give the agent a bounded chance to acknowledge what is pending before the exit."""
        if not self._session or (not self._updates and not self._outbox):
            return
        timeout = min(max(self._env.shutdown_grace_period, _FLUSH_TIMEOUT_MIN), _FLUSH_TIMEOUT_MAX)
        try:
            async with asyncio.timeout(timeout):
                await self._outbox_empty.wait()
                await self._all_acked.wait()
        except TimeoutError:
            log.warning("executor_exit_with_unacknowledged_updates", count=len(self._updates))

    def _finish(self, code: int) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(code)

    # ----------------------------------------------------------------- wire

    def _queue(self, message: Message) -> None:
        self._outbox.append(message)
        self._outbox_empty.clear()
        self._outbox_ready.set()

    async def _send(self, client: ZmqClient) -> None:
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

    async def _receive(self, client: ZmqClient) -> None:
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
            log.warning("bad_frame_from_agent", error=str(received.error))
            self._invoke(self._executor.error, f"bad frame from the agent: {received.error}")
            return
        handler = self._handlers.get(type(message))
        if handler is None:
            log.warning("unexpected_message_from_agent", name=message.NAME)
            return
        try:
            handler(message)
        except Exception:  # a bug handling one message must not stop the executor
            log.exception("executor_message_failed", name=message.NAME)

    # ----------------------------------------------------------------- registration

    def _on_transport_connected(self) -> None:
        self._connects += 1
        if self._connects > 1 and self._session:
            # A new connection is a new peer for the agent's ROUTER: register it again.
            self._session = False
        log.debug("agent_link_up", connects=self._connects)
        self._start_registration()

    def _on_transport_disconnected(self) -> None:
        was_registered = self._session
        self._session = False
        log.warning("agent_link_down", recovery_timeout=self._env.recovery_timeout)
        self._arm_recovery_timer()
        if was_registered:
            self._invoke(self._executor.disconnected)

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
        if self._session or self.stopping:
            return True
        client = self._client
        if client is None or not client.connected:
            return False  # the next connection wakes us
        env = self._env
        if not self._ever_registered:
            self._queue(
                RegisterExecutor(
                    framework_id=env.framework_id, executor_id=env.executor_id, secret=env.secret
                )
            )
        else:
            self._queue(self._reregistration())
        return False

    def _reregistration(self) -> ReregisterExecutor:
        env = self._env
        tasks = tuple(self._tasks.values())[:_REREGISTER_ITEMS_MAX]
        updates = tuple(self._updates.values())[:_REREGISTER_ITEMS_MAX]
        message = ReregisterExecutor(
            framework_id=env.framework_id,
            executor_id=env.executor_id,
            tasks=tasks,
            updates=updates,
            secret=env.secret,
        )
        try:
            encode(message)
        except ProtocolError:  # too large with the tasks: the updates are what matter
            message = replace(message, tasks=())
        return message

    def _on_registered(self, message: ExecutorRegistered) -> None:
        if self._session:
            log.debug("duplicate_registration_reply")
            return
        first = not self._ever_registered
        self._agent_id = message.agent_id
        self._agent_info = message.agent_info
        self._framework_info = message.framework_info
        self._executor_info = message.executor_info
        self._registered_now()
        log.info("executor_registered", agent_id=message.agent_id)
        if first:
            self._invoke(
                self._executor.registered,
                message.executor_info,
                message.framework_info,
                message.agent_info,
            )
        else:  # the agent answered a re-registration as a registration (it lost us)
            self._invoke(self._executor.reregistered, message.agent_info)

    def _on_reregistered(self, message: ExecutorReregistered) -> None:
        if self._session:
            log.debug("duplicate_registration_reply")
            return
        if not self._ever_registered:
            log.warning("reregistered_before_registered")
            return
        self._agent_id = message.agent_id
        self._agent_info = message.agent_info
        self._registered_now()
        log.info("executor_reregistered", agent_id=message.agent_id)
        self._invoke(self._executor.reregistered, message.agent_info)

    def _registered_now(self) -> None:
        resend = self._ever_registered
        self._session = True
        self._ever_registered = True
        self._wake.set()
        self._disarm_recovery_timer()
        if resend:  # what the REREGISTER_EXECUTOR could not carry
            for update in tuple(self._updates.values())[_REREGISTER_ITEMS_MAX:]:
                self._queue(StatusUpdateMessage(update=update))
        while self._held:
            self._queue(self._held.popleft())

    def _arm_recovery_timer(self) -> None:
        if self._recovery_timer is None and not self.stopping:
            self._recovery_timer = asyncio.get_running_loop().call_later(
                self._env.recovery_timeout, self._on_recovery_timeout
            )

    def _disarm_recovery_timer(self) -> None:
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
            self._recovery_timer = None

    def _on_recovery_timeout(self) -> None:
        self._recovery_timer = None
        if self._session:
            return
        log.error("agent_lost", recovery_timeout=self._env.recovery_timeout)
        self._begin_shutdown(1)

    # ----------------------------------------------------------------- messages

    def _for_us(self, framework_id: FrameworkID, name: str) -> bool:
        if framework_id != self._env.framework_id:
            log.warning("message_for_other_framework", name=name, framework_id=framework_id)
            return False
        if self.stopping:
            log.warning("message_while_stopping", name=name)
            return False
        return True

    def _on_launch_task(self, message: LaunchTask) -> None:
        if not self._for_us(message.framework_id, message.NAME):
            return
        self._tasks[message.task.task_id] = message.task
        self._invoke(self._executor.launch_task, message.task)

    def _on_launch_group(self, message: LaunchTaskGroup) -> None:
        if not self._for_us(message.framework_id, message.NAME):
            return
        for task in message.task_group.tasks:
            self._tasks[task.task_id] = task
        self._invoke(self._executor.launch_task_group, message.executor, message.task_group)

    def _on_kill_task(self, message: KillTask) -> None:
        log.info(
            "kill_received",
            task_id=message.task_id,
            kill_id=message.kill_id,
            stopping=self.stopping,
        )
        if self._for_us(message.framework_id, message.NAME):
            self._invoke(self._executor.kill_task, message.task_id)

    def _on_framework_message(self, message: FrameworkToExecutor) -> None:
        if self._for_us(message.framework_id, message.NAME):
            self._invoke(self._executor.framework_message, message.data)

    def _on_ack(self, message: StatusUpdateAck) -> None:
        if self._updates.pop(message.uuid, None) is None:
            log.debug("ack_for_unknown_update", task_id=message.task_id)
            return
        self._tasks.pop(message.task_id, None)
        if not self._updates:
            self._all_acked.set()

    def _on_shutdown(self, message: ShutdownExecutor) -> None:
        env = self._env
        if message.framework_id != env.framework_id or message.executor_id != env.executor_id:
            log.warning("shutdown_for_other_executor", executor_id=message.executor_id)
            return
        log.info("executor_shutdown_requested")
        self._begin_shutdown(0)

    # ----------------------------------------------------------------- callbacks

    def _begin_shutdown(self, code: int) -> None:
        if self.stopping:
            return
        self._stopping = True
        self._disarm_recovery_timer()
        task = asyncio.get_running_loop().create_task(self._shutdown(code))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _shutdown(self, code: int) -> None:
        try:
            result = self._executor.shutdown(self)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("executor_callback_failed", callback="shutdown")
        self._finish(code)

    def _invoke(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            result = callback(self, *args)
        except Exception:
            log.exception("executor_callback_failed", callback=callback.__name__)
            return
        if inspect.isawaitable(result):
            name = callback.__name__
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
