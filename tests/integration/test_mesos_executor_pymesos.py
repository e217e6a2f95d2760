"""An unmodified pymesos executor (Mesos v1 executor HTTP API) runs as an Agora custom executor
through the Mesos executor bridge, on a real cluster: launches, updates with their own uuids,
acknowledgements, framework messages both ways, a kill, the shutdown; and the bridge serves only
the executor it started."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.sdk import BlockingSchedulerDriver, FrameworkInfo, TaskSpec, TaskState
from agora.sdk.ids import ExecutorID, FrameworkID
from agora.sdk.messages import CommandInfo, ExecutorInfo
from agora.sdk.resources import Resources
from support.cluster import LocalCluster
from support.polling import wait_for
from support.recorder import Recorder

pymesos = pytest.importorskip(
    "pymesos", reason="pymesos is installed by `make test` (tests/support/install_pymesos.sh)"
)

SMALL = "cpus:0.1;mem:16"

# A pymesos executor as its users write them; it reports its acknowledgements and its endpoint
# back to the scheduler as framework messages, so the test can see them.
PYMESOS_EXECUTOR = r"""
import os, threading
from pymesos import Executor, MesosExecutorDriver, encode_data, decode_data

class Echo(Executor):
    def launchTask(self, driver, task):
        driver.sendStatusUpdate({"task_id": task["task_id"], "state": "TASK_RUNNING",
                                 "message": "started by pymesos"})

    def killTask(self, driver, task_id):
        driver.sendStatusUpdate({"task_id": task_id, "state": "TASK_KILLED"})

    def frameworkMessage(self, driver, message):
        data = decode_data(message)
        if data == b"where":
            driver.sendFrameworkMessage(encode_data(os.environ["MESOS_AGENT_ENDPOINT"].encode()))
        elif data.startswith(b"finish:"):
            task = data.split(b":", 1)[1].decode()
            driver.sendStatusUpdate({"task_id": {"value": task}, "state": "TASK_FINISHED",
                                     "data": encode_data(b"done " + task.encode())})

class Driver(MesosExecutorDriver):
    def on_acknowledged(self, event):
        super().on_acknowledged(event)
        self.sendFrameworkMessage(encode_data(b"acked:" + event["task_id"]["value"].encode()))

Driver(Echo()).run()
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", agents=1) as c:
        yield c


def _mesos_executor(program: str) -> ExecutorInfo:
    """The executor as a Mesos framework declares it: its own command, marked as speaking the
    Mesos executor API, which makes the agent run it through the bridge."""
    return ExecutorInfo(
        executor_id=ExecutorID("pymesos"),
        framework_id=FrameworkID(""),
        command=CommandInfo(value=f"exec {sys.executable} - <<'EOF'\n{program}\nEOF\n"),
        name="pymesos executor",
        resources=Resources.parse("cpus:0.1;mem:256"),  # two Python processes
        mesos=True,
    )


def test_a_pymesos_executor_runs_tasks_through_the_bridge(cluster: LocalCluster) -> None:
    executor = _mesos_executor(PYMESOS_EXECUTOR)
    rec = Recorder(todo=[TaskSpec("first", "", SMALL, executor=executor)])
    driver = BlockingSchedulerDriver(rec, FrameworkInfo(name="mesos-bridge"), cluster.endpoint)
    driver.start(timeout=20)
    with driver:
        running = rec.wait_state("first", TaskState.RUNNING, timeout=60)
        assert running.message == "started by pymesos"
        assert running.source.name == "EXECUTOR" and running.executor_id == "pymesos"
        agent = running.agent_id
        assert agent is not None
        # Acknowledged by the driver, relayed to pymesos as ACKNOWLEDGED with its own uuid.
        wait_for(lambda: b"acked:first" in rec.messages, what="the acknowledgement")

        rec.add([TaskSpec("second", "", SMALL, executor=executor)])
        rec.wait_state("second", TaskState.RUNNING, timeout=30)
        driver.kill("second")
        killed = rec.wait_state("second", TaskState.KILLED, timeout=30)
        assert killed.source.name == "EXECUTOR"

        driver.message(agent, "pymesos", b"finish:first")
        done = rec.wait_state("first", TaskState.FINISHED, timeout=30)
        assert done.data == b"done first"

        driver.message(agent, "pymesos", b"where")
        wait_for(
            lambda: any(b":" in m and b"acked" not in m for m in rec.messages), what="endpoint"
        )
        endpoint = next(m for m in rec.messages if b":" in m and b"acked" not in m).decode()
        assert driver.framework_id is not None
        _an_outsider_is_refused(endpoint, str(driver.framework_id))


def _an_outsider_is_refused(endpoint: str, framework_id: str) -> None:
    """This test process did not descend from the bridge's executor: 403 to whatever it asks,
    a subscription (which would read the tasks' launches) or a forged update."""
    for call in (
        {
            "type": "SUBSCRIBE",
            "framework_id": {"value": framework_id},
            "executor_id": {"value": "pymesos"},
        },
        {
            "type": "UPDATE",
            "framework_id": {"value": framework_id},
            "executor_id": {"value": "pymesos"},
            "update": {
                "status": {
                    "task_id": {"value": "first"},
                    "state": "TASK_FAILED",
                    "source": "SOURCE_EXECUTOR",
                    "uuid": "AAAAAAAAAAAAAAAAAAAAAA==",
                }
            },
        },
    ):
        request = urllib.request.Request(
            f"http://{endpoint}/api/v1/executor",
            data=json.dumps(call).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
