"""The executor driver's protocol state, without I/O: events in, actions out.

:class:`ExecutorCore` holds what an executor knows about its link to the agent: whether it is
registered on the current connection, the status updates the agent has not acknowledged (sent
again in the re-registration, and the overflow after it), the tasks launched but not yet
acknowledged, framework messages held while the link is down, the recovery deadline, and whether
a shutdown has begun. Its shell (:class:`~agora.sdk.executor.driver.ExecutorDriver`) feeds it the
agent's messages, the link's ups and downs and the executor's calls, and performs the returned
actions in order: :class:`Send` a message, :class:`Invoke` an executor callback,
:class:`Shutdown` the executor, :class:`Note` a log event. Time is an argument (``now``, any
monotonic clock): the only timer is the recovery deadline, which :meth:`ExecutorCore.tick` checks.

Registration retries stay in the shell (tenacity's jittered backoff); the core says what an
attempt sends, if anything (:meth:`ExecutorCore.registration`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final, Literal, TypeAlias

from agora.sdk.codec import encode
from agora.sdk.errors import ProtocolError
from agora.sdk.executor.environment import ExecutorEnvironment
from agora.sdk.ids import AgentID, TaskID
from agora.sdk.messages import (
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
from msgspec import Struct
from msgspec.structs import replace

__all__ = [
    "HELD_MESSAGES_MAX",
    "REREGISTER_ITEMS_MAX",
    "Action",
    "Callback",
    "ExecutorCore",
    "Invoke",
    "Note",
    "Send",
    "Shutdown",
]

#: Framework messages held while the agent link is down (oldest dropped beyond this).
HELD_MESSAGES_MAX: Final = 1024
#: At most this many tasks / updates ride in one REREGISTER_EXECUTOR; further unacknowledged
#: updates follow as STATUS_UPDATE messages once re-registered.
REREGISTER_ITEMS_MAX: Final = 1000

#: The :class:`~agora.sdk.executor.Executor` callbacks the core asks for (``shutdown`` is
#: :class:`Shutdown`: the shell awaits it before it stops).
Callback: TypeAlias = Literal[
    "registered",
    "reregistered",
    "disconnected",
    "launch_task",
    "launch_task_group",
    "kill_task",
    "framework_message",
    "acknowledged",
    "error",
]


class Send(Struct, frozen=True):
    """Send ``message`` to the agent on the current connection."""

    message: Message


class Invoke(Struct, frozen=True):
    """Call the executor's ``callback`` with the driver and ``args``."""

    callback: Callback
    args: tuple[Any, ...] = ()


class Shutdown(Struct, frozen=True):
    """Call the executor's ``shutdown`` (awaiting it), then stop with exit status ``code``."""

    code: int


class Note(Struct, frozen=True):
    """Log ``event`` with ``fields`` at ``level`` (``debug``, ``info``, ``warning``, ``error``)."""

    level: str
    event: str
    fields: tuple[tuple[str, Any], ...] = ()


Action: TypeAlias = Send | Invoke | Shutdown | Note


class ExecutorCore:
    """The executor's side of the agent protocol. Every method returns the actions to perform."""

    def __init__(self, env: ExecutorEnvironment) -> None:
        self._env = env
        self._agent_id = env.agent_id
        self._agent_info: AgentInfo | None = None
        self._framework_info: FrameworkInfo | None = None
        self._executor_info: ExecutorInfo | None = None
        self._updates: dict[bytes, StatusUpdate] = {}
        self._tasks: dict[TaskID, TaskInfo] = {}
        self._held: deque[Message] = deque(maxlen=HELD_MESSAGES_MAX)
        self._session = False  # registered on the current connection
        self._ever_registered = False
        self._connects = 0
        self._stopping = False
        self._recovery_deadline: float | None = None
        #: The updates (by uuid) the latest (re-)registration carried to the agent.
        self._carried: frozenset[bytes] = frozenset()

    # ----------------------------------------------------------------- read-only state

    @property
    def environment(self) -> ExecutorEnvironment:
        return self._env

    @property
    def agent_id(self) -> AgentID | None:
        return self._agent_id

    @property
    def agent_info(self) -> AgentInfo | None:
        return self._agent_info

    @property
    def framework_info(self) -> FrameworkInfo | None:
        return self._framework_info

    @property
    def executor_info(self) -> ExecutorInfo | None:
        return self._executor_info

    @property
    def registered(self) -> bool:
        """True while registered with the agent on the current connection."""
        return self._session

    @property
    def stopping(self) -> bool:
        """True once a shutdown or a stop has begun."""
        return self._stopping

    @property
    def unacknowledged_updates(self) -> tuple[StatusUpdate, ...]:
        return tuple(self._updates.values())

    @property
    def all_acknowledged(self) -> bool:
        return not self._updates

    @property
    def recovery_deadline(self) -> float | None:
        """When :meth:`tick` gives the agent up unless registered by then (None: no deadline)."""
        return self._recovery_deadline

    # ----------------------------------------------------------------- the link

    def start(self, now: float) -> list[Action]:
        """The driver starts: the agent has the recovery timeout to accept the registration."""
        self._arm_recovery(now)
        return []

    def connected(self) -> list[Action]:
        """A connection to the agent is up; the shell then starts registering."""
        self._connects += 1
        if self._connects > 1 and self._session:
            # A new connection is a new peer for the agent's ROUTER: register it again.
            self._session = False
        return [Note("debug", "agent_link_up", (("connects", self._connects),))]

    def disconnected(self, now: float) -> list[Action]:
        was_registered = self._session
        self._session = False
        actions: list[Action] = [
            Note("warning", "agent_link_down", (("recovery_timeout", self._env.recovery_timeout),))
        ]
        self._arm_recovery(now)
        if was_registered:
            actions.append(Invoke("disconnected"))
        return actions

    def registration(self) -> RegisterExecutor | ReregisterExecutor | None:
        """What a registration attempt sends now; None when registered or stopping."""
        if self._session or self._stopping:
            return None
        env = self._env
        if not self._ever_registered:
            self._carried = frozenset()
            return RegisterExecutor(
                framework_id=env.framework_id, executor_id=env.executor_id, secret=env.secret
            )
        message = ReregisterExecutor(
            framework_id=env.framework_id,
            executor_id=env.executor_id,
            tasks=tuple(self._tasks.values())[:REREGISTER_ITEMS_MAX],
            updates=tuple(self._updates.values())[:REREGISTER_ITEMS_MAX],
            secret=env.secret,
        )
        try:
            encode(message)
        except ProtocolError:  # too large with the tasks: the updates are what matter
            message = replace(message, tasks=())
        self._carried = frozenset(u.status.uuid for u in message.updates if u.status.uuid)
        return message

    def tick(self, now: float) -> list[Action]:
        """Give the agent up once the recovery deadline has passed without a registration."""
        deadline = self._recovery_deadline
        if deadline is None or now < deadline:
            return []
        self._recovery_deadline = None
        if self._session:
            return []
        return [
            Note("error", "agent_lost", (("recovery_timeout", self._env.recovery_timeout),)),
            *self.shutdown(1),
        ]

    def _arm_recovery(self, now: float) -> None:
        if self._recovery_deadline is None and not self._stopping:
            self._recovery_deadline = now + self._env.recovery_timeout

    # ----------------------------------------------------------------- the executor's calls

    def send_status_update(self, status: TaskStatus, uuid: bytes, timestamp: float) -> list[Action]:
        """Keep ``status`` (stamped with ``uuid``, ``timestamp`` and this executor) until the
        agent acknowledges it; send it now if registered. Raises :class:`ProtocolError` when it
        breaks its schema, so the caller learns rather than every resend failing."""
        status = replace(
            status,
            uuid=uuid,
            timestamp=timestamp,
            source=StatusSource.EXECUTOR,
            executor_id=self._env.executor_id,
            agent_id=self._agent_id,
        )
        update = StatusUpdate(framework_id=self._env.framework_id, status=status)
        message = StatusUpdateMessage(update=update)
        encode(message)
        self._updates[uuid] = update
        return [Send(message)] if self._session else []

    def send_framework_message(self, data: bytes) -> list[Action]:
        """Send ``data`` to the scheduler now, or hold it until registered (oldest dropped)."""
        message = ExecutorToFramework(
            framework_id=self._env.framework_id,
            executor_id=self._env.executor_id,
            data=bytes(data),
            agent_id=self._agent_id,
        )
        if self._session:
            return [Send(message)]
        actions: list[Action] = []
        if len(self._held) == self._held.maxlen:
            actions.append(
                Note(
                    "warning",
                    "framework_message_dropped",
                    (("reason", "agent link down, hold queue full"),),
                )
            )
        self._held.append(message)
        return actions

    def shutdown(self, code: int) -> list[Action]:
        """Begin shutting down (a signal, the agent's SHUTDOWN_EXECUTOR, the agent lost)."""
        if self._stopping:
            return []
        self._stopping = True
        self._recovery_deadline = None
        return [Shutdown(code)]

    def stop(self) -> None:
        """The driver is stopping without a shutdown (``stop()``, or the shutdown finished)."""
        self._stopping = True
        self._recovery_deadline = None

    # ----------------------------------------------------------------- the agent's messages

    def bad_frame(self, error: ProtocolError | None) -> list[Action]:
        return [
            Note("warning", "bad_frame_from_agent", (("error", str(error)),)),
            Invoke("error", (f"bad frame from the agent: {error}",)),
        ]

    def handle(self, message: Message) -> list[Action]:
        """One message from the agent."""
        if isinstance(message, StatusUpdateAck):
            return self._on_ack(message)
        if isinstance(message, LaunchTask):
            return self._on_launch_task(message)
        if isinstance(message, LaunchTaskGroup):
            return self._on_launch_group(message)
        if isinstance(message, KillTask):
            return self._on_kill_task(message)
        if isinstance(message, FrameworkToExecutor):
            return self._on_framework_message(message)
        if isinstance(message, ExecutorRegistered):
            return self._on_registered(message)
        if isinstance(message, ExecutorReregistered):
            return self._on_reregistered(message)
        if isinstance(message, ShutdownExecutor):
            return self._on_shutdown(message)
        return [Note("warning", "unexpected_message_from_agent", (("name", message.NAME),))]

    def _on_registered(self, message: ExecutorRegistered) -> list[Action]:
        if self._session:
            return [Note("debug", "duplicate_registration_reply")]
        first = not self._ever_registered
        self._agent_id = message.agent_id
        self._agent_info = message.agent_info
        self._framework_info = message.framework_info
        self._executor_info = message.executor_info
        actions = self._registered_now()
        actions.append(Note("info", "executor_registered", (("agent_id", message.agent_id),)))
        if first:
            info = (message.executor_info, message.framework_info, message.agent_info)
            actions.append(Invoke("registered", info))
        else:  # the agent answered a re-registration as a registration (it lost us)
            actions.append(Invoke("reregistered", (message.agent_info,)))
        return actions

    def _on_reregistered(self, message: ExecutorReregistered) -> list[Action]:
        if self._session:
            return [Note("debug", "duplicate_registration_reply")]
        if not self._ever_registered:
            return [Note("warning", "reregistered_before_registered")]
        self._agent_id = message.agent_id
        self._agent_info = message.agent_info
        actions = self._registered_now()
        actions.append(Note("info", "executor_reregistered", (("agent_id", message.agent_id),)))
        actions.append(Invoke("reregistered", (message.agent_info,)))
        return actions

    def _registered_now(self) -> list[Action]:
        self._session = True
        self._ever_registered = True
        self._recovery_deadline = None
        actions: list[Action] = []
        # Every update the registration did not carry: past what one REREGISTER_EXECUTOR holds,
        # and those made while the answer was on its way (they were held, not sent).
        for uuid, update in self._updates.items():
            if uuid not in self._carried:
                actions.append(Send(StatusUpdateMessage(update=update)))
        while self._held:
            actions.append(Send(self._held.popleft()))
        return actions

    def _refusal(self, framework_id: object, name: str) -> Note | None:
        """Why a message for a framework's tasks is not passed on (None: it is)."""
        if framework_id != self._env.framework_id:
            fields = (("name", name), ("framework_id", framework_id))
            return Note("warning", "message_for_other_framework", fields)
        if self._stopping:
            return Note("warning", "message_while_stopping", (("name", name),))
        return None

    def _on_launch_task(self, message: LaunchTask) -> list[Action]:
        if refusal := self._refusal(message.framework_id, message.NAME):
            return [refusal]
        self._tasks[message.task.task_id] = message.task
        return [Invoke("launch_task", (message.task,))]

    def _on_launch_group(self, message: LaunchTaskGroup) -> list[Action]:
        if refusal := self._refusal(message.framework_id, message.NAME):
            return [refusal]
        for task in message.task_group.tasks:
            self._tasks[task.task_id] = task
        return [Invoke("launch_task_group", (message.executor, message.task_group))]

    def _on_kill_task(self, message: KillTask) -> list[Action]:
        fields = (
            ("task_id", message.task_id),
            ("kill_id", message.kill_id),
            ("stopping", self._stopping),
        )
        actions: list[Action] = [Note("info", "kill_received", fields)]
        if refusal := self._refusal(message.framework_id, message.NAME):
            actions.append(refusal)
        else:
            actions.append(Invoke("kill_task", (message.task_id,)))
        return actions

    def _on_framework_message(self, message: FrameworkToExecutor) -> list[Action]:
        if refusal := self._refusal(message.framework_id, message.NAME):
            return [refusal]
        return [Invoke("framework_message", (message.data,))]

    def _on_ack(self, message: StatusUpdateAck) -> list[Action]:
        if self._updates.pop(message.uuid, None) is None:
            return [Note("debug", "ack_for_unknown_update", (("task_id", message.task_id),))]
        self._tasks.pop(message.task_id, None)
        return [Invoke("acknowledged", (message.task_id, message.uuid))]

    def _on_shutdown(self, message: ShutdownExecutor) -> list[Action]:
        env = self._env
        if message.framework_id != env.framework_id or message.executor_id != env.executor_id:
            return [
                Note(
                    "warning",
                    "shutdown_for_other_executor",
                    (("executor_id", message.executor_id),),
                )
            ]
        return [Note("info", "executor_shutdown_requested"), *self.shutdown(0)]
