"""Order of service in the batch core — priority, then fair share between users, then submission
— with backfill and roles; and FairShare itself (decay, projection, shares)."""

from __future__ import annotations

from typing import Any

import pytest
from agora.frameworks.batch.actions import Action, Decline, Launch
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.fairshare import FairShare
from agora.frameworks.batch.records import JobRecord, TaskRecord, TaskState
from agora.frameworks.batch.spec import ArraySpec, Constraint, JobSpec
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import Offer, TaskInfo
from agora.sdk.resources import Resources

T0 = 5000.0


def spec(**kw: Any) -> JobSpec:
    fields: dict[str, Any] = {"name": "job", "user": "alice", "command": "true", "mem": 64.0}
    fields.update(kw)
    return JobSpec(**fields)


def submit(core: BatchCore, job_id: int, job_spec: JobSpec) -> list[TaskRecord]:
    tasks = [TaskRecord(job_id, i, submit_time=T0) for i in job_spec.task_indices()]
    core.add_job(JobRecord(job_id, job_spec, T0), tasks, T0)
    return tasks


def offer(cpus: float = 1, role: str = "*", attributes: dict[str, str] | None = None) -> Offer:
    return Offer(
        offer_id=OfferID(f"o-{cpus}-{role}"),
        framework_id=FrameworkID("fw"),
        agent_id=AgentID("a1"),
        hostname="host-a1",
        role=role,
        resources=Resources.parse(f"cpus:{cpus};mem:100000"),
        attributes=attributes or {},
    )


def job_ids(actions: list[Action]) -> list[int]:
    infos: list[TaskInfo] = [i for a in actions if isinstance(a, Launch) for i in a.tasks]
    out = []
    for info in infos:
        assert info.command is not None
        out.append(int(info.command.environment["AGORA_JOB_ID"]))
    return out


# ---------------------------------------------------------------------- order of service


def test_higher_priority_goes_first_whatever_the_submission_order() -> None:
    core = BatchCore(CoreConfig())
    submit(core, 1, spec(priority=0))
    submit(core, 2, spec(priority=5, user="bob"))
    submit(core, 3, spec(priority=-1))
    assert job_ids(core.offers([offer(1)], T0)) == [2]
    assert job_ids(core.offers([offer(2)], T0)) == [1, 3]


def test_two_users_interleave_on_one_big_offer() -> None:
    core = BatchCore(CoreConfig())
    submit(core, 1, spec(user="alice", array=ArraySpec(((0, 19, 1),))))
    submit(core, 2, spec(user="bob", array=ArraySpec(((0, 19, 1),))))
    order = job_ids(core.offers([offer(16)], T0))
    assert len(order) == 16 and order[0] == 1
    for n in range(1, len(order) + 1):
        assert abs(order[:n].count(1) - order[:n].count(2)) <= 1, order


def test_user_with_high_decayed_usage_goes_after_one_with_none() -> None:
    fairshare = FairShare(3600.0)
    fairshare.restore({"alice": (50_000.0, T0 - 3600.0)})  # still 25 000 cpu-s now
    core = BatchCore(CoreConfig(), fairshare)
    submit(core, 1, spec(user="alice", array=ArraySpec(((0, 3, 1),))))
    submit(core, 2, spec(user="bob", array=ArraySpec(((0, 3, 1),))))
    assert job_ids(core.offers([offer(4)], T0)) == [2, 2, 2, 2]
    assert job_ids(core.offers([offer(1)], T0)) == [1]


def test_share_lets_a_user_run_more_at_once() -> None:
    core = BatchCore(CoreConfig(), FairShare(3600.0, shares={"bob": 3.0}))
    submit(core, 1, spec(user="alice", array=ArraySpec(((0, 9, 1),))))
    submit(core, 2, spec(user="bob", array=ArraySpec(((0, 9, 1),))))
    order = job_ids(core.offers([offer(8)], T0))
    assert order.count(2) == 6 and order.count(1) == 2


def test_backfill_a_job_that_does_not_fit_lets_a_smaller_later_job_run() -> None:
    core = BatchCore(CoreConfig())
    big = submit(core, 1, spec(cpus=8, priority=10))
    submit(core, 2, spec(cpus=2))
    assert job_ids(core.offers([offer(4)], T0)) == [2]
    assert big[0].state is TaskState.PENDING
    assert job_ids(core.offers([offer(8)], T0)) == [1]


@pytest.mark.parametrize(
    "constraint", [Constraint("rack", "a"), Constraint("rack", "b", negate=True)]
)
def test_backfill_past_a_job_whose_constraint_the_agent_fails(constraint: Constraint) -> None:
    core = BatchCore(CoreConfig())
    submit(core, 1, spec(constraints=(constraint,), priority=10))
    submit(core, 2, spec())
    assert job_ids(core.offers([offer(4, attributes={"rack": "b"})], T0)) == [2]
    assert job_ids(core.offers([offer(4, attributes={"rack": "a"})], T0)) == [1]


def test_offers_of_another_role_are_declined() -> None:
    config = CoreConfig(roles=("*", "gpu"), refuse_seconds=7.0)
    core = BatchCore(config)
    submit(core, 1, spec(queue="gpu"))
    actions = core.offers([offer(4, role="*")], T0)
    assert Decline((OfferID("o-4-*"),), 7.0) in actions and job_ids(actions) == []
    submit(core, 2, spec())
    assert job_ids(core.offers([offer(4, role="gpu")], T0)) == [1]
    assert job_ids(core.offers([offer(4, role="*")], T0)) == [2]


# ---------------------------------------------------------------------- FairShare itself


def test_usage_halves_every_half_life() -> None:
    fs = FairShare(100.0)
    fs.started("alice", 2.0)
    fs.ended("alice", 2.0, runtime=50.0, now=0.0)
    assert fs.usage("alice", 0.0) == pytest.approx(100.0)
    assert fs.usage("alice", 100.0) == pytest.approx(50.0)
    assert fs.usage("alice", 300.0) == pytest.approx(12.5)
    assert fs.usage("nobody", 300.0) == 0.0


def test_key_projects_running_tasks_and_divides_by_share() -> None:
    fs = FairShare(1e9, shares={"bob": 4.0}, default_runtime=10.0)
    fs.started("alice", 1.0)
    fs.started("bob", 1.0)
    assert fs.key("alice", 0.0) == pytest.approx(10.0)
    assert fs.key("bob", 0.0) == pytest.approx(2.5)
    fs.ended("alice", 1.0, runtime=100.0, now=0.0)
    fs.started("alice", 1.0)  # typical run time is now 100 s
    assert fs.key("alice", 0.0) == pytest.approx(100.0 + 100.0)


def test_forget_running_adds_no_usage_and_changes_are_taken_once() -> None:
    fs = FairShare(1e9)
    fs.started("alice", 4.0)
    fs.forget_running("alice", 4.0)
    assert fs.key("alice", 0.0) == 0.0 and fs.take_changed(0.0) == {}
    fs.started("bob", 1.0)
    fs.ended("bob", 1.0, runtime=5.0, now=10.0)
    ((name, (usage, as_of)),) = fs.take_changed(10.0).items()
    assert name == "bob" and usage == pytest.approx(5.0) and as_of == 10.0
    assert fs.take_changed(11.0) == {}
