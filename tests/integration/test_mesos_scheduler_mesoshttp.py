"""A second, independent Mesos scheduler API client from PyPI, mesoshttp 0.4.2, unmodified, on a
real Agora cluster: it subscribes, takes an offer (naming the agent ``slave_id``, as it does),
sees its task run, kills it, and tears its framework down.

The master requires HTTP credentials. mesoshttp sends every request with its ``requests_auth``
(a ``requests`` auth object; its own ``set_credentials`` only fills a body field Agora does not
trust), so the framework authenticates with HTTP Basic there, and one without it is refused."""

from __future__ import annotations

import getpass
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support.cluster import LocalCluster
from support.polling import wait_for

client_module = pytest.importorskip(
    "mesoshttp.client", reason="mesoshttp is installed by `make test` (install_pymesos.sh)"
)


PRINCIPAL, TOKEN = "mesoshttp", "mesoshttp-token-0123456789abcdef"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    credentials = tmp_path / "http.toml"
    credentials.write_text(f'{PRINCIPAL} = "{TOKEN}"\n')
    # mesoshttp reads events line by line: a heartbeat a second pushes each one through.
    args = ("--http-port", "0", "--http-credentials", str(credentials), "--heartbeat-interval", "1")
    with LocalCluster(tmp_path / "cluster", agents=1, master_args=args) as c:
        yield c


def test_mesoshttp_runs_and_kills_a_task(cluster: LocalCluster) -> None:
    url = (cluster.work_dir / "master.endpoint.http").read_text().strip()
    client = client_module.MesosClient(
        mesos_urls=[url], frameworkName="mesoshttp-on-agora", frameworkUser=getpass.getuser()
    )
    client.requests_auth = requests.auth.HTTPBasicAuth(PRINCIPAL, TOKEN)
    states: list[tuple[str, str]] = []
    launched = threading.Event()

    def offers(offers: list[Any]) -> None:
        for i, offer in enumerate(offers):
            if i == 0 and not launched.is_set():
                launched.set()
                task = {
                    "name": "sleeper",
                    "task_id": {"value": "sleeper"},
                    "resources": [
                        {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                        {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
                    ],
                    "command": {"value": "sleep 300"},
                }
                offer.accept([task])
            else:
                offer.decline()

    def update(event: dict[str, Any]) -> None:
        status = event["status"]
        states.append((status["task_id"]["value"], status["state"]))

    client.on(client_module.MesosClient.OFFERS, offers)
    client.on(client_module.MesosClient.UPDATE, update)
    runner = threading.Thread(target=client.register, daemon=True)
    runner.start()
    try:
        wait_for(lambda: ("sleeper", "TASK_RUNNING") in states, 30, f"RUNNING (saw {states})")
        framework_id = client.frameworkId
        assert framework_id
        agent_id = cluster.active_agents()[0]
        client.get_driver().kill(agent_id, "sleeper")
        wait_for(lambda: ("sleeper", "TASK_KILLED") in states, 30, f"KILLED (saw {states})")
        # Updates acknowledged by mesoshttp: none is left waiting at the master.
        tasks = [t for t in cluster.state().tasks if t.task_id == "sleeper"]
        assert all(t.state.name == "KILLED" for t in tasks)
    finally:
        client.stop = True  # it tears the framework down at its next event (a heartbeat)
        runner.join(timeout=20)
    assert not runner.is_alive()
    wait_for(
        lambda: (
            not any(f.framework_id == framework_id and f.active for f in cluster.state().frameworks)
        ),
        20,
        "the teardown",
    )

    frameworks = [f for f in cluster.state().frameworks if f.framework_id == framework_id]
    assert frameworks and frameworks[0].principal == PRINCIPAL


def test_mesoshttp_without_credentials_is_refused(cluster: LocalCluster) -> None:
    url = (cluster.work_dir / "master.endpoint.http").read_text().strip()
    client = client_module.MesosClient(
        mesos_urls=[url],
        frameworkName="anonymous",
        frameworkUser=getpass.getuser(),
        max_reconnect=1,  # one attempt, then register() gives up and returns False
    )
    assert client.register() is False  # the master answered its SUBSCRIBE 401
    assert client.frameworkId is None
    assert not cluster.state().frameworks
