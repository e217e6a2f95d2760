"""Agent core checkpointing and recovery, driven through a real Journal.

A ``World`` runs an agent core the way the daemon must: after every stimulus it writes the core's
checkpoint into a Journal and commits, and only then performs the actions (on fake executor
processes and a fake master). A scripted scenario is cut at every stimulus -- before the commit
(the stimulus is lost) or after it (its actions are lost) -- and a fresh core recovers from the
journal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agora.agent.core import (
    COMMAND_EXECUTOR_ID,
    Action,
    Agent,
    AgentConfig,
    CheckpointError,
    Delete,
    ExecutorKey,
    ExecutorState,
    LaunchExecutor,
    Put,
    SignalExecutor,
    ToExecutor,
    ToMaster,
    is_final,
)
from agora.agent.core.checkpoint import ExecutorRecord
from agora.agent.core.executor_auth import SECRET_ENV
from agora.agent.server.journal import Journal
from agora.sdk.codec import unpack_record
from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    ExecutorInfo,
    ExecutorRegistered,
    ExecutorReregistered,
    ExitedExecutor,
    FrameworkInfo,
    KillTask,
    LaunchTask,
    LaunchTaskGroup,
    Message,
    Reason,
    RegisterAgent,
    RegisterExecutor,
    ReregisterAgent,
    ReregisterExecutor,
    RunTask,
    RunTaskGroup,
    ShutdownExecutor,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from support.agent_kit import AGENT_ID, FID, MASTER_INFO, config, executor_info, task_info, wire

EXEC1 = executor_info("exec-1")
EXECG = executor_info("exec-g")
FW_INFO = FrameworkInfo(name="fw", user="alice")
CMD = (FID, COMMAND_EXECUTOR_ID)
E1 = (FID, ExecutorID("exec-1"))
EG = (FID, ExecutorID("exec-g"))


class Crash(Exception):
    pass


@dataclass
class Proc:
    """A fake executor process (what sdk/executor/driver.py keeps)."""

    key: ExecutorKey
    peer: str
    ever_registered: bool = False
    tasks: dict[TaskID, TaskInfo] = field(default_factory=dict)
    unacked: dict[bytes, StatusUpdate] = field(default_factory=dict)
    sent: list[StatusUpdate] = field(default_factory=list)
    done: set[TaskID] = field(default_factory=set)
    #: The AGORA_EXECUTOR_SECRET the agent launched it with.
    secret: str = ""


@dataclass
class World:
    path: Path
    cfg: AgentConfig = field(default_factory=lambda: config(executor_shutdown_grace_period=3.0))
    crash_at: int | None = None
    before_commit: bool = False
    now: float = 1000.0

    def __post_init__(self) -> None:
        self.agent = Agent(self.cfg)
        self.journal = Journal(str(self.path))
        self.mirror = self.journal.load()
        self.count = 0
        self.procs: dict[ExecutorKey, Proc] = {}
        self.all_procs: list[Proc] = []
        self.dying: list[ExecutorKey] = []
        self.forwards: list[StatusUpdate] = []  # everything the master received
        self.to_ack: list[StatusUpdate] = []
        self.to_master: list[object] = []
        self.committed_records: dict[tuple[str, str], bytes] = {}
        self.committed_view: object = view(self.agent)
        self._serial = 0

    # --- the daemon's loop -----------------------------------------------------------------
    def stim(self, fn: Callable[[Agent], list[Action]]) -> list[Action]:
        self.count += 1
        actions = fn(self.agent)
        if self.count == self.crash_at and self.before_commit:
            raise Crash
        self.commit()
        if self.count == self.crash_at:
            raise Crash
        self.perform(actions)
        return actions

    def commit(self) -> None:
        for record in self.agent.checkpoint():
            if isinstance(record, Put):
                self.journal.put(record.kind, record.key, record.value)
                self.mirror[(record.kind, record.key)] = record.value
            else:
                assert isinstance(record, Delete)
                self.journal.delete(record.kind, record.key)
                self.mirror.pop((record.kind, record.key), None)
        self.journal.commit()
        # The checkpoints add up to exactly the durable state: no change was missed.
        assert self.mirror == self.agent.durable_records()
        self.committed_records = dict(self.mirror)
        self.committed_view = view(self.agent)

    def perform(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, LaunchExecutor):
                self._serial += 1
                key = (a.framework_id, a.executor_id)
                self.procs[key] = Proc(
                    key, f"{a.executor_id}#{self._serial}", secret=a.environment[SECRET_ENV]
                )
                self.all_procs.append(self.procs[key])
            elif isinstance(a, SignalExecutor):
                self._die((a.framework_id, a.executor_id))
            elif isinstance(a, ToExecutor):
                self._deliver(a.peer, wire(a.message))
            elif isinstance(a, ToMaster):
                message = wire(a.message)
                self.to_master.append(message)
                if isinstance(message, StatusUpdateMessage):
                    self.forwards.append(message.update)
                    self.to_ack.append(message.update)

    def _die(self, key: ExecutorKey) -> None:
        if self.procs.pop(key, None) is not None:
            self.dying.append(key)

    def _deliver(self, peer: str, message: object) -> None:
        proc = next((p for p in self.procs.values() if p.peer == peer), None)
        if proc is None:
            return
        if isinstance(message, ExecutorRegistered | ExecutorReregistered):
            proc.ever_registered = True
        elif isinstance(message, LaunchTask):
            proc.tasks[message.task.task_id] = message.task
        elif isinstance(message, LaunchTaskGroup):
            for task in message.task_group.tasks:
                proc.tasks[task.task_id] = task
        elif isinstance(message, StatusUpdateAck):
            proc.unacked.pop(message.uuid, None)
        elif isinstance(message, KillTask):
            if message.task_id in proc.tasks and message.task_id not in proc.done:
                self.update(proc.key, message.task_id, TaskState.KILLED, now=False)
        elif isinstance(message, ShutdownExecutor):
            self._die(proc.key)

    # --- stimuli -----------------------------------------------------------------------------
    def master(self, message: Message) -> list[Action]:
        msg = wire(message)
        return self.stim(lambda a: a.from_master(msg, 1, self.now))

    def run(self, tid: str, executor: ExecutorInfo | None = None) -> None:
        task = task_info(tid, executor=executor)
        self.master(RunTask(framework_info=FW_INFO, framework_id=FID, task=task, role="*"))

    def run_group(self, tids: list[str]) -> None:
        tasks = tuple(task_info(t, executor=None, command=True) for t in tids)
        group = TaskGroupInfo(tasks=tasks)
        self.master(
            RunTaskGroup(framework_info=FW_INFO, framework_id=FID, executor=EXECG, task_group=group)
        )

    def register(self, key: ExecutorKey) -> None:
        proc = self.procs[key]
        fid, eid = key
        if proc.ever_registered:
            msg: Message = ReregisterExecutor(
                framework_id=fid,
                executor_id=eid,
                tasks=tuple(t for t in proc.tasks.values() if t.task_id not in proc.done),
                updates=tuple(proc.unacked.values()),
                secret=proc.secret,
            )
        else:
            msg = RegisterExecutor(framework_id=fid, executor_id=eid, secret=proc.secret)
        m = wire(msg)
        self.stim(lambda a: a.from_executor(proc.peer, m, self.now))

    def update(self, key: ExecutorKey, tid: str, state: TaskState, *, now: bool = True) -> None:
        proc = self.procs[key]
        self._serial += 1
        status = TaskStatus(
            task_id=TaskID(tid),
            state=state,
            source=StatusSource.EXECUTOR,
            uuid=self._serial.to_bytes(16, "big"),
            timestamp=self.now,
        )
        update = StatusUpdate(framework_id=key[0], status=status)
        proc.unacked[status.uuid or b""] = update
        proc.sent.append(update)
        if is_final(state):
            proc.done.add(TaskID(tid))
        if now:
            m = StatusUpdateMessage(update=update)
            self.stim(lambda a: a.from_executor(proc.peer, m, self.now))

    def ack_all(self) -> None:
        while self.to_ack:
            u = self.to_ack.pop(0)
            self.master(
                StatusUpdateAck(
                    framework_id=u.framework_id,
                    task_id=u.status.task_id,
                    uuid=u.status.uuid or b"",
                    agent_id=AGENT_ID,
                )
            )

    def reap(self) -> None:
        while self.dying:
            fid, eid = self.dying.pop(0)
            self.stim(lambda a, f=fid, e=eid: a.executor_exited(f, e, 0, self.now))

    def tick(self, advance: float) -> None:
        self.now += advance
        self.stim(lambda a: a.tick(self.now))


def view(agent: Agent) -> object:
    """The durable state, structured (derived sets included), for equality checks."""
    st = agent.state
    executors = {}
    for key, ex in st.executors.items():
        state = ex.recovered_from if ex.state is ExecutorState.RECOVERING else ex.state
        executors[key] = (
            ex.info,
            ex.builtin,
            state,
            ex.shutdown_requested,
            tuple(ex.queued),
            tuple(ex.successor),
            sorted(ex.tasks),
            sorted(ex.live),
        )
    return (
        st.agent_id,
        {k: (t.info, t.executor_id, t.role, t.state, t.launched) for k, t in st.tasks.items()},
        executors,
        {
            f: (fw.info, fw.terminating, sorted(fw.executors), sorted(fw.tasks))
            for f, fw in st.frameworks.items()
        },
        {k: [s.uuid for s in st.updates.pending(*k)] for k in st.updates},
    )


def scenario(w: World) -> None:
    w.stim(lambda a: a.connected(w.now))
    w.master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    w.run("t1")
    w.run("t2", EXEC1)
    w.run_group(["g1", "g2"])
    w.register(CMD)
    w.register(E1)
    w.update(CMD, "t1", TaskState.RUNNING)
    w.update(E1, "t2", TaskState.STARTING)
    w.update(E1, "t2", TaskState.RUNNING)
    w.ack_all()
    w.update(CMD, "t1", TaskState.FINISHED)
    w.run("t3", EXEC1)
    w.master(KillTask(framework_id=FID, task_id=TaskID("t2")))  # exec-1 answers KILLED
    w.register(EG)
    w.update(EG, "g1", TaskState.RUNNING)
    w.run("t4")
    w.ack_all()
    w.master(ShutdownExecutor(framework_id=FID, executor_id=ExecutorID("exec-g")))
    w.reap()
    w.update(E1, "t3", TaskState.RUNNING)


def stimuli_in_scenario(tmp_path: Path) -> int:
    w = World(tmp_path / "count")
    scenario(w)
    w.journal.close()
    return w.count


def recover_world(w: World, *, cleanup: bool = False) -> list[Action]:
    """The daemon's restart: a fresh core from the journal, the live processes re-attached."""
    w.journal.close()
    w.journal = Journal(str(w.path))
    records = w.journal.load()
    assert records == w.committed_records
    w.mirror = dict(records)
    w.agent = Agent(w.cfg)
    w.crash_at = None
    w.now += 5.0
    return w.stim(lambda a: a.recover(records, w.now, alive=set(w.procs), cleanup=cleanup))


def finish(w: World) -> None:
    """Re-register, let every executor come back and finish its tasks, ack everything."""
    out = w.stim(lambda a: a.connected(w.now))
    sent = [x.message for x in out if isinstance(x, ToMaster)]
    if w.agent.agent_id is None:  # the crash came before the agent had an id
        assert any(isinstance(m, RegisterAgent) for m in sent)
        w.master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    else:
        assert any(isinstance(m, ReregisterAgent) for m in sent)
        w.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    for key in sorted(w.procs):
        w.register(key)
    for _round in range(30):
        for proc in sorted(w.procs.values(), key=lambda p: p.key):
            if proc.ever_registered:
                for tid in sorted(proc.tasks):
                    if tid not in proc.done:
                        w.update(proc.key, tid, TaskState.FINISHED)
            else:
                w.register(proc.key)
        w.ack_all()
        w.reap()
        w.tick(1.0)
        if (
            not w.agent.state.tasks
            and not w.to_ack
            and all(not p.unacked for p in w.procs.values())
        ):
            break


def check_delivery(w: World) -> None:
    """No update lost; duplicates only with the same uuid; order kept per task."""
    by_uuid: dict[bytes, tuple[str, TaskState]] = {}
    order: dict[str, list[bytes]] = {}
    for u in w.forwards:
        uuid = u.status.uuid or b""
        seen = (u.status.task_id, u.status.state)
        assert by_uuid.setdefault(uuid, seen) == seen, "one uuid, two different updates"
        if uuid not in order.setdefault(u.status.task_id, []):
            order[u.status.task_id].append(uuid)
    finals = {u.status.task_id for u in w.forwards if is_final(u.status.state)}
    sent = [u for p in w.all_procs for u in p.sent]
    for u in sent:
        uuid = u.status.uuid or b""
        tid = u.status.task_id
        # Lost only if the task had already ended (an agent-made final update went first).
        assert uuid in by_uuid or tid in finals, f"update {u.status.state} of {tid} lost"
    for tid, uuids in order.items():
        mine = [u.status.uuid for u in sent if u.status.task_id == tid]
        got = [x for x in uuids if x in mine]
        assert got == [x for x in mine if x in got], f"updates of {tid} out of order"
        # The task's stream ended with exactly one final update, at its end.
        states = [by_uuid[x][1] for x in uuids]
        assert [is_final(s) for s in states].count(True) <= 1 and (
            not any(is_final(s) for s in states) or is_final(states[-1])
        )
    assert w.agent.state.updates.unacknowledged() == 0
    assert w.agent.state.tasks == {}, "every task ended and was acknowledged"
    assert all(not p.unacked for p in w.procs.values()), "an executor update was never acked"


def test_recovery_at_every_cut_point_restores_state_and_loses_no_update(tmp_path: Path) -> None:
    total = stimuli_in_scenario(tmp_path)
    assert total > 20
    for cut in range(1, total + 1):
        for before_commit in (False, True):
            w = World(tmp_path / f"c{cut}{'b' if before_commit else 'a'}")
            w.crash_at, w.before_commit = cut, before_commit
            with pytest.raises(Crash):
                scenario(w)
            # A core recovered with every checkpointed executor alive holds exactly the
            # durable state of the original as of its last commit.
            probe = Agent(w.cfg)
            alive = {
                (r.framework_id, r.info.executor_id)
                for (kind, _key), v in w.committed_records.items()
                if kind == "executor"
                for r in [unpack_record(ExecutorRecord, v)]
            }
            probe.recover(dict(w.committed_records), w.now, alive=alive, cleanup=False)
            assert probe.checkpoint() == []
            assert probe.durable_records() == w.committed_records
            assert view(probe) == w.committed_view
            recover_world(w)
            finish(w)
            check_delivery(w)
            w.journal.close()


def crashed_world(tmp_path: Path) -> World:
    """t1 RUNNING on the command executor, t2 RUNNING on exec-1 (its update unacknowledged by
    the master), exec-g never registered with g1/g2 queued; then the agent dies."""
    w = World(tmp_path / "j")
    w.stim(lambda a: a.connected(w.now))
    w.master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    w.run("t1")
    w.run("t2", EXEC1)
    w.run_group(["g1", "g2"])
    w.register(CMD)
    w.register(E1)
    w.update(CMD, "t1", TaskState.RUNNING)
    w.ack_all()
    w.update(E1, "t2", TaskState.RUNNING)
    return w


def finals(w: World) -> dict[str, tuple[TaskState, Reason | None, str]]:
    return {
        u.status.task_id: (u.status.state, u.status.reason, u.status.message)
        for u in w.forwards
        if is_final(u.status.state)
    }


def signals(actions: list[Action]) -> list[SignalExecutor]:
    return [a for a in actions if isinstance(a, SignalExecutor)]


def test_cleanup_kills_live_executors_and_fails_their_tasks_as_agent_restarted(
    tmp_path: Path,
) -> None:
    w = crashed_world(tmp_path)
    out = recover_world(w, cleanup=True)
    assert sorted((s.executor_id, s.kill) for s in signals(out)) == [
        (COMMAND_EXECUTOR_ID, True),
        ("exec-1", True),
        ("exec-g", True),
    ]
    assert w.procs == {}
    finish(w)
    expected = (
        TaskState.FAILED,
        Reason.AGENT_RESTARTED,
        "killed by agent recovery (--recover=cleanup)",
    )
    assert finals(w) == {t: expected for t in ("t1", "t2", "g1", "g2")}
    check_delivery(w)


def test_executors_that_died_while_the_agent_was_down_end_their_tasks(tmp_path: Path) -> None:
    w = crashed_world(tmp_path)
    w.procs.pop(E1)  # exec-1 died while the agent was down
    w.procs.pop(EG)  # exec-g (never registered) too: it is started again
    out = recover_world(w)
    exited = [m for m in w.to_master if isinstance(m, ExitedExecutor)]
    assert [(m.executor_id, m.status) for m in exited] == [("exec-1", -1)]
    assert [a.executor_id for a in out if isinstance(a, LaunchExecutor)] == ["exec-g"]
    assert w.agent.state.executors[CMD].state is ExecutorState.RECOVERING
    finish(w)
    got = finals(w)
    assert got["t2"] == (
        TaskState.FAILED,
        Reason.EXECUTOR_TERMINATED,
        "executor exited while the agent was down",
    )
    assert got["t1"][0] is TaskState.FINISHED  # reattached, finished normally
    assert got["g1"][0] is got["g2"][0] is TaskState.FINISHED  # ran on the relaunched exec-g
    check_delivery(w)


def test_an_executor_that_does_not_reregister_in_time_is_killed(tmp_path: Path) -> None:
    w = crashed_world(tmp_path)
    recover_world(w)
    w.stim(lambda a: a.connected(w.now))
    w.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    w.register(CMD)  # only the command executor comes back
    w.register(EG)
    w.now += 9.9
    assert signals(w.stim(lambda a: a.tick(w.now))) == []
    w.now += 0.1
    out = w.stim(lambda a: a.tick(w.now))
    assert signals(out) == [SignalExecutor(FID, ExecutorID("exec-1"), kill=True)]
    # The shell re-attached to it, so it cannot know its exit status.
    w.dying.remove(E1)
    w.stim(lambda a: a.executor_exited(FID, ExecutorID("exec-1"), None, w.now))
    w.ack_all()
    state, reason, message = finals(w)["t2"]
    assert (state, reason) == (TaskState.FAILED, Reason.EXECUTOR_REREGISTRATION_TIMEOUT)
    assert "re-register within 10 seconds" in message
    exited = [m for m in w.to_master if isinstance(m, ExitedExecutor)]
    assert [(m.executor_id, m.status) for m in exited] == [("exec-1", -1)]


def test_reregistration_takes_resent_updates_once_and_hands_over_held_work(
    tmp_path: Path,
) -> None:
    w = crashed_world(tmp_path)
    recover_world(w)
    w.stim(lambda a: a.connected(w.now))
    w.master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO))
    # While exec-1 is away: a kill for its task and a new task for it are held.
    out = w.master(KillTask(framework_id=FID, task_id=TaskID("t2")))
    assert not [a for a in out if isinstance(a, ToExecutor)]
    w.run("t3", EXEC1)
    assert w.agent.state.executors[E1].queued
    # The executor's RUNNING for t2 was acknowledged before the crash; it resends nothing new.
    resent = w.procs[E1].sent[-1]
    w.procs[E1].unacked[resent.status.uuid or b""] = resent
    before = len(w.forwards)
    w.register(E1)
    assert len(w.forwards) == before  # the resent update was a duplicate
    proc = w.procs[E1]
    assert "t3" in proc.tasks  # handed over
    assert TaskID("t2") in proc.done  # the held kill arrived: it answered KILLED
    finish(w)
    assert finals(w)["t2"][0] is TaskState.KILLED
    check_delivery(w)


def test_a_launch_the_executor_never_received_is_lost(tmp_path: Path) -> None:
    w = crashed_world(tmp_path)
    w.crash_at, w.before_commit = w.count + 1, False
    with pytest.raises(Crash):  # the agent dies after checkpointing t3's launch, before sending
        w.run("t3", EXEC1)
    recover_world(w)
    finish(w)
    assert finals(w)["t3"] == (
        TaskState.LOST,
        Reason.AGENT_RESTARTED,
        "Task launched during agent restart: its executor never received it",
    )
    check_delivery(w)


def test_live_executors_the_checkpoint_does_not_know_are_killed(tmp_path: Path) -> None:
    agent = Agent(config())
    stray = (FrameworkID("fw-x"), ExecutorID("e"))
    out = agent.recover({}, 1.0, alive={stray}, cleanup=False)
    assert out == [SignalExecutor(stray[0], stray[1], kill=True)]
    assert agent.agent_id is None
    with pytest.raises(RuntimeError):
        w = crashed_world(tmp_path)
        w.agent.recover({}, 1.0, alive=set(), cleanup=False)


def test_a_checkpoint_record_that_cannot_be_read_is_reported(tmp_path: Path) -> None:
    w = crashed_world(tmp_path)
    records = dict(w.committed_records)
    key = next(k for k in records if k[0] == "task")
    records[key] = records[key][:-3]
    with pytest.raises(CheckpointError, match="checkpoint record task"):
        Agent(config()).recover(records, 1.0, alive=set(), cleanup=False)
    # Kinds the core does not write (the shell's own) are ignored.
    records = {**w.committed_records, ("shell.pid", "x"): b"123"}
    Agent(config()).recover(records, 1.0, alive=set(), cleanup=False)


def test_checkpoints_rewrite_only_what_changed() -> None:
    w_agent = Agent(config())
    w_agent.connected(1.0)
    w_agent.from_master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO), 1, 1.0)
    assert [(r.kind, type(r)) for r in w_agent.checkpoint()] == [("agent", Put)]
    for tid in ("a", "b", "c"):
        task = task_info(tid)
        w_agent.from_master(
            RunTask(framework_info=FW_INFO, framework_id=FID, task=task, role="*"), 1, 2.0
        )
    w_agent.checkpoint()
    w_agent.from_master(KillTask(framework_id=FID, task_id=TaskID("b")), 1, 3.0)
    changes = w_agent.checkpoint()
    kinds = sorted((r.kind, r.key.split("/")[-1]) for r in changes)
    # b waited in the executor's queue as launch record 2: that record goes.
    assert kinds == [("executor", "agora-command"), ("launch", "2"), ("stream", "b"), ("task", "b")]
    assert [type(r) for r in changes if r.kind == "launch"] == [Delete]
    assert w_agent.checkpoint() == []
    # A task joining a long queue writes its own launch record, not the whole queue again.
    w_agent.from_master(
        RunTask(framework_info=FW_INFO, framework_id=FID, task=task_info("d"), role="*"), 1, 4.0
    )
    launches = [r for r in w_agent.checkpoint() if r.kind == "launch"]
    assert [(type(r), r.key.split("/")[-1]) for r in launches] == [(Put, "4")]


def test_the_highest_master_epoch_survives_a_restart_and_older_masters_are_ignored() -> None:
    """A deposed master (lower epoch) cannot launch on an agent that restarted after hearing
    the new leader: the epoch is checkpointed with the agent record before anything is acted on."""
    first = Agent(config())
    first.connected(1.0)
    first.from_master(AgentRegistered(agent_id=AGENT_ID, master_info=MASTER_INFO), 3, 1.0)
    records = first.durable_records()
    for change in first.checkpoint():
        if isinstance(change, Put):
            records[(change.kind, change.key)] = change.value
    first.from_master(AgentReregistered(agent_id=AGENT_ID, master_info=MASTER_INFO), 7, 2.0)
    [change] = first.checkpoint()
    assert isinstance(change, Put) and change.kind == "agent", "a new epoch is made durable"
    records[(change.kind, change.key)] = change.value

    again = Agent(config())
    again.recover(records, 3.0, alive=set(), cleanup=False)
    assert again.state.master_epoch == 7
    stale = RunTask(framework_info=FW_INFO, framework_id=FID, task=task_info("x"), role="*")
    assert again.from_master(stale, 3, 4.0) == []
    assert not again.state.tasks, "a launch from epoch 3 is dropped after seeing epoch 7"
