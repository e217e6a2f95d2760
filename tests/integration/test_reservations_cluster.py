"""Dynamic reservations on a real cluster survive an agent restart and then a master restart: a
framework of role ``gold`` reserves part of the agent; the agent is SIGKILLed and started again
(its journal keeps the reservation), then the master is SIGKILLed and started again on the same
address (it knows nothing of the reservation but what the agent reports). The reserved part is
still offered only to ``gold``, and a framework of another role never sees it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, Filters, FrameworkInfo, Offer, Scheduler
from agora.sdk.messages import Reserve
from agora.sdk.resources import Resources
from support.cluster import LocalCluster
from support.insecure import insecure_unless_curve
from support.polling import wait_for

pytestmark = pytest.mark.timeout(120)

RESERVED = Resources.parse("cpus(gold):1;mem(gold):256")


@dataclass
class Watcher(Scheduler):
    """Keeps the offers it gets (declining them briefly); reserves ``reserve`` once."""

    reserve: Resources | None = None
    offers_seen: list[Offer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offers(self, driver, offers: list[Offer]) -> None:  # type: ignore[no-untyped-def]
        for offer in offers:
            with self.lock:
                self.offers_seen.append(offer)
                reserve, self.reserve = self.reserve, None
            if reserve is not None:
                ops = [Reserve(resources=reserve)]
                driver.accept([offer.offer_id], ops, Filters(refuse_seconds=0.5))
            else:
                driver.decline(offer.offer_id, filters=Filters(refuse_seconds=0.5))

    def seen(self) -> list[Resources]:
        with self.lock:
            return [o.resources for o in self.offers_seen]

    def forget(self) -> None:
        with self.lock:
            self.offers_seen.clear()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c", agents=1, agent_resources="cpus:4;mem:1024") as c:
        yield c


def _restart_master(cluster: LocalCluster) -> None:
    assert cluster.master is not None
    cluster.master.send_signal(signal.SIGKILL)
    cluster.master.wait(10)
    args = ["-m", "agora.master.server", "--bind", cluster.endpoint]
    args += ["--work-dir", str(cluster.work_dir / "master"), *insecure_unless_curve(())]
    cluster.master = cluster._spawn("master-2", args)


def _gold_offered(watcher: Watcher) -> bool:
    return any(r.contains(RESERVED) for r in watcher.seen())


def test_a_reservation_survives_an_agent_restart(cluster: LocalCluster) -> None:
    gold = Watcher(reserve=RESERVED)
    other = Watcher()
    info_gold = FrameworkInfo(name="gold", roles=("gold",))
    info_other = FrameworkInfo(name="other", roles=("other",))
    with BlockingSchedulerDriver(gold, info_gold, cluster.endpoint) as d_gold:
        d_gold.start(timeout=20)
        wait_for(lambda: _gold_offered(gold), 30, "the reserved resources offered to gold")
        (agent_id,) = cluster.active_agents()
        proc = cluster.agent_procs[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        cluster.start_agent(0)
        wait_for(lambda: "agent_recovered" in cluster.log("agent-0"), 30, "the agent to recover")
        wait_for(lambda: cluster.active_agents() == [agent_id], 30, "re-registration")
        _restart_master(cluster)
        wait_for(lambda: cluster.active_agents() == [agent_id], 30, "re-registration")
        gold.forget()
        wait_for(lambda: _gold_offered(gold), 30, "the reservation offered to gold again")
        with BlockingSchedulerDriver(other, info_other, cluster.endpoint) as d_other:
            d_other.start(timeout=20)
            wait_for(lambda: len(other.seen()) >= 2, 30, "offers to the other role")
            for resources in other.seen():
                assert resources.roles() == {"*"}, resources
                assert resources.scalar("cpus") <= 3.0


def _agora(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agora.sdk.cli", *argv, "--master", cluster.endpoint]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_agora_reserve_and_unreserve(cluster: LocalCluster) -> None:
    (agent_id,) = cluster.active_agents()
    bad = _agora(cluster, "reserve", agent_id, "db", "cpus:64")
    assert bad.returncode == 1 and "not free" in bad.stderr, bad
    done = _agora(cluster, "reserve", agent_id, "db", "cpus:1;mem:256")
    assert done.returncode == 0, done
    db = Watcher()
    info = FrameworkInfo(name="db", roles=("db",))
    with BlockingSchedulerDriver(db, info, cluster.endpoint) as driver:
        driver.start(timeout=20)
        wanted = Resources.parse("cpus(db):1;mem(db):256")
        wait_for(lambda: any(r.contains(wanted) for r in db.seen()), 30, "db's reservation")
    done = _agora(cluster, "unreserve", agent_id, "db", "cpus:1;mem:256")
    assert done.returncode == 0, done
    again = _agora(cluster, "unreserve", agent_id, "db", "cpus:1")
    assert again.returncode == 1 and "only dynamic" in again.stderr, again
