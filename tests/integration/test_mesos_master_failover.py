"""An unmodified pymesos scheduler across a leader SIGKILL under `agora local --masters 3`.

pymesos without ZooKeeper knows one master address; here it is the address of a proxy that always
reaches the leader (as a load balancer health-checking ``/health`` or a ``leader.mesos`` DNS name
would). When the leader dies its event stream breaks; pymesos reconnects, subscribes again with
its framework id and is told ``reregistered``. Its running task was not relaunched, and a kill
through the new leader reaches it and is reported.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agora.sdk.discovery import client_principal
from integration.test_cli import Local, _kill_everything, start_local
from integration.test_cli_ha import _master_pid, _state
from support.leader_proxy import LeaderProxy
from support.polling import wait_for

pymesos = pytest.importorskip(
    "pymesos", reason="pymesos is installed by `make test` (tests/support/install_pymesos.sh)"
)
from integration.test_mesos_scheduler_pymesos import PymesosScheduler  # noqa: E402


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[Local]:
    cluster = start_local(tmp_path, agents=1, masters=3)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def test_pymesos_follows_a_leader_failover_without_losing_its_task(ha: Local) -> None:
    http_file = ha.home / "master.http"  # written (atomically) just after the address is printed

    def addresses() -> list[str] | None:
        return http_file.read_text().strip().split(",") if http_file.exists() else None

    urls = wait_for(addresses, 10, "the masters' HTTP addresses")
    assert len(urls) == 3
    token = next(ha.home.rglob("operator.token")).read_text().strip()
    sched = PymesosScheduler()
    with LeaderProxy(urls) as proxy:
        info: dict[str, Any] = {"user": "nobody", "name": "pymesos-ha", "failover_timeout": 60}
        driver = pymesos.MesosSchedulerDriver(
            sched, info, proxy.address, principal=client_principal(), secret=token
        )
        driver.start()
        try:
            wait_for(lambda: sched.registrations, 30, "SUBSCRIBED")
            framework_id = sched.registrations[0].removeprefix("registered:")
            sched.launch("survivor")
            running = sched.state_of("survivor", "TASK_RUNNING")
            agent_id = running["agent_id"]

            before = _state(ha)["master_info"]
            os.kill(_master_pid(ha, before["master_id"]), signal.SIGKILL)
            wait_for(lambda: "reregistered" in sched.registrations, 60, "re-SUBSCRIBED")
            assert _state(ha)["master_info"]["epoch"] > before["epoch"]

            # The new leader knows the task (the agent re-registered with it); one instance ran.
            driver.reconcileTasks([{"task_id": {"value": "survivor"}, "agent_id": agent_id}])
            wait_for(
                lambda: any(
                    s["task_id"]["value"] == "survivor"
                    and s["state"] == "TASK_RUNNING"
                    and s.get("reason") == "REASON_RECONCILIATION"
                    for s in sched.statuses
                ),
                30,
                f"the reconciled task (saw {sched.statuses})",
            )
            driver.killTask({"value": "survivor"})
            sched.state_of("survivor", "TASK_KILLED")
            sandboxes = list(ha.work.glob("agent-*/frameworks/*/executors/*/tasks/survivor*"))
            assert len(sandboxes) == 1, sandboxes
            frameworks = [f for f in _state(ha)["frameworks"] if f["framework_id"] == framework_id]
            assert frameworks and frameworks[0]["connected"]
            assert sched.registrations[0] == f"registered:{framework_id}"
            assert not sched.errors
        finally:
            driver.stop()  # TEARDOWN
            driver.join()
