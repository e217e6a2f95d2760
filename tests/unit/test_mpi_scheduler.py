"""``agora mpirun``'s scheduler driven by hand: its gang request, the accept that starts the
members, the relay between rank 0 and the others, output, and how attempts end and retry."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
import pytest
from agora.frameworks.mpi.job import MpiJob
from agora.frameworks.mpi.protocol import UNREACHABLE, decode, encode
from agora.frameworks.mpi.scheduler import WATCHDOG_GRACE, MpiScheduler
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, GangID, OfferID
from agora.sdk.messages import Filters, GangRequest, Launch, Offer, TaskInfo, TaskStatus
from agora.sdk.messages.enums import StatusSource, TaskState
from agora.sdk.resources import Resources


@dataclass
class FakeDriver:
    requests: list[GangRequest] = field(default_factory=list)
    accepts: list[tuple[list[str], list[Any], Filters | None]] = field(default_factory=list)
    declines: list[list[str]] = field(default_factory=list)
    kills: list[tuple[str, str | None]] = field(default_factory=list)
    messages: list[tuple[str, str, bytes]] = field(default_factory=list)
    shutdowns: list[tuple[str, str]] = field(default_factory=list)

    def request(self, gangs: list[GangRequest]) -> None:
        self.requests.extend(gangs)

    def accept(self, offer_ids: list[Any], operations: list[Any], filters: Any = None) -> None:
        self.accepts.append(([str(o) for o in offer_ids], list(operations), filters))

    def decline(self, offer_ids: list[Any], filters: Any = None) -> None:
        self.declines.append([str(o) for o in offer_ids])

    def kill(self, task_id: Any, agent_id: Any = None) -> None:
        self.kills.append((str(task_id), None if agent_id is None else str(agent_id)))

    def message(self, agent_id: Any, executor_id: Any, data: bytes) -> None:
        self.messages.append((str(agent_id), str(executor_id), data))

    def shutdown_executor(self, agent_id: Any, executor_id: Any) -> None:
        self.shutdowns.append((str(agent_id), str(executor_id)))

    def calls(self) -> int:
        return sum(
            map(len, (self.requests, self.accepts, self.declines, self.kills, self.messages))
        )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A scheduler with a fake driver and clock, its output in StringIOs."""

    def __init__(self, agents: int = 2, **kw: Any) -> None:
        kw.setdefault("ranks", 2 * agents)
        kw.setdefault("command", ("python", "-m", "mpi4py", "app.py"))
        self.job = MpiJob(**kw)
        self.out, self.err, self.log = io.StringIO(), io.StringIO(), io.StringIO()
        self.clock = Clock()
        self.sched = MpiScheduler(
            self.job, out=self.out, err=self.err, log_file=self.log, clock=self.clock
        )
        self.driver = FakeDriver()
        self.agents = agents
        self.sched.registered(self.driver, FrameworkID("fw"), None)

    @property
    def gang_id(self) -> str:
        return str(self.driver.requests[-1].gang_id)

    def bundle(self, gang_id: str | None = None) -> list[Offer]:
        gid = gang_id or self.gang_id
        return [
            Offer(
                offer_id=OfferID(f"{gid}-o{i}"),
                framework_id=FrameworkID("fw"),
                agent_id=AgentID(f"a{i}"),
                hostname=f"node{i}",
                role="*",
                resources=Resources.parse("cpus:2;mem:1024"),
                gang_id=GangID(gid),
            )
            for i in range(self.agents)
        ]

    def retried(self) -> tuple[TaskInfo, TaskInfo]:
        """Attempt 1 fails (mpirun exits 3, the other member is killed) and attempt 2 starts;
        attempt 1's rank-0 and other task infos."""
        rank0, other = self.start()
        self.status(rank0, TaskState.FAILED, exit_code=3)
        self.status(other, TaskState.KILLED)
        self.clock.now += 2
        self.sched.tick()
        self.start()
        return rank0, other

    def start(self, *, running: bool = True) -> list[TaskInfo]:
        """Offer the requested gang; the task infos of the one accept it makes (each reported
        RUNNING unless ``running`` is False)."""
        before = len(self.driver.accepts)
        self.sched.offers(self.driver, self.bundle())
        assert len(self.driver.accepts) == before + 1
        (launch,) = self.driver.accepts[-1][1]
        assert isinstance(launch, Launch)
        tasks = list(launch.task_infos)
        for task in tasks if running else ():
            self.status(task, TaskState.RUNNING)
        return tasks

    def status(self, task: TaskInfo, state: TaskState, exit_code: int | None = None) -> None:
        self.sched.status_update(
            self.driver,
            TaskStatus(
                task_id=task.task_id, state=state, source=StatusSource.EXECUTOR, exit_code=exit_code
            ),
        )

    def send(self, task: TaskInfo, data: bytes) -> None:
        assert task.executor is not None
        self.sched.framework_message(self.driver, task.agent_id, task.executor.executor_id, data)


def killed(rig: Rig) -> set[str]:
    return {task for task, _ in rig.driver.kills}


# ------------------------------------------------------------------ getting a gang


def test_registered_requests_one_gang() -> None:
    rig = Rig(agents=2, per_node=2)
    (gang,) = rig.driver.requests
    assert (gang.count, gang.max_per_agent) == (4, 2)
    assert gang.shape == rig.job.shape
    assert not rig.driver.accepts and not rig.driver.declines


def test_plain_offers_are_declined() -> None:
    rig = Rig()
    plain = [msgspec.structs.replace(o, gang_id=None) for o in rig.bundle()]
    rig.sched.offers(rig.driver, plain)
    assert rig.driver.declines == [[str(o.offer_id) for o in plain]]
    assert not rig.driver.accepts


def test_a_gang_offer_for_another_gang_is_declined() -> None:
    rig = Rig()
    stale = rig.bundle(gang_id="someone-else")
    rig.sched.offers(rig.driver, stale)
    assert rig.driver.declines == [[str(o.offer_id) for o in stale]]
    assert not rig.driver.accepts


def test_a_gang_offer_too_small_is_declined_and_asked_again() -> None:
    rig = Rig(agents=2, ranks=5)
    bundle = rig.bundle()
    rig.sched.offers(rig.driver, bundle)
    assert rig.driver.declines == [[str(o.offer_id) for o in bundle]]
    assert not rig.driver.accepts
    assert len(rig.driver.requests) == 2
    assert rig.driver.requests[1].gang_id == rig.driver.requests[0].gang_id


def test_the_gang_offer_is_accepted_once_with_every_offer() -> None:
    rig = Rig(agents=3, ranks=6)
    bundle = rig.bundle()
    tasks = rig.start()
    assert rig.driver.accepts[0][0] == [str(o.offer_id) for o in bundle]
    assert len(tasks) == 3
    assert [str(t.agent_id) for t in tasks] == ["a0", "a1", "a2"]
    assert all(t.resources == Resources.parse("cpus:2;mem:512") for t in tasks)
    assert len({t.task_id for t in tasks}) == 3
    # the same gang offered again (a duplicate) is not launched twice
    rig.sched.offers(rig.driver, bundle)
    assert len(rig.driver.accepts) == 1
    assert rig.driver.declines == [[str(o.offer_id) for o in bundle]]


def test_each_member_has_its_own_executor_named_after_the_attempt() -> None:
    rig = Rig(agents=2)
    tasks = rig.start()
    for index, task in enumerate(tasks):
        assert task.executor is not None
        assert task.executor.executor_id == ExecutorID(f"mpi-1-{index}")
        assert task.executor.container is not None
        assert task.executor.container.hostname == f"node{index}"


def test_task_data_tells_rank0_how_to_run_mpirun() -> None:
    rig = Rig(agents=2, timeout=7.0)
    rank0, other = rig.start()
    data0 = msgpack.unpackb(rank0.data, raw=False)
    assert data0["member"] == "node0" and data0["rank0"] is True
    assert data0["hostfile"] == "node0 slots=2\nnode1 slots=2\n"
    argv = data0["argv"]
    assert argv[0] == "mpirun" and argv[-4:] == ["python", "-m", "mpi4py", "app.py"]
    assert argv[argv.index("-n") + 1] == "4" and argv[argv.index("--timeout") + 1] == "7"
    assert data0["env"]["OMPI_MCA_plm_rsh_no_tree_spawn"] == "1"
    assert "agora.frameworks.mpi.launcher" in data0["env"]["OMPI_MCA_plm_rsh_agent"]
    assert msgpack.unpackb(other.data, raw=False) == {"member": "node1", "rank0": False}


# ------------------------------------------------------------------ relaying


def test_a_launch_becomes_an_exec_on_the_named_member() -> None:
    rig = Rig(agents=3, ranks=6)
    rank0, _, third = rig.start()
    rig.send(rank0, encode("launch", id="L1", host="node2", cmd="orted --foo"))
    assert len(rig.driver.messages) == 1
    agent, executor, data = rig.driver.messages[0]
    assert third.executor is not None
    assert (agent, executor) == (str(third.agent_id), str(third.executor.executor_id))
    assert decode(data) == {"t": "exec", "id": "L1", "cmd": "orted --foo"}


def test_messages_wait_until_their_member_runs() -> None:
    rig = Rig(agents=2)
    rank0, other = rig.start(running=False)
    rig.status(rank0, TaskState.RUNNING)
    rig.send(rank0, encode("launch", id="L1", host="node1", cmd="orted"))
    assert rig.driver.messages == []
    rig.status(other, TaskState.STARTING)
    assert rig.driver.messages == []
    rig.status(other, TaskState.RUNNING)
    assert [(a, decode(d)["t"]) for a, _, d in rig.driver.messages] == [("a1", "exec")]
    rig.status(other, TaskState.RUNNING)  # a repeated update sends nothing again
    assert len(rig.driver.messages) == 1


def test_a_launch_for_an_unknown_host_fails_back_to_rank0() -> None:
    rig = Rig(agents=2)
    rank0, _ = rig.start()
    rig.send(rank0, encode("launch", id="L1", host="nowhere", cmd="orted"))
    assert rank0.executor is not None
    to = {(a, e) for a, e, _ in rig.driver.messages}
    assert to == {(str(rank0.agent_id), str(rank0.executor.executor_id))}
    replies = [decode(d) for _, _, d in rig.driver.messages]
    assert [r["t"] for r in replies] == ["out", "exit"]
    assert replies[0]["id"] == "L1" and replies[0]["fd"] == 2 and b"nowhere" in replies[0]["data"]
    assert replies[1] == {"t": "exit", "id": "L1", "code": UNREACHABLE}


def test_a_cancel_becomes_a_kill_on_the_member() -> None:
    rig = Rig(agents=2)
    rank0, other = rig.start()
    rig.send(rank0, encode("launch", id="L1", host="node1", cmd="orted"))
    rig.send(rank0, encode("cancel", id="L1"))
    agent, _, data = rig.driver.messages[-1]
    assert agent == str(other.agent_id) and decode(data) == {"t": "kill", "id": "L1"}


def test_member_output_goes_to_rank0_only_for_its_own_launches() -> None:
    rig = Rig(agents=3, ranks=6)
    rank0, second, third = rig.start()
    rig.send(rank0, encode("launch", id="L1", host="node1", cmd="orted"))
    rig.driver.messages.clear()
    out = encode("out", id="L1", fd=1, data=b"hi")
    ended = encode("exit", id="L1", code=0)
    rig.send(second, out)
    rig.send(second, ended)
    assert rank0.executor is not None
    to_rank0 = (str(rank0.agent_id), str(rank0.executor.executor_id))
    assert rig.driver.messages == [(*to_rank0, out), (*to_rank0, ended)]
    rig.driver.messages.clear()
    rig.send(third, encode("out", id="L1", fd=1, data=b"forged"))  # not third's launch
    rig.send(third, encode("exit", id="L1", code=0))
    rig.send(second, encode("exit", id="L-unknown", code=0))
    assert rig.driver.messages == []


def test_messages_from_strangers_are_ignored() -> None:
    rig = Rig(agents=2)
    rank0, _ = rig.start()
    launch = encode("launch", id="L1", host="node1", cmd="orted")
    rig.sched.framework_message(rig.driver, rank0.agent_id, ExecutorID("impostor"), launch)
    rig.sched.framework_message(rig.driver, AgentID("a9"), ExecutorID("mpi-1-0"), launch)
    rig.sched.framework_message(rig.driver, rank0.agent_id, ExecutorID("mpi-1-1"), launch)
    assert rig.driver.messages == []


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\x00garbage",
        msgpack.packb({"t": "launch", "id": "L1"}),  # a field missing
        msgpack.packb({"t": "launch", "id": 1, "host": "node1", "cmd": "x"}),
        msgpack.packb({"t": "shutdown"}),
        msgpack.packb(["launch", "L1", "node1", "orted"]),
    ],
)
def test_garbage_is_ignored(data: bytes) -> None:
    rig = Rig(agents=2)
    rank0, _ = rig.start()
    calls = rig.driver.calls()
    rig.send(rank0, data)
    assert rig.driver.calls() == calls
    assert not rig.sched.done.is_set()


def test_rank0_log_is_printed_by_rank() -> None:
    rig = Rig(agents=2)
    rank0, other = rig.start()
    rig.send(rank0, encode("log", fd=1, data=b"[1,0]<stdout>:hello\n[1,1]<stdout>:wor"))
    rig.send(rank0, encode("log", fd=1, data=b"ld\n[1,1]<stderr>:oops\n"))
    rig.send(rank0, encode("log", fd=2, data=b"mpirun noticed something\n"))
    rig.send(other, encode("log", fd=1, data=b"[1,1]<stdout>:not rank 0's\n"))
    assert rig.out.getvalue() == "0: hello\n1: world\n"
    err = rig.err.getvalue().splitlines()
    assert "1: oops" in err and "mpirun noticed something" in err
    assert "not rank 0" not in rig.out.getvalue() + rig.err.getvalue()
    assert "[1,0]<stdout>:hello" in rig.log.getvalue()


def test_a_partial_last_line_is_printed_when_mpirun_ends() -> None:
    rig = Rig(agents=2)
    rank0, _ = rig.start()
    rig.send(rank0, encode("log", fd=1, data=b"[1,1]<stdout>:no newline"))
    assert rig.out.getvalue() == ""
    rig.status(rank0, TaskState.FINISHED, exit_code=0)
    assert rig.out.getvalue() == "1: no newline\n"


# ------------------------------------------------------------------ ends and retries


def test_rank0_finished_is_success_and_stops_the_others() -> None:
    rig = Rig(agents=3, ranks=6, retries=2)
    rank0, second, third = rig.start()
    rig.status(rank0, TaskState.RUNNING)
    assert not rig.sched.done.is_set()
    rig.status(rank0, TaskState.FINISHED, exit_code=0)
    assert rig.sched.done.is_set() and rig.sched.exit_code == 0
    assert killed(rig) == {str(second.task_id), str(third.task_id)}
    kills = dict(rig.driver.kills)
    assert kills[str(second.task_id)] == str(second.agent_id)
    rig.status(second, TaskState.KILLED)
    rig.status(third, TaskState.FAILED, exit_code=137)
    rig.clock.now += 100
    rig.sched.tick()
    assert rig.sched.exit_code == 0 and len(rig.driver.requests) == 1


def test_rank0_failing_kills_the_others_and_ends_the_job_without_retries() -> None:
    rig = Rig(agents=2)
    rank0, other = rig.start()
    rig.status(rank0, TaskState.FAILED, exit_code=3)
    assert killed(rig) == {str(other.task_id)}
    assert not rig.sched.done.is_set()  # a member is still running
    rig.status(other, TaskState.KILLED)
    assert rig.sched.done.is_set() and rig.sched.exit_code == 3
    assert len(rig.driver.requests) == 1


def test_a_failed_attempt_is_retried_whole_after_the_backoff() -> None:
    rig = Rig(agents=2, retries=1)
    rank0, other = rig.start()
    first_gang = rig.gang_id
    rig.status(rank0, TaskState.FAILED, exit_code=3)
    rig.status(other, TaskState.KILLED)
    assert not rig.sched.done.is_set()
    rig.sched.tick()
    assert len(rig.driver.requests) == 1  # not before the backoff
    rig.clock.now += 1.01
    rig.sched.tick()
    assert len(rig.driver.requests) == 2
    assert rig.gang_id != first_gang
    # the old gang's offer is refused; the new one starts attempt 2's executors
    old = rig.bundle(first_gang)
    rig.sched.offers(rig.driver, old)
    assert rig.driver.declines[-1] == [str(o.offer_id) for o in old]
    rank0_b, other_b = rig.start()
    assert rank0_b.executor is not None and other_b.executor is not None
    assert rank0_b.executor.executor_id == ExecutorID("mpi-2-0")
    assert {rank0_b.task_id, other_b.task_id}.isdisjoint({rank0.task_id, other.task_id})
    # the first attempt's executors are strangers now
    calls = rig.driver.calls()
    rig.send(rank0, encode("launch", id="L1", host="node1", cmd="orted"))
    assert rig.driver.calls() == calls
    # the last attempt fails too: the job ends with its exit code
    rig.status(rank0_b, TaskState.FAILED, exit_code=3)
    rig.status(other_b, TaskState.KILLED)
    assert rig.sched.done.is_set() and rig.sched.exit_code == 3


def test_updates_of_an_older_attempt_change_nothing() -> None:
    rig = Rig(agents=2, retries=1)
    rank0, _ = rig.retried()
    rig.status(rank0, TaskState.FINISHED, exit_code=0)
    assert not rig.sched.done.is_set()


def test_a_lost_member_fails_the_attempt_and_it_is_retried() -> None:
    rig = Rig(agents=2, retries=1)
    rank0, other = rig.start()
    rig.status(other, TaskState.LOST)
    assert str(rank0.task_id) in killed(rig)
    rig.status(rank0, TaskState.KILLED)
    rig.clock.now += 1.01
    rig.sched.tick()
    assert len(rig.driver.requests) == 2
    assert not rig.sched.done.is_set()


def test_a_lost_rank0_ends_the_job_without_retries() -> None:
    rig = Rig(agents=2)
    rank0, other = rig.start()
    rig.status(rank0, TaskState.LOST)
    assert str(other.task_id) in killed(rig)
    rig.status(other, TaskState.KILLED)
    assert rig.sched.done.is_set() and rig.sched.exit_code != 0


def test_a_lost_executor_fails_the_attempt() -> None:
    rig = Rig(agents=2, retries=1)
    rank0, other = rig.start()
    assert other.executor is not None
    rig.sched.executor_lost(rig.driver, other.agent_id, other.executor.executor_id, 137)
    assert killed(rig) == {str(rank0.task_id), str(other.task_id)}
    rig.status(rank0, TaskState.KILLED)
    rig.status(other, TaskState.FAILED)
    rig.clock.now += 1.01
    rig.sched.tick()
    assert len(rig.driver.requests) == 2


def test_an_older_attempts_executor_exiting_does_not_fail_the_retry() -> None:
    rig = Rig(agents=2, retries=1)
    _, other = rig.retried()
    kills = len(rig.driver.kills)
    assert other.executor is not None
    rig.sched.executor_lost(rig.driver, other.agent_id, other.executor.executor_id, 0)
    assert len(rig.driver.kills) == kills


def test_a_failed_member_fails_the_attempt_and_it_is_retried() -> None:
    rig = Rig(agents=2, retries=1)
    rank0, other = rig.start()
    rig.status(other, TaskState.FAILED, exit_code=9)
    assert killed(rig) == {str(rank0.task_id)}
    rig.status(rank0, TaskState.KILLED)
    rig.clock.now += 1.01
    rig.sched.tick()
    assert len(rig.driver.requests) == 2
    assert not rig.sched.done.is_set()


def test_the_watchdog_kills_an_attempt_past_its_timeout() -> None:
    rig = Rig(agents=2, timeout=5.0)
    tasks = rig.start()
    rig.status(tasks[0], TaskState.RUNNING)
    rig.clock.now += 5.0 + WATCHDOG_GRACE - 0.5
    rig.sched.tick()
    assert rig.driver.kills == []
    rig.clock.now += 1.0
    rig.sched.tick()
    assert killed(rig) == {str(t.task_id) for t in tasks}
    for task in tasks:
        rig.status(task, TaskState.KILLED)
    assert rig.sched.done.is_set() and rig.sched.exit_code != 0


def test_no_watchdog_without_a_timeout() -> None:
    rig = Rig(agents=2)
    rig.start()
    rig.clock.now += 365 * 86400
    rig.sched.tick()
    assert rig.driver.kills == []


def test_the_rank0_agents_configured_interface_wins_over_the_flag() -> None:
    rig = Rig(agents=2)
    bundle = [
        msgspec.structs.replace(o, attributes={"mpi_interface": "eth1"} if i == 0 else {})
        for i, o in enumerate(rig.bundle())
    ]
    rig.sched.offers(rig.driver, bundle)
    (launch,) = rig.driver.accepts[-1][1]
    data = msgpack.unpackb(launch.task_infos[0].data, raw=False)
    assert data["env"]["OMPI_MCA_oob_tcp_if_include"] == "eth1"
    assert data["env"]["OMPI_MCA_btl_tcp_if_include"] == "eth1"


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_does_not_stop_the_job_from_ending() -> None:
    """`agora mpirun … | head`: once head exits, writes fail; the job must still end and kill."""
    rig = Rig(agents=2)
    rig.sched.out = rig.sched.err = _ClosedPipe()
    rank0, other = rig.start()
    rig.sched.framework_message(
        rig.driver, rank0.agent_id, rank0.executor.executor_id,  # type: ignore[union-attr]
        encode("log", fd=1, data=b"[1,0]<stdout>:partial line with no newline"),
    )  # fmt: skip
    rig.status(rank0, TaskState.FINISHED, exit_code=0)
    assert rig.sched.done.is_set() and rig.sched.exit_code == 0
    assert [str(k[0]) for k in rig.driver.kills] == [str(other.task_id)]


def test_a_member_that_does_not_stop_is_pressed_then_given_up_on() -> None:
    """A kill that gets no answer must not hold the job for ever."""
    rig = Rig(agents=2, retries=1)
    rank0, other = rig.start()
    rig.status(other, TaskState.LOST)  # the attempt fails; rank 0 is told to stop...
    assert [k[0] for k in rig.driver.kills] == [str(rank0.task_id)]
    rig.clock.now += 10.5  # ...and never answers
    rig.sched.tick()
    assert len(rig.driver.kills) == 2
    assert rig.driver.shutdowns == [(str(rank0.agent_id), "mpi-1-0")]
    rig.clock.now += 20
    rig.sched.tick()
    assert "gave up waiting for" in rig.err.getvalue()
    rig.clock.now += 5  # past the retry's backoff
    rig.sched.tick()
    assert len(rig.driver.requests) == 2  # attempt 2 asked for its gang
