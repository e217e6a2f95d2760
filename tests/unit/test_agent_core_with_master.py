"""The agent core against the real master core, wired through the codec, no sockets.

Proves the two state machines agree on the protocol: registration, a task's whole life with
framework acknowledgements, kills, re-registration with pending updates, framework teardown.
"""

from __future__ import annotations

from agora.agent.core import Action, LaunchExecutor, ToExecutor, ToMaster
from agora.master.core import Send
from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    Kill,
    LaunchTask,
    Ping,
    Reason,
    StatusUpdateAck,
    TaskState,
    TaskStatus,
    Teardown,
)
from support.agent_kit import AgentHarness, of_type, only
from support.master_kit import Harness, offers_in, updates_in

AGENT = "agent-peer"
SCHED = "sched"


class Wired:
    def __init__(self) -> None:
        self.m = Harness()
        self.a = AgentHarness()
        self.to_executors: list[ToExecutor] = []
        self.launches: list[LaunchExecutor] = []
        self.framework_updates: list[TaskStatus] = []

    def agent_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToMaster):
                self.master_out(self.m.handle(AGENT, action.message))
            elif isinstance(action, ToExecutor):
                self.to_executors.append(action)
            elif isinstance(action, LaunchExecutor):
                self.launches.append(action)

    def master_out(self, sends: list[Send]) -> None:
        for send in sends:
            if send.to == AGENT:
                self.agent_out(self.a.master(send.message, epoch=send.epoch))
        self.framework_updates.extend(updates_in(sends, SCHED))

    def tick(self, dt: float) -> None:
        self.a.now += dt
        self.m.now = self.a.now
        self.agent_out(self.a.tick())
        self.master_out(self.m.tick())


def boot() -> tuple[Wired, FrameworkID]:
    w = Wired()
    w.m.now = w.a.now
    w.agent_out(w.a.connected())
    assert w.a.agent.registered
    fid = w.m.subscribe(SCHED)
    return w, fid


def launch(w: Wired, fid: FrameworkID, task_id: str) -> None:
    offers = offers_in(w.m.tick(), SCHED)
    offer = offers[0]
    w.master_out(w.m.launch(SCHED, fid, [offer], [(task_id, "cpus:1;mem:64", offer.agent_id)]))


def test_a_task_lives_and_ends_through_both_cores() -> None:
    w, fid = boot()
    agent_id = w.a.agent.agent_id
    assert agent_id is not None and agent_id in w.m.master.state.agents
    launch(w, fid, "t1")
    assert only(w.launches).builtin
    w.agent_out(w.a.start_executor("cmd", framework_id=fid))
    assert of_type([x.message for x in w.to_executors], LaunchTask)
    w.agent_out(w.a.update("cmd", "t1", TaskState.RUNNING, framework_id=fid)[0])
    w.agent_out(w.a.update("cmd", "t1", TaskState.FINISHED, framework_id=fid, exit_code=0)[0])
    # Only the head reached the framework. Its resend (1 s later) carries latest_state, so the
    # master frees the task's resources before the framework has acknowledged anything.
    assert [s.state for s in w.framework_updates] == [TaskState.RUNNING]
    w.tick(1.0)
    assert [s.state for s in w.framework_updates] == [TaskState.RUNNING, TaskState.RUNNING]
    task = w.m.master.state.tasks[(fid, TaskID("t1"))]
    assert task.state is TaskState.FINISHED and task.released
    # The framework acknowledges each update; the next one follows, then the task is gone.
    for _ in range(2):
        status = w.framework_updates[-1]
        assert status.uuid is not None
        w.master_out(w.m.ack(SCHED, fid, agent_id, "t1", status.uuid))
    states = [s.state for s in w.framework_updates]
    assert states == [TaskState.RUNNING, TaskState.RUNNING, TaskState.FINISHED]
    assert w.framework_updates[-1].exit_code == 0
    assert (fid, TaskID("t1")) not in w.a.st.tasks
    assert (fid, TaskID("t1")) not in w.m.master.state.tasks
    assert w.a.st.updates.unacknowledged() == 0


def test_unacked_updates_survive_reregistration_in_order() -> None:
    w, fid = boot()
    agent_id = w.a.agent.agent_id
    assert agent_id is not None
    launch(w, fid, "t1")
    w.agent_out(w.a.start_executor("cmd", framework_id=fid))
    w.agent_out(w.a.update("cmd", "t1", TaskState.RUNNING, framework_id=fid)[0])
    w.agent_out(w.a.update("cmd", "t1", TaskState.FAILED, framework_id=fid)[0])
    # The link drops and comes back: the agent re-registers and re-sends the head.
    w.agent_out(w.a.disconnected())
    w.agent_out(w.a.connected())
    assert w.a.agent.registered
    assert [s.state for s in w.framework_updates] == [TaskState.RUNNING, TaskState.RUNNING]
    head = w.framework_updates[-1]
    assert head.uuid is not None
    w.master_out(w.m.ack(SCHED, fid, agent_id, "t1", head.uuid))
    assert w.framework_updates[-1].state is TaskState.FAILED
    # A ping from the master is answered.
    w.agent_out(w.a.master(Ping(), epoch=w.m.master.epoch))


def test_kill_through_the_master_reaches_the_executor() -> None:
    w, fid = boot()
    launch(w, fid, "t1")
    w.agent_out(w.a.start_executor("cmd", framework_id=fid))
    w.master_out(w.m.handle(SCHED, Kill(framework_id=fid, task_id=TaskID("t1"))))
    kills = [x for x in w.to_executors if x.message.NAME == "KILL_TASK"]
    assert len(kills) == 1 and kills[0].peer == "cmd"


def test_kill_before_the_executor_registers_ends_the_task_killed() -> None:
    w, fid = boot()
    launch(w, fid, "t1")
    w.master_out(w.m.handle(SCHED, Kill(framework_id=fid, task_id=TaskID("t1"))))
    status = only(w.framework_updates)
    assert (status.state, status.reason) == (TaskState.KILLED, Reason.TASK_KILLED_DURING_LAUNCH)


def test_teardown_shuts_the_framework_down_on_the_agent() -> None:
    w, fid = boot()
    launch(w, fid, "t1")
    w.agent_out(w.a.start_executor("cmd", framework_id=fid))
    w.master_out(w.m.handle(SCHED, Teardown(framework_id=fid)))
    assert w.a.st.frameworks[fid].terminating
    w.agent_out(w.a.exited(fid, "agora-command", 0))
    assert fid not in w.a.st.frameworks
    assert w.a.st.tasks == {}
    assert not [x for x in w.to_executors if isinstance(x.message, StatusUpdateAck)]
