"""The issue's persistent-volume rule on a real cluster: a file a task writes in its volume
survives the task's end, an agent SIGKILL and restart, and a master restart; the volume is
offered back only to its role; DESTROY deletes its data."""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, Filters, FrameworkInfo, Offer, Scheduler
from agora.sdk.messages import (
    CommandInfo,
    Create,
    Destroy,
    Launch,
    Operation,
    PersistentVolume,
    Reserve,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from integration.test_reservations_cluster import Watcher, _restart_master
from support.cluster import LocalCluster
from support.polling import wait_for

pytestmark = pytest.mark.timeout(150)

R = Resources.parse
DATA = PersistentVolume(volume_id="data1", role="gold", disk=64)
VOLUME = R("volumes(gold):{data1}")
Plan = Callable[[Offer], list[Operation] | None]


def _task(task_id: str, offer: Offer, command: str) -> Launch:
    info = TaskInfo(
        task_id=task_id,
        name=task_id,
        agent_id=offer.agent_id,
        resources=R("cpus:0.1;mem:32") + VOLUME,
        command=CommandInfo(value=command),
    )
    return Launch(task_infos=(info,))


@dataclass
class Stateful(Scheduler):
    """Carries out ``plans`` one per offer that has what the plan needs; records updates."""

    plans: list[Plan] = field(default_factory=list)
    statuses: list[TaskStatus] = field(default_factory=list)
    offers_seen: list[Offer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offers(self, driver, offers: list[Offer]) -> None:  # type: ignore[no-untyped-def]
        for offer in offers:
            with self.lock:
                self.offers_seen.append(offer)
                ops = self.plans[0](offer) if self.plans else None
                if ops is not None:
                    self.plans.pop(0)
            if ops is not None:
                driver.accept([offer.offer_id], ops, Filters(refuse_seconds=0.2))
            else:
                driver.decline(offer.offer_id, filters=Filters(refuse_seconds=0.2))

    def status_update(self, driver, status: TaskStatus) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.statuses.append(status)

    def add(self, plan: Plan) -> None:
        with self.lock:
            self.plans.append(plan)

    def final(self, task_id: str) -> TaskState | None:
        with self.lock:
            states = [s.state for s in self.statuses if s.task_id == task_id]
        done = [s for s in states if s in (TaskState.FINISHED, TaskState.FAILED, TaskState.LOST)]
        return done[-1] if done else None


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    # Not under /tmp: a task in a mount namespace gets a private /tmp, which would hide the
    # volume directories its sandbox links to (the sandbox alone is mapped back there).
    work = Path(tempfile.mkdtemp(prefix="agora-volumes-", dir="/var/tmp"))
    agent_resources = "cpus:4;mem:1024;disk:1000"
    try:
        with LocalCluster(work / "c", agents=1, agent_resources=agent_resources) as c:
            yield c
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _create(offer: Offer) -> list[Operation] | None:
    if not offer.resources.contains(R("cpus:0.1;mem:32;disk:64")):
        return None
    write = _task("write", offer, "echo kept > volumes/data1/file")
    return [Reserve(resources=R("disk(gold):64")), Create(volumes=(DATA,)), write]


def _with_volume(make: Callable[[Offer], list[Operation]]) -> Plan:
    return lambda offer: make(offer) if offer.resources.contains(VOLUME) else None


def test_a_volume_keeps_its_data_through_task_end_and_restarts(cluster: LocalCluster) -> None:
    gold = Stateful(plans=[_create])
    volume_dir = cluster.work_dir / "agent-0" / "volumes" / "roles" / "gold" / "data1"
    with BlockingSchedulerDriver(
        gold, FrameworkInfo(name="gold", roles=("gold",)), cluster.endpoint
    ) as driver:
        driver.start(timeout=20)
        assert wait_for(lambda: gold.final("write"), 30, "the writer to end") is TaskState.FINISHED
        assert (volume_dir / "file").read_text() == "kept\n"
        (agent_id,) = cluster.active_agents()
        proc = cluster.agent_procs[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        cluster.start_agent(0)
        wait_for(lambda: "agent_recovered" in cluster.log("agent-0"), 30, "the agent to recover")
        _restart_master(cluster)
        wait_for(lambda: cluster.active_agents() == [agent_id], 30, "re-registration")
        check = 'test "$(cat volumes/data1/file)" = kept'
        gold.add(_with_volume(lambda offer: [_task("read", offer, check)]))
        assert wait_for(lambda: gold.final("read"), 40, "the reader to end") is TaskState.FINISHED
        # Another role is never offered the volume.
        other = Watcher()
        info = FrameworkInfo(name="other", roles=("other",))
        with BlockingSchedulerDriver(other, info, cluster.endpoint) as d_other:
            d_other.start(timeout=20)
            wait_for(lambda: len(other.seen()) >= 2, 30, "offers to the other role")
            assert all(not r.named("volumes") for r in other.seen())
        gold.add(_with_volume(lambda _offer: [Destroy(volumes=(DATA,))]))
        wait_for(lambda: not volume_dir.exists(), 30, "DESTROY to delete the data")
