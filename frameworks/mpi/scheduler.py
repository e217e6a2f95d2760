"""``agora mpirun``'s scheduler: one MPI job, attempt after attempt, until it succeeds or its
retries are spent.

An attempt REQUESTs a gang of ``ranks`` slots; its gang offer becomes one task per agent (a
*member*), each under a member executor (:mod:`agora.frameworks.mpi.executor`), all in one
ACCEPT. The scheduler relays between the rank-0 member, where ``mpirun`` runs, and the others:
a launcher's ``launch`` becomes an ``exec`` on the member named by its host, and what that
member sends back (``out``/``exit``) goes to rank 0. ``mpirun``'s tagged output is split into
lines by rank and printed.

The attempt succeeds only if ``mpirun`` exits 0. Any other end — ``mpirun`` failing, a member
lost, failed or killed, the watchdog past ``timeout`` — kills every member; once none is left
the job is retried after a backoff (1 s doubling, at most 30 s) while retries last.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgpack
from agora.frameworks.mpi.job import Member, MpiJob, hostfile, members_for, mpirun_argv, mpirun_env
from agora.frameworks.mpi.protocol import UNREACHABLE, ProtocolError, decode, encode
from agora.frameworks.mpi.tags import TagSplitter
from agora.sdk.ids import AgentID, ExecutorID, GangID, OfferID, TaskID
from agora.sdk.messages import (
    CommandInfo,
    ContainerInfo,
    ExecutorInfo,
    Filters,
    Launch,
    Offer,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.messages.enums import TaskState, is_terminal
from agora.sdk.resources import Resources
from agora.sdk.scheduler import Scheduler

__all__ = ["MpiScheduler"]

#: Seconds past ``timeout`` before the scheduler kills an attempt itself (mpirun's own
#: ``--timeout`` should have ended it by then).
WATCHDOG_GRACE = 10.0
#: Seconds after a failed attempt's kills before they are sent again (with an executor
#: shutdown), and before members that still have not ended are given up on.
STOP_RESEND = 10.0
STOP_GIVE_UP = 30.0
BACKOFF_CAP = 30.0
LAUNCHER = (sys.executable, "-m", "agora.frameworks.mpi.launcher")


@dataclass
class Attempt:
    number: int
    gang_id: str
    members: list[Member] = field(default_factory=list)
    tasks: dict[str, Member] = field(default_factory=dict)  # task id -> member
    ended: set[str] = field(default_factory=set)  # task ids ended
    started: float | None = None
    failed: str = ""  # why the attempt failed ("" while it has not)
    exit_code: int | None = None
    #: launch id -> the member running that launcher's command
    launches: dict[str, Member] = field(default_factory=dict)
    #: Members whose executor runs (it said RUNNING): framework messages reach it. Messages for
    #: the others wait here (mpirun may call the launcher before they are up).
    ready: set[int] = field(default_factory=set)
    waiting: dict[int, list[bytes]] = field(default_factory=dict)
    #: When the members were told to stop, and whether the kills were sent again.
    stopping_since: float | None = None
    escalated: bool = False


class MpiScheduler(Scheduler):
    def __init__(
        self,
        job: MpiJob,
        *,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
        log_file: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.out, self.err, self.log_file = out, err, log_file
        self.clock = clock
        self.attempt: Attempt | None = None
        self.done = asyncio.Event()
        self.exit_code = 1
        self.splitters = {1: TagSplitter(per_line_tags=True), 2: TagSplitter(per_line_tags=True)}
        self.next_try_at: float | None = None
        self.driver: Any = None

    # ------------------------------------------------------------------ reporting

    def say(self, text: str) -> None:
        """A line on stderr; a closed stderr (``| head``) must not stop the job's bookkeeping."""
        with contextlib.suppress(OSError, ValueError):
            print(f"agora mpirun: {text}", file=self.err, flush=True)

    # ------------------------------------------------------------------ attempts

    def registered(self, driver: Any, framework_id: Any, master_info: Any) -> None:
        self.driver = driver
        if self.attempt is None:
            self._new_attempt(1)

    def reregistered(self, driver: Any, master_info: Any) -> None:
        attempt = self.attempt
        if attempt is not None and not attempt.members:  # the master forgot our request
            driver.request([self.job.gang(attempt.gang_id)])

    def _new_attempt(self, number: int) -> None:
        gang_id = f"mpi-{os.getpid()}-{number}"
        self.attempt = Attempt(number, gang_id)
        self.splitters = {1: TagSplitter(per_line_tags=True), 2: TagSplitter(per_line_tags=True)}
        self.driver.request([self.job.gang(gang_id)])
        how = f", at most {self.job.per_node} per agent" if self.job.per_node else ""
        self.say(f"attempt {number}: waiting for a gang of {self.job.ranks} slots{how}")

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        attempt = self.attempt
        plain = [o.offer_id for o in offers if o.gang_id is None]
        if plain:
            driver.decline(plain, Filters(refuse_seconds=3600))
        bundle = [o for o in offers if o.gang_id is not None]
        if not bundle:
            return
        ids = [o.offer_id for o in bundle]
        if attempt is None or attempt.members or bundle[0].gang_id != attempt.gang_id:
            driver.decline(ids, Filters(refuse_seconds=0))
            return
        try:
            members = members_for(self.job, bundle)
        except ValueError as exc:
            self.say(f"attempt {attempt.number}: {exc}; asking again")
            driver.decline(ids, Filters(refuse_seconds=0))
            driver.request([self.job.gang(attempt.gang_id)])
            return
        infos = [self._task_info(attempt, m, members, bundle) for m in members]
        attempt.members = members
        attempt.started = self.clock()
        attempt.tasks = {str(t.task_id): m for t, m in zip(infos, members, strict=True)}
        driver.accept(
            [OfferID(i) for i in ids], [Launch(task_infos=tuple(infos))], Filters(refuse_seconds=5)
        )
        where = ", ".join(f"{m.name} ({m.slots})" for m in members)
        self.say(f"attempt {attempt.number}: starting {self.job.ranks} ranks on {where}")

    def _task_info(
        self, attempt: Attempt, member: Member, members: list[Member], bundle: list[Offer]
    ) -> TaskInfo:
        rank0 = member.index == 0
        data: dict[str, Any] = {"member": member.name, "rank0": rank0}
        if rank0:
            data["hostfile"] = hostfile(members)
            data["argv"] = mpirun_argv(self.job, "{hostfile}")
            job = self.job
            interface = _configured_interface(member, bundle)
            if interface:
                job = dataclasses.replace(job, interface=interface)
            data["env"] = mpirun_env(job, LAUNCHER, "", as_root=False)  # the executor knows
        executor_id = ExecutorID(f"mpi-{attempt.number}-{member.index}")
        executor = ExecutorInfo(
            executor_id=executor_id,
            framework_id=bundle[0].framework_id,
            command=CommandInfo(
                argv=(sys.executable, "-m", "agora.frameworks.mpi.executor"), shell=False
            ),
            resources=Resources(),
            name=f"MPI member {member.name}",
            container=ContainerInfo(hostname=member.name),
        )
        return TaskInfo(
            task_id=TaskID(f"mpi-{attempt.number}-{member.name}"),
            name=f"{'mpirun' if rank0 else 'ranks'} on {member.name}",
            agent_id=member.agent_id,
            resources=member.resources,
            executor=executor,
            data=msgpack.packb(data, use_bin_type=True),
        )

    # ------------------------------------------------------------------ updates

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        attempt = self.attempt
        task_id = str(status.task_id)
        if attempt is None or task_id not in attempt.tasks:
            return
        member = attempt.tasks[task_id]
        if status.state is TaskState.RUNNING and member.index not in attempt.ready:
            attempt.ready.add(member.index)
            for data in attempt.waiting.pop(member.index, []):
                self._to(member, data)
        if not _over(status.state) or task_id in attempt.ended:
            return
        attempt.ended.add(task_id)
        if member.index == 0 and not attempt.failed:
            if status.state is TaskState.FINISHED:
                attempt.exit_code = 0
                self._flush_output()
                self._stop_members(attempt)
                self.say(f"attempt {attempt.number}: mpirun exited 0")
                self._finish(0)  # the teardown that follows stops the other members
                return
            else:
                attempt.exit_code = status.exit_code
                why = status.message or status.state.value
                self._fail(attempt, f"{why} ({status.state.value})")
        elif not attempt.failed and attempt.exit_code is None:
            why = status.message or (status.reason.value if status.reason else "")
            self._fail(attempt, f"member {member.name} ended {status.state.value}: {why}")
        self._maybe_finish(attempt)

    def executor_lost(
        self, driver: Any, agent_id: AgentID, executor_id: ExecutorID, code: Any
    ) -> None:
        attempt = self.attempt
        if attempt is None or attempt.failed:
            return
        for task_id, member in attempt.tasks.items():
            ours = str(executor_id) == f"mpi-{attempt.number}-{member.index}"
            if ours and member.agent_id == agent_id and task_id not in attempt.ended:
                self._fail(attempt, f"the executor on {member.name} exited ({code})")
                return

    def _fail(self, attempt: Attempt, why: str) -> None:
        attempt.failed = why
        self._flush_output()
        self.say(f"attempt {attempt.number} failed: {why}")
        self._stop_members(attempt)

    def _stop_members(self, attempt: Attempt) -> None:
        if attempt.stopping_since is None:
            attempt.stopping_since = self.clock()
        for task_id, member in attempt.tasks.items():
            if task_id not in attempt.ended:
                self.driver.kill(TaskID(task_id), member.agent_id)

    def _press_stop(self, attempt: Attempt, now: float) -> None:
        """Members that do not end after their kill: kill again and shut their executors down;
        past STOP_GIVE_UP, count them as ended so the job can go on (the master and agent
        still end them; an unreachable agent's are ended when it comes back)."""
        assert attempt.stopping_since is not None
        waited = now - attempt.stopping_since
        left = [(t, m) for t, m in attempt.tasks.items() if t not in attempt.ended]
        if not left:
            return
        if waited >= STOP_RESEND and not attempt.escalated:
            attempt.escalated = True
            for task_id, member in left:
                self.driver.kill(TaskID(task_id), member.agent_id)
                executor = f"mpi-{attempt.number}-{member.index}"
                self.driver.shutdown_executor(member.agent_id, executor)
        if waited >= STOP_GIVE_UP:
            names = ", ".join(m.name for _, m in left)
            self.say(f"attempt {attempt.number}: gave up waiting for {names} to stop")
            attempt.ended.update(t for t, _ in left)
            self._maybe_finish(attempt)

    def _maybe_finish(self, attempt: Attempt) -> None:
        if len(attempt.ended) < len(attempt.tasks):
            return
        if self.done.is_set():
            return
        code = attempt.exit_code if attempt.exit_code not in (None, 0) else 1
        if attempt.number > self.job.retries:
            self.say(f"the job FAILED after {attempt.number} attempt(s): {attempt.failed}")
            self._finish(int(code or 1))
            return
        delay = min(BACKOFF_CAP, 2.0 ** (attempt.number - 1))
        self.say(
            f"retrying in {delay:g} s (attempt {attempt.number + 1} of {self.job.retries + 1})"
        )
        self.next_try_at = self.clock() + delay

    def _finish(self, code: int) -> None:
        self.exit_code = code
        self.done.set()

    def tick(self) -> None:
        """Start a due retry; kill an attempt running past its timeout; press members that do
        not stop."""
        now = self.clock()
        attempt = self.attempt
        if attempt is not None and attempt.stopping_since is not None and not self.done.is_set():
            self._press_stop(attempt, now)
        if self.next_try_at is not None and now >= self.next_try_at and attempt is not None:
            self.next_try_at = None
            self._new_attempt(attempt.number + 1)
            return
        if (
            attempt is not None
            and attempt.started is not None
            and self.job.timeout is not None
            and not attempt.failed
            and attempt.exit_code is None
            and now - attempt.started > self.job.timeout + WATCHDOG_GRACE
        ):
            self._fail(attempt, f"still running {self.job.timeout:g} s past its timeout")

    def gang_expired(self, driver: Any, gang_id: GangID, message: str) -> None:
        attempt = self.attempt
        if attempt is not None and attempt.gang_id == gang_id and not attempt.members:
            self.say(f"attempt {attempt.number}: no gang yet ({message}); still asking")
            driver.request([self.job.gang(attempt.gang_id)])

    # ------------------------------------------------------------------ relaying

    def framework_message(
        self, driver: Any, agent_id: AgentID, executor_id: ExecutorID, data: bytes
    ) -> None:
        attempt = self.attempt
        if attempt is None or not attempt.members:
            return
        try:
            message = decode(data)
        except ProtocolError:
            return
        sender = next((m for m in attempt.members if m.agent_id == agent_id), None)
        if sender is None or str(executor_id) != f"mpi-{attempt.number}-{sender.index}":
            return  # an older attempt's member, or a stranger
        kind = message["t"]
        rank0 = attempt.members[0]
        if sender is rank0 and kind == "log":
            self._output(message["fd"], message["data"])
        elif sender is rank0 and kind == "launch":
            target = next((m for m in attempt.members if m.name == message["host"]), None)
            if target is None:
                text = f"agora launcher: no member {message['host']!r} in this job\n"
                self._to(rank0, encode("out", id=message["id"], fd=2, data=text.encode()))
                self._to(rank0, encode("exit", id=message["id"], code=UNREACHABLE))
                return
            attempt.launches[message["id"]] = target
            self._to(target, encode("exec", id=message["id"], cmd=message["cmd"]))
        elif sender is rank0 and kind == "cancel":
            target = attempt.launches.pop(message["id"], None)
            if target is not None:
                self._to(target, encode("kill", id=message["id"]))
        elif kind in ("out", "exit") and attempt.launches.get(message["id"]) is sender:
            self._to(rank0, data)

    def _to(self, member: Member, data: bytes) -> None:
        attempt = self.attempt
        assert attempt is not None
        if member.index not in attempt.ready:
            attempt.waiting.setdefault(member.index, []).append(data)
            return
        self.driver.message(member.agent_id, f"mpi-{attempt.number}-{member.index}", data)

    def _output(self, fd: int, data: bytes) -> None:
        if self.log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self.log_file.write(data.decode(errors="replace"))
                self.log_file.flush()
        for rank, stream, line in self.splitters[fd].feed(data):
            self._print_line(fd, rank, stream, line)

    def _flush_output(self) -> None:
        for fd, splitter in self.splitters.items():
            for rank, stream, line in splitter.flush():
                self._print_line(fd, rank, stream, line)

    def _print_line(self, fd: int, rank: int | None, stream: str, line: str) -> None:
        target = self.err if (stream == "stderr" or (rank is None and fd == 2)) else self.out
        prefix = f"{rank}: " if rank is not None else ""
        with contextlib.suppress(OSError, ValueError):
            print(f"{prefix}{line}", file=target, flush=True)


#: A member in one of these is gone for this attempt. LOST is not terminal (a partitioned agent
#: may come back), but this framework is not partition-aware: the master kills such a task
#: when its agent returns, so the attempt is over either way.
_GONE = frozenset({TaskState.LOST, TaskState.GONE, TaskState.DROPPED, TaskState.UNREACHABLE})


def _over(state: TaskState) -> bool:
    return is_terminal(state) or state in _GONE


#: An agent attribute naming the interface (or CIDR) Open MPI should use on that agent's
#: network (``agora-agent --attributes mpi_interface:eth0``); it wins over ``--interface``.
INTERFACE_ATTRIBUTE = "mpi_interface"


def _configured_interface(member: Member, bundle: list[Offer]) -> str:
    for offer in bundle:
        if offer.agent_id == member.agent_id:
            value = offer.attributes.get(INTERFACE_ATTRIBUTE, "").strip()
            if value and not any(c.isspace() or c == "," for c in value):
                return value
    return ""
