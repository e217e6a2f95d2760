"""Agent core: registration, backoff, pings, master timeout, epoch fencing, shutdown."""

from __future__ import annotations

from agora.agent.core import SignalExecutor, Terminate
from agora.sdk.ids import AgentID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    Error,
    ErrorCode,
    KillTask,
    MasterInfo,
    Ping,
    Pong,
    RegisterAgent,
    ReregisterAgent,
    RetryRegistration,
    ShutdownAgent,
    ShutdownExecutor,
    StatusUpdateAck,
    TaskState,
)
from support.agent_kit import (
    AGENT_ID,
    FID,
    MASTER_INFO,
    AgentHarness,
    config,
    executor_info,
    forwarded,
    of_type,
    only,
    snapshot,
    to_executor,
    to_master,
)


def test_connected_registers_with_the_agent_info() -> None:
    h = AgentHarness()
    out = h.connected()
    reg = only(of_type(to_master(out), RegisterAgent))
    info = reg.agent_info
    assert (info.hostname, info.port, dict(info.attributes)) == ("host-1", 5051, {"rack": "a"})
    assert info.resources == h.cfg.resources
    assert info.agent_id is None
    assert not h.agent.registered


def test_first_tick_registers_even_without_a_connected_event() -> None:
    h = AgentHarness()
    assert of_type(to_master(h.tick()), RegisterAgent)


def test_registration_retries_with_doubling_backoff_up_to_the_cap() -> None:
    h = AgentHarness(cfg=config(registration_backoff=1.0, registration_backoff_max=8.0))
    h.connected()
    start = h.now
    times = []
    for _ in range(400):
        if of_type(to_master(h.tick(0.05)), RegisterAgent):
            times.append(h.now)
    gaps = [b - a for a, b in zip([start, *times], times, strict=False)]
    # Each delay lies in [d/2, d] for d = 1, 2, 4, 8, 8, ... (deterministic per-host jitter).
    for gap, d in zip(gaps, [1, 2, 4, 8, 8, 8], strict=False):
        assert d / 2 - 0.06 <= gap <= d + 0.06, (gaps, d)
    assert len(gaps) >= 4
    assert max(gaps) <= 8.06


def test_a_master_that_puts_registration_off_is_asked_again_after_its_delay() -> None:
    h = AgentHarness(cfg=config(registration_backoff=1.0, registration_backoff_max=8.0))
    h.connected()
    h.tick(0.05)
    put_off_at = h.now
    h.master(RetryRegistration(retry_after=5.0))
    times = []
    for _ in range(400):
        if of_type(to_master(h.tick(0.05)), RegisterAgent):
            times.append(h.now)
    # Not on the 1 s backoff: after 5 s (a tenth more at most); then the backoff starts over.
    assert 5.0 - 0.06 <= times[0] - put_off_at <= 5.5 + 0.06, times
    assert 0.5 - 0.06 <= times[1] - times[0] <= 1.0 + 0.06, times


def test_a_late_put_off_does_not_unregister_a_registered_agent() -> None:
    h = AgentHarness()
    h.register()
    h.master(RetryRegistration(retry_after=5.0))
    assert h.agent.registered
    for _ in range(20):
        assert not of_type(to_master(h.tick(1.0)), RegisterAgent | ReregisterAgent)


def test_registered_agent_stops_retrying_and_takes_its_id() -> None:
    h = AgentHarness()
    h.register()
    assert h.agent.agent_id == AGENT_ID
    assert h.agent.registered
    assert h.st.master_info == MASTER_INFO
    for _ in range(50):
        out = h.tick(1.0)
        assert not of_type(to_master(out), RegisterAgent | ReregisterAgent)


def test_an_answer_with_another_id_is_ignored() -> None:
    h = AgentHarness()
    h.register()
    before = snapshot(h.agent)
    h.master(AgentRegistered(agent_id=AgentID("e1-A9"), master_info=MASTER_INFO))
    h.master(AgentReregistered(agent_id=AgentID("e1-A9"), master_info=MASTER_INFO))
    assert snapshot(h.agent) == before
    assert h.agent.agent_id == AGENT_ID


def test_ping_is_answered_and_ping_not_connected_means_reregister() -> None:
    h = AgentHarness()
    h.register()
    out = h.master(Ping())
    assert to_master(out) == [Pong()]
    out = h.master(Ping(connected=False))
    assert of_type(to_master(out), Pong)
    rereg = only(of_type(to_master(out), ReregisterAgent))
    assert rereg.agent_id == AGENT_ID
    assert not h.agent.registered
    h.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    assert h.agent.registered


def test_no_ping_for_master_timeout_means_reregister() -> None:
    h = AgentHarness(cfg=config(master_timeout=75.0))
    h.register()
    h.tick(60.0)
    h.master(Ping())
    assert not of_type(to_master(h.tick(74.0)), ReregisterAgent)
    out = h.tick(1.0)
    assert of_type(to_master(out), ReregisterAgent)
    assert not h.agent.registered


def test_disconnect_keeps_retrying_and_reconnect_reregisters_at_once() -> None:
    h = AgentHarness(cfg=config(registration_backoff=1.0, registration_backoff_max=4.0))
    h.register()
    h.disconnected()
    assert not h.agent.registered
    attempts = 0
    for _ in range(200):
        attempts += len(of_type(to_master(h.tick(0.1)), ReregisterAgent))
    assert attempts >= 4  # about every 4 s once the backoff is capped, over 20 s
    out = h.connected()
    assert of_type(to_master(out), ReregisterAgent)
    h.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    assert h.agent.registered


def test_reregistration_reports_tasks_executors_and_frameworks() -> None:
    h = AgentHarness()
    h.register()
    custom = executor_info("exec-1")
    h.run("t-cmd", role="batch")
    h.run("t-custom", executor=custom, role="web")
    h.start_executor("cmd-peer")
    _, u1 = h.update("cmd-peer", "t-cmd", TaskState.RUNNING)
    h.update("cmd-peer", "t-cmd", TaskState.FINISHED)
    out = h.master(Ping(connected=False))
    rereg = only(of_type(to_master(out), ReregisterAgent))
    by_id = {at.task.task_id: at for at in rereg.tasks}
    assert set(by_id) == {"t-cmd", "t-custom"}
    cmd = by_id[TaskID("t-cmd")]
    assert cmd.state is TaskState.FINISHED  # the newest state the agent knows
    assert cmd.status_uuid == u1  # the head of the stream, still unacknowledged
    assert cmd.status_state is TaskState.RUNNING  # and its state, for a new master's answers
    assert cmd.role == "batch"
    assert cmd.framework_id == FID
    custom_task = by_id[TaskID("t-custom")]
    assert (custom_task.state, custom_task.status_uuid, custom_task.role) == (
        TaskState.STAGING,
        None,
        "web",
    )
    assert rereg.executors == (custom,)  # the built-in command executor is not reported
    assert [fw.framework_id for fw in rereg.frameworks] == [FID]
    assert rereg.agent_info.agent_id == AGENT_ID


def test_updates_are_held_while_unregistered_and_heads_resent_after() -> None:
    h = AgentHarness()
    h.register()
    h.run("t1")
    h.start_executor("p")
    h.disconnected()
    out, u1 = h.update("p", "t1", TaskState.RUNNING)
    assert forwarded(out) == []  # held: the master would drop it
    assert only(of_type(to_executor(out, "p"), StatusUpdateAck)).uuid == u1  # acked at once
    assert forwarded(h.tick(30.0)) == []
    out = h.connected()
    assert forwarded(out) == []
    out = h.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    update = only(forwarded(out))
    assert update.status.uuid == u1
    assert update.status.agent_id == AGENT_ID
    # A duplicate answer (to a retried attempt) does not resend again.
    out = h.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    assert forwarded(out) == []


def test_messages_from_an_older_epoch_are_dropped() -> None:
    h = AgentHarness(epoch=5)
    h.connected()
    h.master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    before = snapshot(h.agent)
    assert h.master(Ping(), epoch=4) == []
    assert h.master(KillTask(framework_id=FID, task_id=TaskID("x")), epoch=4) == []
    h.run("t1")  # current epoch: accepted
    assert h.agent.state.tasks
    h.master(ShutdownAgent(), epoch=3)
    assert not h.agent.terminated
    assert snapshot(h.agent) != before


def test_a_newer_master_epoch_triggers_reregistration() -> None:
    h = AgentHarness(epoch=1)
    h.register()
    out = h.master(Ping(), epoch=2)
    assert of_type(to_master(out), Pong)
    assert of_type(to_master(out), ReregisterAgent)
    assert h.st.master_epoch == 2
    new_master = MasterInfo(master_id="m2", address="tcp://x:1", epoch=2)
    h.master(AgentReregistered(agent_id=AGENT_ID, master_info=new_master), epoch=2)
    assert h.agent.registered
    assert not of_type(to_master(h.master(Ping(), epoch=2)), ReregisterAgent)
    # The old master is now fenced off.
    assert h.master(Ping(), epoch=1) == []


def test_work_before_registration_is_ignored() -> None:
    h = AgentHarness()
    h.connected()
    before = snapshot(h.agent)
    assert h.run("t1") == []
    assert h.master(KillTask(framework_id=FID, task_id=TaskID("t1"))) == []
    assert h.master(Error(message="nope", code=ErrorCode.BAD_REQUEST)) == []
    assert h.start_executor("p") == []
    assert snapshot(h.agent) == before


def test_shutdown_agent_stops_executors_and_terminates() -> None:
    h = AgentHarness()
    h.register()
    h.run("t1")
    h.start_executor("cmd")
    h.run("t2", executor=executor_info("exec-1"))  # launching, not registered
    out = h.master(ShutdownAgent(message="removed"))
    assert only(of_type(to_executor(out, "cmd"), ShutdownExecutor)).framework_id == FID
    sig = only(of_type(out, SignalExecutor))
    assert (sig.executor_id, sig.kill) == ("exec-1", False)
    assert out[-1] == Terminate("removed")
    assert h.agent.terminated
    # Inert from now on.
    assert h.tick(100.0) == []
    assert h.run("t3") == []
    assert h.connected() == []
    assert h.exited(FID, "exec-1", 0) == []
    assert of_type(h.actions, Terminate) == [Terminate("removed")]
