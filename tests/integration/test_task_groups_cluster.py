"""Task groups on a real cluster, through Agora's default executor (an ExecutorInfo that names no
command): one member failing kills the others, and each update says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, FrameworkInfo, TaskSpec, TaskState, default_executor
from agora.sdk.messages import Reason
from support.cluster import LocalCluster
from support.polling import wait_for
from support.recorder import Recorder

pytestmark = pytest.mark.timeout(90)
SMALL = "cpus:0.1;mem:32"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c", agents=1) as c:
        yield c


class GroupLauncher(Recorder):
    """Launches ``group`` as one task group on the first offer."""

    group: list[TaskSpec]

    def offers(self, driver, offers):  # type: ignore[no-untyped-def]
        with self.lock:
            group, self.group = getattr(self, "group", []), []
        if group:
            driver.launch_group(offers[0], default_executor("group-1"), group)
        for offer in offers[1 if group else 0 :]:
            driver.decline(offer.offer_id)


def test_a_failing_member_kills_its_group_on_the_default_executor(cluster: LocalCluster) -> None:
    rec = GroupLauncher()
    rec.group = [
        TaskSpec("web", "sleep 60", SMALL),
        TaskSpec("sidecar", "sleep 60", SMALL),
        TaskSpec("broken", "sleep 0.5; exit 1", SMALL),
    ]
    driver = BlockingSchedulerDriver(rec, FrameworkInfo(name="groups"), cluster.endpoint)
    driver.start(timeout=20)
    with driver:
        broken = rec.wait_state("broken", TaskState.FAILED, timeout=30)
        assert broken.exit_code == 1
        for name in ("web", "sidecar"):
            killed = rec.wait_state(name, TaskState.KILLED, timeout=30)
            assert killed.reason is Reason.TASK_GROUP_MEMBER_FAILED
            assert "broken" in killed.message
            assert TaskState.RUNNING in rec.states(name)
        # Its group over, the default executor exits and the agent forgets it.
        wait_for(
            lambda: "executor_exited" in cluster.log("agent-0"), 30, "the default executor to exit"
        )
