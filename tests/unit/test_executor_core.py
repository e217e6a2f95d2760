"""agora.sdk.executor.core: the executor driver's protocol state, events in and actions out.

No sockets, no loop, no clock: a ``Scene`` feeds the core the agent's messages (through the real
codec, so what a test sends could travel on the wire), the link's ups and downs, the executor's
calls and the time, and the tests read the actions it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from agora.sdk import codec
from agora.sdk.errors import ProtocolError
from agora.sdk.executor.core import (
    HELD_MESSAGES_MAX,
    REREGISTER_ITEMS_MAX,
    Action,
    ExecutorCore,
    Invoke,
    Note,
    Send,
    Shutdown,
)
from agora.sdk.executor.environment import ExecutorEnvironment
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorRegistered,
    ExecutorReregistered,
    ExecutorToFramework,
    FrameworkInfo,
    FrameworkToExecutor,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    Message,
    Ping,
    RegisterExecutor,
    ReregisterExecutor,
    ShutdownExecutor,
    StatusSource,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskState,
    TaskStatus,
)
from support.executor_kit import (
    AGENT_ID,
    AGENT_INFO,
    EXECUTOR_ID,
    EXECUTOR_INFO,
    FRAMEWORK_ID,
    task,
)

M = TypeVar("M", bound=Message)

SECRET = "the-executors-own-secret"
RECOVERY_TIMEOUT = 30.0
FRAMEWORK_INFO = FrameworkInfo(name="t")
REGISTERED = ExecutorRegistered(
    executor_info=EXECUTOR_INFO,
    framework_id=FRAMEWORK_ID,
    framework_info=FRAMEWORK_INFO,
    agent_id=AGENT_ID,
    agent_info=AGENT_INFO,
)
REREGISTERED = ExecutorReregistered(agent_id=AGENT_ID, agent_info=AGENT_INFO)


@dataclass
class Scene:
    """One executor's core with a fake clock; every action it returns is checked and kept."""

    now: float = 100.0
    actions: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        env = ExecutorEnvironment(
            agent_endpoint="tcp://127.0.0.1:1",
            framework_id=FRAMEWORK_ID,
            executor_id=EXECUTOR_ID,
            sandbox="/tmp",
            recovery_timeout=RECOVERY_TIMEOUT,
            secret=SECRET,
        )
        self.core = ExecutorCore(env)
        self._uuid = 0
        self.record(self.core.start(self.now))

    # --- stimuli ------------------------------------------------------------------------
    def receive(self, message: Message) -> list[Action]:
        wire = codec.decode(codec.encode(message)).message
        assert wire is not None
        return self.record(self.core.handle(wire))

    def connect(self) -> Message | None:
        """A connection comes up and a registration attempt runs: what it sends."""
        self.record(self.core.connected())
        return self.core.registration()

    def disconnect(self, advance: float = 0.0) -> list[Action]:
        self.now += advance
        return self.record(self.core.disconnected(self.now))

    def tick(self, advance: float) -> list[Action]:
        self.now += advance
        return self.record(self.core.tick(self.now))

    def update(self, task_id: str, state: TaskState = TaskState.RUNNING) -> list[Action]:
        self._uuid += 1
        status = TaskStatus(task_id=TaskID(task_id), state=state, source=StatusSource.MASTER)
        uuid = self._uuid.to_bytes(16, "big")
        return self.record(self.core.send_status_update(status, uuid, 1_700_000_000.0))

    def ack(self, message: StatusUpdateMessage) -> list[Action]:
        status = message.update.status
        assert status.uuid is not None
        return self.receive(
            StatusUpdateAck(framework_id=FRAMEWORK_ID, task_id=status.task_id, uuid=status.uuid)
        )

    def registered(self) -> list[Action]:
        """Connect, register and be accepted (the first registration)."""
        assert isinstance(self.connect(), RegisterExecutor)
        return self.receive(REGISTERED)

    def record(self, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, Send):  # it must be able to travel
                assert codec.decode(codec.encode(action.message)).message == action.message
        self.actions.extend(actions)
        return actions


def sent(actions: Sequence[Action], kind: type[M] | None = None) -> list[Any]:
    messages = [a.message for a in actions if isinstance(a, Send)]
    return [m for m in messages if kind is None or isinstance(m, kind)]


def invoked(actions: Sequence[Action]) -> list[tuple[str, tuple[Any, ...]]]:
    return [(a.callback, a.args) for a in actions if isinstance(a, Invoke)]


def noted(actions: Sequence[Action]) -> list[str]:
    return [a.event for a in actions if isinstance(a, Note)]


def launch(task_id: str, framework_id: FrameworkID = FRAMEWORK_ID) -> LaunchTask:
    return LaunchTask(framework_id=framework_id, task=task(task_id, "true"))


# --------------------------------------------------------------------------- registration


def test_the_first_registration_carries_the_secret_and_hands_over_the_agents_infos() -> None:
    scene = Scene()
    first = scene.connect()
    assert first == RegisterExecutor(
        framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID, secret=SECRET
    )
    assert not scene.core.registered
    actions = scene.receive(REGISTERED)
    assert invoked(actions) == [("registered", (EXECUTOR_INFO, FRAMEWORK_INFO, AGENT_INFO))]
    assert noted(actions) == ["executor_registered"]
    core = scene.core
    assert core.registered and core.agent_id == AGENT_ID and core.agent_info == AGENT_INFO
    assert core.framework_info == FRAMEWORK_INFO and core.executor_info == EXECUTOR_INFO
    assert core.registration() is None  # nothing more to send
    assert core.recovery_deadline is None


def test_duplicate_and_out_of_order_registration_replies_change_nothing() -> None:
    scene = Scene()
    scene.connect()
    assert noted(scene.receive(REREGISTERED)) == ["reregistered_before_registered"]
    assert not scene.core.registered
    scene.receive(REGISTERED)
    assert noted(scene.receive(REGISTERED)) == ["duplicate_registration_reply"]
    assert noted(scene.receive(REREGISTERED)) == ["duplicate_registration_reply"]


def test_an_agent_that_lost_the_executor_answers_a_reregistration_as_a_registration() -> None:
    scene = Scene()
    scene.registered()
    scene.disconnect()
    assert isinstance(scene.connect(), ReregisterExecutor)
    actions = scene.receive(REGISTERED)
    assert invoked(actions) == [("reregistered", (AGENT_INFO,))]
    assert scene.core.registered


def test_a_new_connection_while_registered_registers_again() -> None:
    # a reconnect the transport reports without a disconnect is a new peer for the agent
    scene = Scene()
    scene.registered()
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor) and not scene.core.registered


# --------------------------------------------------------------------------- status updates


def test_an_update_is_stamped_sent_when_registered_and_kept_until_acknowledged() -> None:
    scene = Scene()
    scene.registered()
    scene.receive(launch("t1"))
    (message,) = sent(scene.update("t1"), StatusUpdateMessage)
    status = message.update.status
    assert status.source is StatusSource.EXECUTOR
    assert status.executor_id == EXECUTOR_ID and status.agent_id == AGENT_ID
    assert status.uuid == (1).to_bytes(16, "big") and status.timestamp == 1_700_000_000.0
    assert message.update.framework_id == FRAMEWORK_ID
    assert not scene.core.all_acknowledged
    assert scene.ack(message) == [Invoke("acknowledged", (TaskID("t1"), status.uuid))]
    assert scene.core.all_acknowledged and scene.core.unacknowledged_updates == ()
    # the acknowledged task no longer rides in a re-registration; an unknown ack is noted
    assert noted(scene.ack(message)) == ["ack_for_unknown_update"]
    scene.disconnect()
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor) and again.tasks == () and again.updates == ()


def test_a_status_that_breaks_its_schema_raises_and_is_not_kept() -> None:
    scene = Scene()
    scene.registered()
    bad = TaskStatus(
        task_id=TaskID("t1"),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        message="x" * 100_000,
    )
    with pytest.raises(ProtocolError):
        scene.core.send_status_update(bad, b"\x01" * 16, 0.0)
    assert scene.core.unacknowledged_updates == ()


def test_unacknowledged_updates_and_launched_tasks_ride_in_the_reregistration() -> None:
    scene = Scene()
    scene.registered()
    scene.receive(launch("t1"))
    group = TaskGroupInfo(tasks=(task("g1", "true"), task("g2", "true")))
    actions = scene.receive(
        LaunchTaskGroup(framework_id=FRAMEWORK_ID, executor=EXECUTOR_INFO, task_group=group)
    )
    assert invoked(actions) == [("launch_task_group", (EXECUTOR_INFO, group))]
    first, second = (sent(scene.update(t))[0] for t in ("t1", "g1"))
    assert invoked(scene.disconnect()) == [("disconnected", ())]
    assert sent(scene.update("t1", TaskState.FINISHED)) == []  # kept, not sent, while down
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor) and again.secret == SECRET
    assert [t.task_id for t in again.tasks] == ["t1", "g1", "g2"]
    assert [u.status.task_id for u in again.updates] == ["t1", "g1", "t1"]
    assert again.updates[:2] == (first.update, second.update)
    actions = scene.receive(REREGISTERED)
    assert sent(actions) == []  # everything rode in the re-registration
    assert invoked(actions) == [("reregistered", (AGENT_INFO,))]


def test_updates_beyond_what_a_reregistration_carries_follow_once_reregistered() -> None:
    scene = Scene()
    scene.registered()
    scene.disconnect()
    extra = 3
    for n in range(REREGISTER_ITEMS_MAX + extra):
        scene.update(f"t{n}")
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor)
    assert len(again.updates) == REREGISTER_ITEMS_MAX
    follow = sent(scene.receive(REREGISTERED), StatusUpdateMessage)
    assert [m.update.status.task_id for m in follow] == [
        f"t{n}" for n in range(REREGISTER_ITEMS_MAX, REREGISTER_ITEMS_MAX + extra)
    ]


def test_an_update_made_while_the_reregistration_is_answered_follows_it() -> None:
    """A task ends after REREGISTER_EXECUTOR left and before its answer came: that update was
    held (not registered yet) and is sent once re-registered; before, it waited unsent for
    ever and its task never ended for the agent. Found by the cluster simulation's soak."""
    scene = Scene()
    scene.registered()
    scene.receive(launch("t1"))
    scene.disconnect()
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor) and again.updates == ()
    assert sent(scene.update("t1", TaskState.FINISHED)) == []  # the answer is on its way
    follow = sent(scene.receive(REREGISTERED), StatusUpdateMessage)
    assert [(m.update.status.task_id, m.update.status.state) for m in follow] == [
        ("t1", TaskState.FINISHED)
    ]


def test_a_reregistration_too_large_with_its_tasks_carries_the_updates_alone() -> None:
    scene = Scene()
    scene.registered()
    big = b"x" * 4_000_000  # each launch fits a frame; five do not
    for n in range(5):
        scene.receive(LaunchTask(framework_id=FRAMEWORK_ID, task=task(f"t{n}", "true", data=big)))
    scene.update("t0")
    scene.disconnect()
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor)
    assert again.tasks == () and [u.status.task_id for u in again.updates] == ["t0"]


# --------------------------------------------------------------------------- framework messages


def test_framework_messages_are_held_while_down_and_sent_in_order_once_registered() -> None:
    scene = Scene()
    scene.connect()
    for n in range(HELD_MESSAGES_MAX + 2):
        actions = scene.core.send_framework_message(f"m{n}".encode())
        assert sent(actions) == []
    assert noted(actions) == ["framework_message_dropped"]
    out = sent(scene.receive(REGISTERED), ExecutorToFramework)
    assert [m.data for m in out] == [f"m{n}".encode() for n in range(2, HELD_MESSAGES_MAX + 2)]
    (now,) = sent(scene.core.send_framework_message(b"now"))
    assert now.data == b"now" and now.agent_id == AGENT_ID
    actions = scene.receive(
        FrameworkToExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID, data=b"hi")
    )
    assert invoked(actions) == [("framework_message", (b"hi",))]


# --------------------------------------------------------------------------- peer checks


def test_messages_for_another_framework_or_while_stopping_reach_no_callback() -> None:
    scene = Scene()
    scene.registered()
    other = FrameworkID("fw-other")
    actions = scene.receive(launch("t1", other))
    assert invoked(actions) == [] and noted(actions) == ["message_for_other_framework"]
    kill = scene.receive(KillTask(framework_id=other, task_id=TaskID("t1"), kill_id="k1"))
    assert invoked(kill) == []
    assert noted(kill) == ["kill_received", "message_for_other_framework"]
    kill = scene.receive(KillTask(framework_id=FRAMEWORK_ID, task_id=TaskID("t1")))
    assert invoked(kill) == [("kill_task", (TaskID("t1"),))]
    scene.disconnect()
    again = scene.connect()
    assert isinstance(again, ReregisterExecutor) and again.tasks == ()  # the refused launch
    scene.receive(REREGISTERED)
    scene.core.stop()
    actions = scene.receive(launch("t2"))
    assert invoked(actions) == [] and noted(actions) == ["message_while_stopping"]


def test_shutdown_for_this_executor_only_and_once() -> None:
    scene = Scene()
    scene.registered()
    other = ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=ExecutorID("other"))
    assert noted(scene.receive(other)) == ["shutdown_for_other_executor"]
    assert not scene.core.stopping
    ours = ShutdownExecutor(framework_id=FRAMEWORK_ID, executor_id=EXECUTOR_ID)
    actions = scene.receive(ours)
    assert [a for a in actions if isinstance(a, Shutdown)] == [Shutdown(0)]
    assert scene.core.stopping and scene.core.registration() is None
    assert [a for a in scene.receive(ours) if isinstance(a, Shutdown)] == []
    assert scene.core.shutdown(0) == []


def test_a_bad_frame_and_an_unexpected_message_are_noted_and_survived() -> None:
    scene = Scene()
    scene.registered()
    actions = scene.record(scene.core.bad_frame(ProtocolError("truncated")))
    assert noted(actions) == ["bad_frame_from_agent"]
    assert invoked(actions) == [("error", ("bad frame from the agent: truncated",))]
    assert noted(scene.receive(Ping())) == ["unexpected_message_from_agent"]
    assert scene.core.registered


# --------------------------------------------------------------------------- recovery timer


def test_an_agent_that_never_answers_is_given_up_at_the_recovery_deadline() -> None:
    scene = Scene()
    assert scene.core.recovery_deadline == scene.now + RECOVERY_TIMEOUT
    scene.connect()
    assert scene.tick(RECOVERY_TIMEOUT - 0.001) == []
    actions = scene.tick(0.001)
    assert noted(actions) == ["agent_lost"] and actions[-1] == Shutdown(1)
    assert scene.core.stopping and scene.core.recovery_deadline is None
    assert scene.tick(RECOVERY_TIMEOUT) == []


def test_the_deadline_runs_from_the_disconnect_and_a_reregistration_clears_it() -> None:
    scene = Scene()
    scene.registered()
    scene.tick(RECOVERY_TIMEOUT * 2)  # registered: nothing to give up
    assert not scene.core.stopping
    scene.disconnect(advance=5.0)
    assert scene.core.recovery_deadline == scene.now + RECOVERY_TIMEOUT
    scene.disconnect(advance=5.0)  # a second report keeps the first deadline
    assert scene.core.recovery_deadline == scene.now - 5.0 + RECOVERY_TIMEOUT
    scene.connect()
    scene.receive(REREGISTERED)
    assert scene.core.recovery_deadline is None
    assert scene.tick(RECOVERY_TIMEOUT * 2) == [] and not scene.core.stopping


def test_a_stopping_executor_arms_no_deadline() -> None:
    scene = Scene()
    scene.registered()
    scene.core.stop()
    scene.disconnect()
    assert scene.core.recovery_deadline is None
    assert scene.tick(RECOVERY_TIMEOUT * 2) == []
