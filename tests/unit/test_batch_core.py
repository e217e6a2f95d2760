"""BatchCore: what a batch user relies on — launches, retries, limits, cancels, dependencies,
losses, gangs, restarts — driven by hand-built offers and status updates, time as an argument."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agora.frameworks.batch.actions import (
    Action,
    Decline,
    Kill,
    Launch,
    Reconcile,
    RequestGang,
    Revive,
    Suppress,
)
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.placement import GANG_HOLD_SECONDS
from agora.frameworks.batch.records import JobRecord, JobState, TaskRecord, TaskState
from agora.frameworks.batch.spec import ArraySpec, Dependency, DepKind, JobSpec
from agora.sdk.ids import AgentID, FrameworkID, GangID, OfferID, TaskID
from agora.sdk.messages import Offer, Reason, StatusSource, TaskInfo, TaskStatus
from agora.sdk.messages import TaskState as S
from agora.sdk.resources import Resources

T0 = 1000.0
CFG = CoreConfig(
    retry_backoff=10.0, retry_backoff_max=100.0, max_losses=2, unreachable_timeout=60.0
)


def status(task_id: str, state: S, code: int | None = None, agent: str = "a1") -> TaskStatus:
    return TaskStatus(
        task_id=TaskID(task_id),
        state=state,
        source=StatusSource.EXECUTOR,
        agent_id=AgentID(agent),
        exit_code=code,
    )


def spec(**kw: Any) -> JobSpec:
    fields: dict[str, Any] = {"name": "job", "user": "alice", "command": "true", "mem": 64.0}
    fields.update(kw)
    return JobSpec(**fields)


def arr(n: int, cap: int = 0, **kw: Any) -> JobSpec:
    return spec(array=ArraySpec(((0, n - 1, 1),), cap), **kw)


def after(kind: DepKind, job_id: int) -> tuple[Dependency, ...]:
    return (Dependency(kind, job_id),)


class Harness:
    """One core, the records it was given (made as the store makes them), and a fake store:
    copies of those records, updated by :func:`restarted` from ``take_dirty``."""

    def __init__(self, config: CoreConfig = CFG) -> None:
        self.core = BatchCore(config)
        self.tasks: dict[tuple[int, int], TaskRecord] = {}
        self.jobs: dict[int, JobRecord] = {}
        self.stored_jobs: dict[int, JobRecord] = {}
        self.stored_tasks: dict[tuple[int, int], TaskRecord] = {}
        self._offers = 0

    def submit(self, job_id: int, job_spec: JobSpec, now: float = T0) -> list[Action]:
        job = JobRecord(job_id, job_spec, now)
        tasks = [TaskRecord(job_id, i, submit_time=now) for i in job_spec.task_indices()]
        self.jobs[job_id] = job
        self.tasks.update((t.key, t) for t in tasks)
        self.stored_jobs[job_id] = dataclasses.replace(job)
        self.stored_tasks.update((t.key, dataclasses.replace(t)) for t in tasks)
        return self.core.add_job(job, tasks, now)

    def offer(self, cpus: float = 4, mem: float = 4096, agent: str = "a1",
              gang: str | None = None) -> Offer:  # fmt: skip
        self._offers += 1
        return Offer(
            offer_id=OfferID(f"o{self._offers}"),
            framework_id=FrameworkID("fw"),
            agent_id=AgentID(agent),
            hostname=f"host-{agent}",
            role="*",
            resources=Resources.parse(f"cpus:{cpus};mem:{mem}"),
            gang_id=None if gang is None else GangID(gang),
        )

    def give(self, now: float = T0, **kw: Any) -> list[Action]:
        return self.core.offers([self.offer(**kw)], now)

    def task(self, job_id: int, index: int = 0) -> TaskRecord:
        return self.tasks[(job_id, index)]

    def update(self, job_id: int, index: int, state: S, now: float, code: int | None = None,
               task_id: str | None = None) -> list[Action]:  # fmt: skip
        task = self.task(job_id, index)
        return self.core.status(status(task_id or task.task_id, state, code, task.agent_id), now)

    def run(self, job_id: int, index: int, now: float) -> None:
        assert self.update(job_id, index, S.RUNNING, now) == []


def launched(actions: list[Action]) -> list[TaskInfo]:
    return [info for a in actions if isinstance(a, Launch) for info in a.tasks]


def kills(actions: list[Action]) -> set[str]:
    return {a.task_id for a in actions if isinstance(a, Kill)}


def gang_requests(actions: list[Action]) -> list[RequestGang]:
    return [a for a in actions if isinstance(a, RequestGang)]


def env(info: TaskInfo) -> dict[str, str]:
    assert info.command is not None
    return dict(info.command.environment)


# ---------------------------------------------------------------------- launching


def test_one_offer_launches_as_many_tasks_as_fit_with_their_environment() -> None:
    h = Harness()
    h.submit(7, arr(10, mem=64.0))
    actions = h.give(cpus=4, mem=200)  # memory allows three of the ten
    infos = launched(actions)
    assert len(infos) == 3 and len(actions) == 1
    assert isinstance(actions[0], Launch) and actions[0].offer_ids == (OfferID("o1"),)
    assert [env(i)["AGORA_ARRAY_INDEX"] for i in infos] == ["0", "1", "2"]
    assert {env(i)["AGORA_JOB_ID"] for i in infos} == {"7"}
    assert len({i.task_id for i in infos}) == 3 and {i.agent_id for i in infos} == {"a1"}
    assert [h.task(7, i).state for i in range(4)] == [TaskState.STARTING] * 3 + [TaskState.PENDING]
    assert h.task(7, 0).agent_id == "a1" and h.task(7, 0).task_id == infos[0].task_id


def test_script_job_command_writes_and_runs_the_script_with_its_args(tmp_path: Path) -> None:
    script = '#!/bin/sh\nprintf "[%s]" "$@" > "$AGORA_SANDBOX/out"\necho " ${AGORA_JOB_SCRIPT-gone}" >> "$AGORA_SANDBOX/out"\n'  # noqa: E501
    h = Harness()
    h.submit(3, arr(1, script=script, command="", script_args=("a b", "it's", "$HOME")))
    (info,) = launched(h.give())
    assert info.command is not None and info.command.shell and info.command.value
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env(info)}
    run_env["AGORA_SANDBOX"] = str(tmp_path)
    done = subprocess.run(
        ["/bin/sh", "-c", info.command.value], env=run_env, cwd="/", timeout=10, check=False
    )
    assert done.returncode == 0
    assert (tmp_path / "out").read_text() == "[a b][it's][$HOME] gone\n"


def test_array_cap_holds_across_offers() -> None:
    h = Harness()
    h.submit(1, arr(6, cap=2))
    assert len(launched(h.give(cpus=8))) == 2
    second = h.give(cpus=8)
    assert launched(second) == [] and isinstance(second[0], Decline)
    h.run(1, 0, T0 + 1)
    h.update(1, 0, S.FINISHED, T0 + 2, code=0)
    infos = launched(h.give(T0 + 3, cpus=8))
    assert [env(i)["AGORA_ARRAY_INDEX"] for i in infos] == ["2"]


# ---------------------------------------------------------------------- ending, retries, limits


def test_running_then_finished_completes_the_task_and_the_job() -> None:
    h = Harness()
    h.submit(1, spec())
    h.give()
    h.run(1, 0, T0 + 1)
    assert h.task(1, 0).state is TaskState.RUNNING and h.jobs[1].state is JobState.RUNNING
    assert h.jobs[1].start_time == T0 + 1
    h.update(1, 0, S.FINISHED, T0 + 5, code=0)
    task, job = h.task(1, 0), h.jobs[1]
    assert task.state is TaskState.COMPLETED and task.exit_code == 0 and task.end_time == T0 + 5
    assert job.state is JobState.COMPLETED and job.exit_code == 0 and job.end_time == T0 + 5
    jobs, _ = h.core.take_dirty()
    assert [j.state for j in jobs] == [JobState.COMPLETED]


def test_failed_task_is_retried_after_backoff_with_a_new_attempt_then_fails() -> None:
    h = Harness()
    h.submit(1, spec(retries=2))
    first = launched(h.give())[0].task_id
    h.run(1, 0, T0)
    h.update(1, 0, S.FAILED, T0 + 1, code=3)
    task = h.task(1, 0)
    assert task.state is TaskState.PENDING and task.failures == 1 and task.not_before == T0 + 11
    assert launched(h.core.tick(T0 + 10.9) + h.give(T0 + 10.9)) == []
    (retry,) = launched(h.give(T0 + 11))
    assert retry.task_id != first and env(retry)["AGORA_ATTEMPT"] == "2" and task.attempt == 2
    h.update(1, 0, S.FAILED, T0 + 12, code=4)
    assert task.not_before == T0 + 32  # backoff doubled
    assert launched(h.give(T0 + 31.9)) == []
    assert len(launched(h.give(T0 + 32))) == 1
    h.update(1, 0, S.FAILED, T0 + 33, code=5)
    assert h.task(1, 0).state is TaskState.FAILED and task.failures == 3
    assert h.jobs[1].state is JobState.FAILED and h.jobs[1].exit_code == 5
    assert launched(h.give(T0 + 500)) == []


def test_failed_job_exit_code_is_the_highest_of_its_tasks() -> None:
    h = Harness()
    h.submit(1, arr(3))
    h.give()
    h.update(1, 0, S.FAILED, T0 + 1, code=7)
    h.update(1, 1, S.FINISHED, T0 + 1, code=0)
    h.update(1, 2, S.FAILED, T0 + 2, code=3)
    assert h.jobs[1].state is JobState.FAILED and h.jobs[1].exit_code == 7


def test_time_limit_kills_then_times_out_without_retry() -> None:
    h = Harness()
    h.submit(1, spec(time_limit=30.0, retries=3))
    h.give()
    h.run(1, 0, T0)
    tid = h.task(1, 0).task_id
    assert kills(h.core.tick(T0 + 29.9)) == set()
    assert h.core.tick(T0 + 30).count(Kill(tid, "a1")) == 1
    assert kills(h.core.tick(T0 + 30 + CFG.kill_resend)) == {tid}  # resent until it ends
    h.update(1, 0, S.KILLED, T0 + 41)
    assert h.task(1, 0).state is TaskState.TIMEOUT and h.task(1, 0).failures == 0
    assert h.jobs[1].state is JobState.TIMEOUT
    assert launched(h.give(T0 + 500)) == []


@pytest.mark.parametrize("answer", [S.DROPPED, S.KILLED])
def test_an_attempt_that_never_starts_is_killed_and_requeued_without_a_retry(answer: S) -> None:
    """Its RUN_TASK was lost on the way (the master keeps answering STAGING): after
    ``launch_timeout`` the attempt is killed and requeued as a loss, not a failure. Found by the
    simulation, where such a task waited for ever."""
    h = Harness(dataclasses.replace(CFG, launch_timeout=60.0))
    h.submit(1, spec(retries=0))
    (info,) = launched(h.give())
    assert h.update(1, 0, S.STAGING, T0 + 30) == []  # reconciliation: still staging
    assert kills(h.core.tick(T0 + 59.9)) == set()
    assert kills(h.core.tick(T0 + 60)) == {info.task_id}
    assert kills(h.core.tick(T0 + 60 + CFG.kill_resend)) == {info.task_id}  # until answered
    h.update(1, 0, answer, T0 + 75)
    task = h.task(1, 0)
    assert task.state is TaskState.PENDING and task.losses == 1 and task.failures == 0
    assert len(launched(h.give(T0 + 76))) == 1 and task.attempt == 2
    h.run(1, 0, T0 + 80)
    assert kills(h.core.tick(T0 + 80 + 600)) == set()  # running: no launch timeout any more


def test_work_waiting_without_offers_revives_again() -> None:
    """A REVIVE lost on its way leaves the framework suppressed at the master: with work
    waiting and no offer for ``revive_interval``, the core says REVIVE again, once per
    interval; offers coming keep it quiet. Found by the simulation's soak."""
    h = Harness(dataclasses.replace(CFG, revive_interval=60.0))
    h.core.registered(T0)
    h.submit(1, spec(), T0)
    assert Revive() not in h.core.tick(T0 + 59)
    assert h.core.tick(T0 + 60).count(Revive()) == 1
    assert Revive() not in h.core.tick(T0 + 61)
    assert h.core.offers([h.offer(cpus=0.1, mem=1)], T0 + 100) != []  # nothing fits: declined
    assert Revive() not in h.core.tick(T0 + 150)
    assert h.core.tick(T0 + 160).count(Revive()) == 1


# ---------------------------------------------------------------------- cancelling


def test_cancel_whole_job_drops_pending_kills_running_then_cancelled() -> None:
    h = Harness()
    h.submit(1, arr(3))
    h.give(cpus=2)
    h.run(1, 0, T0)
    count, actions = h.core.cancel(1, None, T0 + 1)
    running = {h.task(1, 0).task_id, h.task(1, 1).task_id}
    assert count == 3 and kills(actions) == running
    assert h.task(1, 2).state is TaskState.CANCELLED
    assert launched(h.give(T0 + 2, cpus=8)) == []
    h.update(1, 0, S.KILLED, T0 + 3)
    assert h.jobs[1].state is JobState.RUNNING
    h.update(1, 1, S.KILLED, T0 + 3)
    assert [h.task(1, i).state for i in range(3)] == [TaskState.CANCELLED] * 3
    job = h.jobs[1]
    assert job.state is JobState.CANCELLED and h.core.ended[1] is JobState.CANCELLED


def test_cancel_one_index_leaves_the_others() -> None:
    h = Harness()
    h.submit(1, arr(3))
    h.give(cpus=1)
    assert h.core.cancel(1, 2, T0)[0] == 1
    assert h.task(1, 2).state is TaskState.CANCELLED
    count, actions = h.core.cancel(1, 0, T0)
    assert count == 1 and kills(actions) == {h.task(1, 0).task_id}
    with pytest.raises(KeyError):
        h.core.cancel(1, 9, T0)
    infos = launched(h.give(T0 + 1, cpus=8))
    assert [env(i)["AGORA_ARRAY_INDEX"] for i in infos] == ["1"]
    h.update(1, 0, S.KILLED, T0 + 2)
    assert h.task(1, 0).state is TaskState.CANCELLED and not h.jobs[1].state.terminal


# ---------------------------------------------------------------------- dependencies


def test_afterok_waits_and_runs_after_the_job_completes() -> None:
    h = Harness()
    h.submit(1, spec())
    h.submit(2, spec(dependencies=after(DepKind.AFTEROK, 1)))
    infos = launched(h.give(cpus=8))
    assert [env(i)["AGORA_JOB_ID"] for i in infos] == ["1"]
    assert h.update(1, 0, S.FINISHED, T0 + 1, code=0) == [Revive()]
    assert [env(i)["AGORA_JOB_ID"] for i in launched(h.give(T0 + 2))] == ["2"]


def test_afterok_on_a_failed_job_fails_the_chain_fast() -> None:
    h = Harness()
    h.submit(1, spec())
    h.submit(2, arr(2, dependencies=after(DepKind.AFTEROK, 1)))
    h.submit(3, spec(dependencies=after(DepKind.AFTEROK, 2)))
    h.give()
    h.update(1, 0, S.FAILED, T0 + 1, code=2)
    for job_id in (2, 3):
        job = h.jobs[job_id]
        assert job.state is JobState.FAILED and job.end_time == T0 + 1
        assert job.reason.startswith("DependencyNeverSatisfied")
    assert {h.task(2, 0).state, h.task(2, 1).state, h.task(3, 0).state} == {TaskState.CANCELLED}
    assert launched(h.give(T0 + 2)) == []


@pytest.mark.parametrize("first_ends", [S.FINISHED, S.FAILED])
def test_afternotok_runs_only_after_failure_and_afterany_after_either(first_ends: S) -> None:
    h = Harness()
    h.submit(1, spec())
    h.submit(2, spec(dependencies=after(DepKind.AFTERNOTOK, 1)))
    h.submit(3, spec(dependencies=after(DepKind.AFTERANY, 1)))
    h.give()
    h.update(1, 0, first_ends, T0 + 1, code=0 if first_ends is S.FINISHED else 1)
    started = {env(i)["AGORA_JOB_ID"] for i in launched(h.give(T0 + 2, cpus=8))}
    if first_ends is S.FINISHED:
        assert started == {"3"} and h.jobs[2].state is JobState.FAILED
        assert h.jobs[2].reason.startswith("DependencyNeverSatisfied")
    else:
        assert started == {"2", "3"}


# ---------------------------------------------------------------------- losses


@pytest.mark.parametrize("loss", [S.LOST, S.DROPPED, S.GONE])
def test_losses_requeue_without_using_a_retry_up_to_max_losses(loss: S) -> None:
    h = Harness()
    h.submit(1, spec(retries=0))
    h.give()
    for n in (1, 2):
        h.update(1, 0, loss, T0 + n)
        task = h.task(1, 0)
        assert task.state is TaskState.PENDING and task.losses == n and task.failures == 0
        assert len(launched(h.give(T0 + n))) == 1 and task.attempt == n + 1
    h.update(1, 0, loss, T0 + 3)
    assert h.task(1, 0).state is TaskState.FAILED and h.jobs[1].state is JobState.FAILED


def test_unreachable_keeps_the_slot_until_timeout_and_old_attempt_is_killed() -> None:
    h = Harness()
    h.submit(1, spec())
    h.give()
    h.run(1, 0, T0)
    old = h.task(1, 0).task_id
    h.update(1, 0, S.UNREACHABLE, T0 + 1)
    assert h.task(1, 0).state is TaskState.RUNNING
    assert launched(h.core.tick(T0 + 60.9) + h.give(T0 + 60.9)) == []
    h.core.tick(T0 + 61)
    assert h.task(1, 0).state is TaskState.PENDING and h.task(1, 0).losses == 1
    (info,) = launched(h.give(T0 + 62))
    assert info.task_id != old
    back = h.update(1, 0, S.RUNNING, T0 + 63, task_id=old)
    assert back == [Kill(old, "a1")] and h.task(1, 0).state is TaskState.STARTING


def test_duplicate_terminal_updates_change_nothing() -> None:
    h = Harness()
    h.submit(1, spec(retries=2))
    h.give()
    h.update(1, 0, S.FINISHED, T0 + 1, code=0)
    h.core.take_dirty()
    assert h.update(1, 0, S.FINISHED, T0 + 2, code=0) == []
    assert h.update(1, 0, S.FAILED, T0 + 3, code=9) == []
    assert h.core.take_dirty() == ([], [])
    assert h.task(1, 0).state is TaskState.COMPLETED and h.jobs[1].exit_code == 0


# ---------------------------------------------------------------------- gangs


def gang_bundle(h: Harness, gang_id: str, agents: int = 2, cpus: float = 4) -> list[Offer]:
    return [h.offer(cpus=cpus, agent=f"a{n}", gang=gang_id) for n in range(1, agents + 1)]


def test_gang_is_requested_and_launched_whole_in_one_launch() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=4, ntasks_per_node=2))
    actions = h.core.registered(T0)
    (request,) = gang_requests(actions)
    assert request.request.count == 4 and request.request.max_per_agent == 2
    bundle = gang_bundle(h, request.request.gang_id)
    (launch,) = [a for a in h.core.offers(bundle, T0) if isinstance(a, Launch)]
    assert launch.offer_ids == tuple(o.offer_id for o in bundle)
    assert sorted(i.agent_id for i in launch.tasks) == ["a1", "a1", "a2", "a2"]
    assert sorted(env(i)["AGORA_RANK"] for i in launch.tasks) == ["0", "1", "2", "3"]
    assert {env(i)["AGORA_NTASKS"] for i in launch.tasks} == {"4"}


def test_a_gang_request_without_any_answer_is_asked_again() -> None:
    """A REQUEST (or its bundle, or its GANG_EXPIRED) lost on the way left the job waiting for
    ever: well past the hold timeout the same gang is asked for again. Found by the
    simulation's soak."""
    h = Harness()
    h.submit(1, spec(ntasks=2))
    (first,) = gang_requests(h.core.registered(T0))
    late = T0 + GANG_HOLD_SECONDS + CFG.reconcile_interval
    assert gang_requests(h.core.tick(late - 1)) == []
    (again,) = gang_requests(h.core.tick(late))
    assert again.request == first.request  # the same gang: a master that has it keeps it
    assert gang_requests(h.core.tick(late + 1)) == []  # once per hold timeout
    bundle = gang_bundle(h, first.request.gang_id)
    assert [a for a in h.core.offers(bundle, late + 2) if isinstance(a, Launch)]
    assert gang_requests(h.core.tick(late * 3)) == []  # placed: nothing to ask


def test_gang_rank_failure_kills_the_rest_then_retries_whole_then_fails() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=3, retries=1))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    for i in range(3):
        h.run(1, i, T0)
    actions = h.update(1, 1, S.FAILED, T0 + 1, code=2)
    assert kills(actions) == {h.task(1, 0).task_id, h.task(1, 2).task_id}
    h.update(1, 0, S.KILLED, T0 + 2)
    h.update(1, 2, S.KILLED, T0 + 2)
    assert {h.task(1, i).state for i in range(3)} == {TaskState.PENDING}
    assert gang_requests(h.core.tick(T0 + 11.9)) == []
    (again,) = gang_requests(h.core.tick(T0 + 12))
    assert again.request.gang_id != req.request.gang_id
    infos = launched(h.core.offers(gang_bundle(h, again.request.gang_id), T0 + 13))
    assert {i.task_id for i in infos} == {h.task(1, i).task_id for i in range(3)}
    assert {h.task(1, i).attempt for i in range(3)} == {2}
    h.update(1, 2, S.FAILED, T0 + 14, code=4)
    h.update(1, 0, S.KILLED, T0 + 15)
    h.update(1, 1, S.KILLED, T0 + 15)
    assert {h.task(1, i).state for i in range(3)} == {TaskState.FAILED}
    assert h.jobs[1].state is JobState.FAILED and h.jobs[1].exit_code == 4
    assert gang_requests(h.core.tick(T0 + 500)) == []


def test_gang_lost_rank_is_requested_again() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=2))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    actions = h.update(1, 0, S.LOST, T0 + 1) + h.update(1, 1, S.KILLED, T0 + 2)
    assert {h.task(1, i).state for i in range(2)} == {TaskState.PENDING}
    actions += h.core.tick(T0 + 3) + h.core.tick(T0 + 100)
    assert len(gang_requests(actions)) == 1  # asked again, once


def test_gang_submitted_while_registered_is_requested() -> None:
    h = Harness()
    h.core.registered(T0)
    actions = h.submit(1, spec(ntasks=2), T0 + 1) + h.core.tick(T0 + 2)
    assert len(gang_requests(actions)) == 1


def test_gang_retry_is_requested_even_if_offers_come_first() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=2, retries=1))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    h.update(1, 0, S.FAILED, T0 + 1, code=1)
    h.update(1, 1, S.KILLED, T0 + 1)
    actions = h.give(T0 + 12) + h.core.tick(T0 + 12.5)
    assert len(gang_requests(actions)) == 1


def test_cancelling_one_rank_of_a_gang_does_not_leave_it_hanging() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=2))
    h.core.registered(T0)
    h.core.cancel(1, 0, T0)
    h.core.tick(T0 + 1)
    assert h.core.ended.get(1) is JobState.CANCELLED
    assert h.task(1, 1).state is TaskState.CANCELLED


def test_gang_cancelled_while_a_failed_rank_is_stopping_others_ends_cancelled() -> None:
    """Rank 1 fails (a retry is due), the user cancels while rank 0 is being stopped, and rank 0
    then finishes: the cancel wins; the gang is not requeued into a job nothing will run."""
    h = Harness()
    h.submit(1, spec(ntasks=2, retries=1))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    h.run(1, 0, T0)
    h.run(1, 1, T0)
    h.update(1, 1, S.FAILED, T0 + 1, code=2)
    _count, actions = h.core.cancel(1, None, T0 + 2)
    assert kills(actions) == {h.task(1, 0).task_id}
    h.update(1, 0, S.FINISHED, T0 + 3, code=0)
    assert h.core.ended.get(1) is JobState.CANCELLED
    assert h.jobs[1].state is JobState.CANCELLED
    assert gang_requests(h.core.tick(T0 + 100)) == []


def test_a_cancelled_job_stored_with_pending_tasks_ends_when_loaded() -> None:
    """A store written before the fix above holds a cancelled gang requeued PENDING: loading
    it ends the job, rather than keeping it for ever."""
    h = Harness()
    h.submit(1, spec(ntasks=2))
    h.submit(2, spec(dependencies=after(DepKind.AFTERANY, 1)))
    h.jobs[1].cancelled = True
    h.stored_jobs[1] = dataclasses.replace(h.jobs[1])
    core = restarted(h)
    assert core.ended.get(1) is JobState.CANCELLED
    assert {t.state for t in core.tasks[2]} == {TaskState.PENDING}
    assert 2 not in core.waiting  # its dependency has ended: job 2 may run


def preempt(h: Harness, job_id: int, index: int, reason: Reason, now: float) -> list[Action]:
    """The master killed the task to give another role its guarantee back."""
    task = h.task(job_id, index)
    preempted = msgspec.structs.replace(
        status(task.task_id, S.KILLED, None, task.agent_id), reason=reason
    )
    return h.core.status(preempted, now)


@pytest.mark.parametrize("reason", [Reason.TASK_PREEMPTED, Reason.RESOURCES_REVOKED])
def test_a_task_the_master_preempts_is_requeued_without_a_retry(reason: Reason) -> None:
    h = Harness()
    h.submit(1, spec(retries=0))  # no retry to spend: only a preemption may run it again
    h.give()
    h.run(1, 0, T0)
    preempt(h, 1, 0, reason, T0 + 1)
    task = h.task(1, 0)
    assert task.state is TaskState.PENDING and (task.failures, task.losses) == (0, 0)
    assert "PREEMPTED" in task.reason and reason.value in task.reason
    (again,) = launched(h.give(T0 + 2))
    assert env(again)["AGORA_ATTEMPT"] == "2"
    h.update(1, 0, S.FINISHED, T0 + 3, code=0)
    assert h.jobs[1].state is JobState.COMPLETED


def test_a_plain_kill_is_still_a_failure() -> None:
    h = Harness()
    h.submit(1, spec(retries=0))
    h.give()
    h.run(1, 0, T0)
    h.update(1, 0, S.KILLED, T0 + 1)
    assert h.jobs[1].state is JobState.FAILED


def test_a_preempted_gang_rank_requeues_the_whole_gang_without_a_retry() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=2, retries=0))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    h.run(1, 0, T0)
    h.run(1, 1, T0)
    actions = preempt(h, 1, 0, Reason.RESOURCES_REVOKED, T0 + 1)
    assert kills(actions) == {h.task(1, 1).task_id}  # the rest of the gang stops
    requeued = h.update(1, 1, S.KILLED, T0 + 2)
    ranks = [h.task(1, i) for i in range(2)]
    assert {r.state for r in ranks} == {TaskState.PENDING}
    assert {(r.failures, r.losses) for r in ranks} == {(0, 0)}
    assert all("PREEMPTED" in r.reason for r in ranks)
    assert gang_requests(requeued)  # asked for again at once


# ---------------------------------------------------------------------- restart


def restarted(h: Harness) -> BatchCore:
    """A new core loaded from what the fake store holds after a commit."""
    jobs, tasks = h.core.take_dirty()
    h.stored_jobs.update((j.job_id, dataclasses.replace(j)) for j in jobs)
    h.stored_tasks.update((t.key, dataclasses.replace(t)) for t in tasks)
    active = [j for j in h.stored_jobs.values() if not j.state.terminal]
    ids = {j.job_id for j in active}
    ended = {j.job_id: j.state for j in h.stored_jobs.values() if j.state.terminal}
    core = BatchCore(CFG)
    core.load(active, [t for t in h.stored_tasks.values() if t.job_id in ids], ended, 0.0)
    return core


def test_restart_reloads_active_tasks_reconciles_them_and_launches_nothing_twice() -> None:
    h = Harness()
    h.submit(1, spec())
    h.submit(2, arr(3))
    h.submit(3, spec(dependencies=after(DepKind.AFTEROK, 1)))
    h.give(cpus=3)  # job 1, job 2 indices 0 and 1
    h.update(1, 0, S.FINISHED, T0 + 1, code=0)
    h.run(2, 0, T0 + 1)
    core = restarted(h)
    expected = {(h.task(2, 0).task_id, "a1"), (h.task(2, 1).task_id, "a1")}
    (reconcile,) = [a for a in core.registered(T0 + 2) if isinstance(a, Reconcile)]
    assert sorted(reconcile.tasks) == sorted(expected)
    infos = launched(core.offers([h.offer(cpus=16)], T0 + 3))
    started = sorted((env(i)["AGORA_JOB_ID"], env(i).get("AGORA_ARRAY_INDEX")) for i in infos)
    assert started == [("2", "2"), ("3", None)]
    old = core.tasks[2][0]
    assert core.status(status(old.task_id, S.FINISHED, 0), T0 + 4) == []
    assert old.state is TaskState.COMPLETED


def test_gang_rank_failure_before_a_restart_still_fails_the_gang() -> None:
    h = Harness()
    h.submit(1, spec(ntasks=2))  # no retries
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id), T0)
    h.update(1, 0, S.FAILED, T0 + 1, code=3)
    core = restarted(h)
    rank1 = core.tasks[1][1]
    core.status(status(rank1.task_id, S.KILLED), T0 + 3)
    assert core.ended.get(1) is JobState.FAILED and rank1.state is TaskState.FAILED


# ---------------------------------------------------------------------- suppress and revive


def test_suppress_when_nothing_is_left_and_revive_when_a_job_arrives() -> None:
    h = Harness()
    h.submit(1, spec())
    assert Suppress() in h.give()
    assert h.submit(2, spec()) == [Revive()]
    assert Suppress() in h.give(T0 + 1)


def test_loss_requeue_after_suppress_revives() -> None:
    h = Harness()
    h.submit(1, spec())
    assert Suppress() in h.give()
    actions = h.update(1, 0, S.LOST, T0 + 1) + h.core.tick(T0 + 1.5)
    assert actions.count(Revive()) == 1


def test_revive_for_a_job_whose_dependency_already_completed() -> None:
    h = Harness()
    h.submit(1, spec())
    assert Suppress() in h.give()
    h.update(1, 0, S.FINISHED, T0 + 1, code=0)
    actions = h.submit(2, spec(dependencies=after(DepKind.AFTEROK, 1)), T0 + 2)
    assert Revive() in actions + h.core.tick(T0 + 3)


def test_a_restart_keeps_dependencies_on_jobs_still_running_waiting() -> None:
    """The store hands load() every job's state; only ended ones may decide a dependency."""
    h = Harness()
    h.submit(1, spec())
    h.submit(2, spec(dependencies=(Dependency(DepKind.AFTEROK, 1),)))
    h.submit(3, spec(dependencies=(Dependency(DepKind.AFTERNOTOK, 1),)))
    h.give(T0)
    h.run(1, 0, T0 + 1)
    jobs, tasks = h.core.take_dirty()
    h.stored_jobs.update((j.job_id, dataclasses.replace(j)) for j in jobs)
    h.stored_tasks.update((t.key, dataclasses.replace(t)) for t in tasks)
    core = BatchCore(CFG)
    states = {j: job.state for j, job in h.stored_jobs.items()}  # as store.load_job_states()
    core.load(list(h.stored_jobs.values()), list(h.stored_tasks.values()), states, T0 + 2)
    assert core.waiting == {2, 3} and not core.ended
    h.core = core
    h.update(1, 0, S.FINISHED, T0 + 3, code=0)
    assert core.ended == {1: JobState.COMPLETED, 3: JobState.FAILED}
    assert core.waiting == set()  # job 2 may run now
