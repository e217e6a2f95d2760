"""Priority preemption in the batch core, its pace and aim: no second round before the freed
resources are offered, no victim that frees nothing useful, never a task twice, gangs whole, and
a count of preemptions per task. Driven by hand, time as an argument."""

from __future__ import annotations

from pathlib import Path

from agora.frameworks.batch.actions import Action, Kill
from agora.frameworks.batch.config import load_settings
from agora.frameworks.batch.core import CoreConfig
from agora.frameworks.batch.records import TaskState
from agora.sdk.messages import Reason
from agora.sdk.messages import TaskState as S
from test_batch_core import (
    T0,
    Harness,
    arr,
    gang_bundle,
    gang_requests,
    kills,
    launched,
    preempt,
    restarted,
    spec,
)

AFTER, MIN_RUN = 5.0, 20.0


def harness(mode: str = "requeue") -> Harness:
    return Harness(
        CoreConfig(
            retry_backoff=10.0,
            max_losses=2,
            preempt={"*": mode},
            preempt_after=AFTER,
            preempt_min_runtime=MIN_RUN,
        )
    )


def ticks(h: Harness, *at: float) -> list[Action]:
    out: list[Action] = []
    for now in at:
        out += h.core.tick(now)
    return out


def fill(h: Harness, job_id: int, n: int, agent: str = "a1", cpus: float = 1.0) -> None:
    """Job ``job_id`` (priority 0, no retry) runs ``n`` tasks of ``cpus`` on ``agent``, the
    i-th started at T0 + i."""
    h.submit(job_id, arr(n, cpus=cpus, mem=64.0, retries=0))
    assert len(launched(h.give(cpus=n * cpus, agent=agent))) == n
    for i in range(n):
        h.run(job_id, i, T0 + i)


def test_after_its_victims_end_a_job_waits_for_the_offer_before_preempting_again() -> None:
    h = harness()
    fill(h, 1, 4)
    h.submit(2, arr(2, cpus=1.0, mem=64.0, priority=5), T0 + 30)
    first = kills(ticks(h, T0 + 30, T0 + 35))
    assert len(first) == 2
    for i in (2, 3):
        h.update(1, i, S.KILLED, T0 + 36)
    # The tick right after they end (the freed cpus not offered yet) stops nothing more.
    assert kills(ticks(h, T0 + 36.1, T0 + 40)) == set()
    # The offer never came (someone else took the cpus): only after a full wait again.
    second = kills(ticks(h, T0 + 41.1))
    assert len(second) == 2 and not second & first
    assert second == {h.task(1, 0).task_id, h.task(1, 1).task_id}


def test_a_requeued_victim_counts_its_preemptions_and_keeps_them_across_a_restart() -> None:
    h = harness()
    fill(h, 1, 2)
    h.submit(2, spec(cpus=1.0, mem=64.0, priority=5), T0 + 30)
    (victim,) = kills(ticks(h, T0 + 30, T0 + 35))
    assert victim == h.task(1, 1).task_id  # the newer one
    h.update(1, 1, S.KILLED, T0 + 36)
    task = h.task(1, 1)
    assert (task.state, task.preemptions, task.failures, task.losses) == (
        TaskState.PENDING,
        1,
        0,
        0,
    )
    assert task.to_json()["preemptions"] == 1
    core = restarted(h)
    assert core.tasks[1][1].preemptions == 1


def test_a_task_the_master_preempts_counts_a_preemption_without_a_retry() -> None:
    h = harness("off")  # the queue's mode does not matter for the master's kills
    h.submit(1, spec(retries=0))
    h.give()
    h.run(1, 0, T0)
    preempt(h, 1, 0, Reason.TASK_PREEMPTED, T0 + 1)
    task = h.task(1, 0)
    assert (task.state, task.preemptions, task.failures, task.losses) == (
        TaskState.PENDING,
        1,
        0,
        0,
    )
    assert task.reason.startswith("requeued: PREEMPTED by the cluster (TASK_PREEMPTED")


def test_two_waiting_jobs_never_pick_the_same_victim() -> None:
    h = harness()
    fill(h, 1, 4)
    h.submit(2, spec(cpus=1.0, mem=64.0, priority=5), T0 + 30)
    h.submit(3, spec(cpus=1.0, mem=64.0, priority=3), T0 + 30)
    actions = ticks(h, T0 + 30, T0 + 35)
    killed = [a.task_id for a in actions if isinstance(a, Kill)]
    assert len(killed) == len(set(killed)) == 2  # one each, none twice
    # Job 2 (the higher) took the newest; job 3 the next.
    assert set(killed) == {h.task(1, 3).task_id, h.task(1, 2).task_id}
    for i, by in ((3, "job 2 (priority 5)"), (2, "job 3 (priority 3)")):
        h.update(1, i, S.KILLED, T0 + 36)
        assert h.task(1, i).reason == f"requeued: PREEMPTED by {by}"


def test_a_victim_whose_agent_would_still_not_fit_the_claimant_is_spared() -> None:
    h = harness()
    fill(h, 1, 2, agent="a1")  # two 1-cpu tasks on a1, started T0 and T0 + 1
    h.submit(3, arr(1, cpus=1.0, mem=64.0, retries=0), T0)
    assert len(launched(h.give(cpus=1, agent="a2"))) == 1
    h.run(3, 0, T0 + 2)  # the newest of all, alone on a2
    h.submit(2, spec(cpus=2.0, mem=64.0, priority=5), T0 + 30)  # one task of 2 cpus
    victims = kills(ticks(h, T0 + 30, T0 + 35))
    # Newest first would take a2's task, but 1 cpu there fits no 2-cpu task: a1's two instead.
    assert victims == {h.task(1, 0).task_id, h.task(1, 1).task_id}


def test_a_task_no_agent_could_hold_preempts_nothing() -> None:
    h = harness()
    fill(h, 1, 4)
    h.submit(2, spec(cpus=8.0, mem=64.0, priority=5), T0 + 30)  # more than the agent has
    assert kills(ticks(h, T0 + 30, T0 + 100)) == set()


def test_a_plain_job_stops_a_lower_gang_whole_even_when_one_rank_would_do() -> None:
    h = harness()
    h.submit(1, spec(ntasks=3, cpus=1.0, mem=64.0, retries=0))
    (req,) = gang_requests(h.core.registered(T0))
    h.core.offers(gang_bundle(h, req.request.gang_id, agents=3, cpus=1), T0)
    for i in range(3):
        h.run(1, i, T0)
    h.submit(2, spec(cpus=1.0, mem=64.0, priority=5), T0 + 30)
    victims = kills(ticks(h, T0 + 30, T0 + 35))
    assert victims == {h.task(1, i).task_id for i in range(3)}
    for i in range(3):
        h.update(1, i, S.KILLED, T0 + 36)
    ranks = [h.task(1, i) for i in range(3)]
    assert {(r.state, r.preemptions, r.failures, r.losses) for r in ranks} == {
        (TaskState.PENDING, 1, 0, 0)
    }


def test_preemption_modes_come_from_a_toml_table_or_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "batch.toml"
    toml.write_text('queues = ["default", "hi"]\n[preempt]\ndefault = "requeue"\nhi = "off"\n')
    env = {"AGORA_HOME": str(tmp_path)}
    settings = load_settings(["--config", str(toml)], env=env)
    assert settings.preempt == {"*": "requeue", "hi": "off"}
    # The environment outranks the file, a flag the environment.
    env["AGORA_PREEMPT"] = "hi=cancel"
    assert load_settings(["--config", str(toml)], env=env).preempt == {"hi": "cancel"}
    argv = ["--config", str(toml), "--preempt", "default=off"]
    assert load_settings(argv, env=env).preempt == {"*": "off"}
