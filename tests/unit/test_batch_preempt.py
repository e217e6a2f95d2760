"""Priority preemption within a queue (Slurm's PreemptMode): a higher-priority job that waits
stops just enough lower-priority tasks of its queue; they are requeued without a retry, or
cancelled, and their record says who preempted them. Driven by hand, time as an argument."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from agora.frameworks.batch.actions import Action
from agora.frameworks.batch.core import CoreConfig
from agora.frameworks.batch.records import JobState, TaskState
from agora.sdk.messages import TaskState as S
from test_batch_core import T0, Harness, arr, gang_bundle, gang_requests, kills, launched, spec

AFTER, MIN_RUN = 5.0, 20.0


def cfg(mode: str = "requeue") -> CoreConfig:
    return CoreConfig(
        retry_backoff=10.0,
        max_losses=2,
        preempt={"*": mode},
        preempt_after=AFTER,
        preempt_min_runtime=MIN_RUN,
    )


def full(mode: str = "requeue") -> Harness:
    """Job 1 (priority 0, no retries) runs 4 one-cpu tasks on all 4 cpus, started a second
    apart; job 2 (priority 5) wants 2 cpus."""
    h = Harness(cfg(mode))
    h.submit(1, arr(4, cpus=1.0, mem=64.0, retries=0))
    assert len(launched(h.give(cpus=4))) == 4
    for i in range(4):
        h.run(1, i, T0 + i)
    h.submit(2, arr(2, cpus=1.0, mem=64.0, priority=5), T0 + 30)
    return h


def ticks(h: Harness, *at: float) -> list[Action]:
    out: list[Action] = []
    for now in at:
        out += h.core.tick(now)
    return out


def test_a_waiting_higher_priority_job_preempts_the_newest_lower_tasks_and_they_requeue() -> None:
    h = full()
    assert kills(ticks(h, T0 + 30, T0 + 34)) == set()  # not waited long enough yet
    victims = kills(ticks(h, T0 + 35))
    assert victims == {h.task(1, 3).task_id, h.task(1, 2).task_id}  # the newest two
    # No new victim while they stop (a kill not answered in 10 s is only sent again).
    assert kills(ticks(h, T0 + 40, T0 + 45)) <= victims
    h.update(1, 3, S.KILLED, T0 + 46)
    h.update(1, 2, S.KILLED, T0 + 46)
    for i in (2, 3):
        task = h.task(1, i)
        assert task.state is TaskState.PENDING and (task.failures, task.losses) == (0, 0)
        assert task.reason == "requeued: PREEMPTED by job 2 (priority 5)"
    # The freed cpus go to job 2 (higher priority) first.
    infos = launched(h.give(T0 + 47, cpus=2))
    assert sorted(i.task_id for i in infos) == sorted(h.task(2, i).task_id for i in range(2))


def test_cancel_mode_ends_the_victims_cancelled() -> None:
    h = full("cancel")
    victims = kills(ticks(h, T0 + 30, T0 + 35))
    assert len(victims) == 2
    for i in (2, 3):
        h.update(1, i, S.KILLED, T0 + 36)
        assert h.task(1, i).state is TaskState.CANCELLED
        assert h.task(1, i).reason == "PREEMPTED by job 2 (priority 5)"


def test_off_or_unconfigured_queues_preempt_nothing() -> None:
    for mode in ("off", None):
        h = Harness(dataclasses.replace(cfg(), preempt={} if mode is None else {"*": mode}))
        h.submit(1, arr(4, cpus=1.0, mem=64.0))
        h.give(cpus=4)
        for i in range(4):
            h.run(1, i, T0)
        h.submit(2, spec(cpus=1.0, mem=64.0, priority=5), T0 + 30)
        assert kills(ticks(h, T0 + 30, T0 + 100)) == set()


def test_young_tasks_and_equal_priorities_are_left_alone() -> None:
    h = Harness(cfg())
    h.submit(1, arr(4, cpus=1.0, mem=64.0))
    h.give(cpus=4)
    for i in range(4):
        h.run(1, i, T0 + 25)  # started 5 s before the waiting job: younger than 20 s
    h.submit(2, spec(cpus=1.0, mem=64.0, priority=5), T0 + 30)
    h.submit(3, spec(cpus=1.0, mem=64.0, priority=0), T0 + 30)
    assert kills(ticks(h, T0 + 30, T0 + 36)) == set()
    victims = kills(ticks(h, T0 + 45))  # now old enough: one for job 2, none for job 3
    assert len(victims) == 1


def test_a_gang_preempts_a_whole_lower_gang_and_requeues_it_whole() -> None:
    h = Harness(cfg())
    h.submit(1, spec(ntasks=2, cpus=2.0, mem=64.0, retries=0))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id, cpus=2), T0)
    h.run(1, 0, T0)
    h.run(1, 1, T0)
    h.submit(2, spec(ntasks=2, cpus=2.0, mem=64.0, priority=3), T0 + 30)
    victims = kills(ticks(h, T0 + 30, T0 + 35))
    assert victims == {h.task(1, 0).task_id, h.task(1, 1).task_id}  # both ranks
    h.update(1, 0, S.KILLED, T0 + 36)
    out = h.update(1, 1, S.KILLED, T0 + 36)
    ranks = [h.task(1, i) for i in range(2)]
    assert {r.state for r in ranks} == {TaskState.PENDING}
    assert {(r.failures, r.losses) for r in ranks} == {(0, 0)}
    assert all("PREEMPTED by job 2 (priority 3)" in r.reason for r in ranks)
    assert gang_requests(out)
    assert h.jobs[1].state is not JobState.FAILED


def test_a_gang_that_would_still_not_fit_preempts_nothing() -> None:
    h = Harness(cfg())
    h.submit(1, arr(2, cpus=1.0, mem=64.0))
    h.give(cpus=2)
    h.run(1, 0, T0)
    h.run(1, 1, T0)
    h.submit(2, spec(ntasks=4, cpus=1.0, mem=64.0, priority=3), T0 + 30)  # needs 4 cpus
    assert kills(ticks(h, T0 + 30, T0 + 40)) == set()


def test_who_preempted_survives_a_restart_of_the_service() -> None:
    from test_batch_core import restarted

    h = full()
    ticks(h, T0 + 30, T0 + 35)
    core = restarted(h)  # the store kept the victims' kill reason
    victim = core.tasks[1][3]
    assert isinstance(victim.kill_reason, str) and victim.kill_reason.startswith("preempt:")


def test_the_service_takes_preemption_modes_per_queue(tmp_path: Path) -> None:
    from agora.frameworks.batch.config import load_settings

    env = {"AGORA_HOME": str(tmp_path)}
    argv = ["--queues", "default,hi", "--preempt", "default=requeue,hi=cancel"]
    settings = load_settings([*argv, "--preempt-after", "3s"], env=env)
    assert settings.preempt == {"*": "requeue", "hi": "cancel"}
    assert (settings.preempt_after, settings.preempt_min_runtime) == (3.0, 30.0)
    with pytest.raises(SystemExit):
        load_settings(["--preempt", "hi=sometimes"], env=env)
