"""Executors prove who they are: a registration without the executor's secret changes nothing.

A stranger on the host can read an executor's ids from the agent's /state and connect to its
executor socket; without the secret the agent gave the executor process, its REGISTER or
REREGISTER_EXECUTOR is refused (an ExecutorRefused action for the shell to log), and its forged
updates are ignored: the real executor keeps its peer, its task and its launches.
"""

from __future__ import annotations

from agora.agent.core import Agent, ExecutorRefused, ExecutorState, LaunchExecutor
from agora.agent.core.checkpoint import EXECUTOR, ExecutorRecord
from agora.agent.core.executor_auth import SECRET_ENV
from agora.sdk.codec import pack_record, unpack_record
from agora.sdk.ids import ExecutorID, TaskID
from agora.sdk.messages import (
    ExecutorRegistered,
    ExecutorReregistered,
    LaunchTask,
    RegisterExecutor,
    ReregisterExecutor,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    TaskState,
    TaskStatus,
)
from msgspec.structs import replace
from support.agent_kit import (
    FID,
    AgentHarness,
    forwarded,
    of_type,
    only,
    snapshot,
    to_executor,
)

CMD = ExecutorID("agora-command")


def running_task() -> AgentHarness:
    """A registered agent whose command executor (peer "real") runs t1."""
    h = AgentHarness()
    h.register()
    h.run("t1")
    h.start_executor("real")
    h.update("real", "t1", TaskState.RUNNING)
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.RUNNING
    return h


def finished(uuid: bytes = b"\x99" * 16) -> StatusUpdate:
    status = TaskStatus(
        task_id=TaskID("t1"), state=TaskState.FINISHED, source=StatusSource.EXECUTOR, uuid=uuid
    )
    return StatusUpdate(framework_id=FID, status=status)


def test_each_launch_gets_its_own_secret_in_the_environment() -> None:
    h = AgentHarness()
    h.register()
    first = only(of_type(h.run("t1"), LaunchExecutor))
    other = FID.__class__("fw-2")
    second = only(of_type(h.run("t2", framework_id=other), LaunchExecutor))
    assert first.environment[SECRET_ENV] == h.secret(CMD)
    assert second.environment[SECRET_ENV] == h.secret(CMD, other)
    assert first.environment[SECRET_ENV] != second.environment[SECRET_ENV]
    assert h.secret(CMD) not in repr(h.st.executors)  # never in a log line


def test_a_stranger_reregistering_without_or_with_a_wrong_secret_changes_nothing() -> None:
    h = running_task()
    for secret in ("", "guess", h.secret(CMD)[:-1]):
        before = snapshot(h.agent)
        out = h.executor(
            "stranger",
            ReregisterExecutor(
                framework_id=FID, executor_id=CMD, updates=(finished(),), secret=secret
            ),
        )
        refused = only(of_type(out, ExecutorRefused))
        assert (refused.framework_id, refused.executor_id, refused.peer) == (FID, CMD, "stranger")
        assert refused.reason == ("missing secret" if not secret else "wrong secret")
        assert to_executor(out, "stranger") == []
        assert forwarded(out) == []
        assert snapshot(h.agent) == before
    ex = h.st.executors[(FID, CMD)]
    assert ex.peer == "real" and ex.state is ExecutorState.RUNNING
    assert h.st.executors_by_peer == {"real": (FID, CMD)}
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.RUNNING


def test_a_stranger_register_is_refused_too_even_before_the_executor_registers() -> None:
    h = AgentHarness()
    h.register()
    h.run("t1")
    out = h.executor("stranger", RegisterExecutor(framework_id=FID, executor_id=CMD))
    assert only(of_type(out, ExecutorRefused)).reason == "missing secret"
    assert to_executor(out, "stranger") == []  # the launch is not handed to the stranger
    assert h.st.executors[(FID, CMD)].state is ExecutorState.LAUNCHING
    out = h.start_executor("real")  # the real one still registers and gets the task
    msgs = to_executor(out, "real")
    assert isinstance(msgs[0], ExecutorRegistered)
    assert isinstance(msgs[1], LaunchTask) and msgs[1].task.task_id == "t1"


def test_forged_updates_from_the_stranger_are_ignored_and_the_real_executor_goes_on() -> None:
    h = running_task()
    h.executor("stranger", ReregisterExecutor(framework_id=FID, executor_id=CMD, secret="x"))
    before = snapshot(h.agent)
    out, _ = h.update("stranger", "t1", TaskState.FINISHED)
    assert out == [] and snapshot(h.agent) == before
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.RUNNING
    # The agent still sends the executor's launches to the real peer ...
    out = h.run("t2")
    assert [m.task.task_id for m in of_type(to_executor(out, "real"), LaunchTask)] == ["t2"]
    # ... and takes its updates (the FINISHED waits behind the unacknowledged RUNNING).
    out, uuid = h.update("real", "t1", TaskState.FINISHED)
    assert only(of_type(to_executor(out, "real"), StatusUpdateAck)).uuid == uuid
    assert h.st.tasks[(FID, TaskID("t1"))].state is TaskState.FINISHED


def test_the_right_secret_rebinds_the_executor_to_its_new_peer() -> None:
    h = running_task()
    message = ReregisterExecutor(framework_id=FID, executor_id=CMD, secret=h.secret(CMD))
    out = h.executor("reconnected", message)
    assert not of_type(out, ExecutorRefused)
    assert isinstance(to_executor(out, "reconnected")[0], ExecutorReregistered)
    assert h.st.executors[(FID, CMD)].peer == "reconnected"


def restarted(h: AgentHarness, records: dict[tuple[str, str], bytes]) -> AgentHarness:
    fresh = AgentHarness(cfg=h.cfg, now=h.now)
    fresh.agent = Agent(fresh.cfg)
    fresh.agent.recover(records, fresh.now, alive={(FID, CMD)}, cleanup=False)
    fresh.register()
    assert fresh.st.executors[(FID, CMD)].state is ExecutorState.RECOVERING
    return fresh


def test_recovery_keeps_the_secret_and_refuses_a_stranger_while_recovering() -> None:
    h = running_task()
    secret = h.secret(CMD)
    fresh = restarted(h, h.agent.durable_records())
    assert fresh.secret(CMD) == secret
    out = fresh.executor(
        "stranger",
        ReregisterExecutor(framework_id=FID, executor_id=CMD, updates=(finished(),), secret="no"),
    )
    assert only(of_type(out, ExecutorRefused)).reason == "wrong secret"
    assert fresh.st.executors[(FID, CMD)].state is ExecutorState.RECOVERING
    assert fresh.st.tasks[(FID, TaskID("t1"))].state is TaskState.RUNNING
    out = fresh.executor(
        "real-again", ReregisterExecutor(framework_id=FID, executor_id=CMD, secret=secret)
    )
    assert isinstance(to_executor(out, "real-again")[0], ExecutorReregistered)
    assert fresh.st.executors[(FID, CMD)].state is ExecutorState.RUNNING


def test_an_executor_checkpointed_without_a_secret_is_still_readopted() -> None:
    # Written by an agent from before executors had secrets: the process cannot know one.
    h = running_task()
    records = dict(h.agent.durable_records())
    key = next(k for k in records if k[0] == EXECUTOR)
    records[key] = pack_record(replace(unpack_record(ExecutorRecord, records[key]), secret=""))
    fresh = restarted(h, records)
    out = fresh.executor("old", ReregisterExecutor(framework_id=FID, executor_id=CMD))
    assert isinstance(to_executor(out, "old")[0], ExecutorReregistered)
