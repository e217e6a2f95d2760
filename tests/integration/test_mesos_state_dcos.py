"""A third independent Mesos client from PyPI, reading state: the DC/OS library ``dcos`` 0.6.1
(``dcos.mesos``, what the DC/OS CLI's ``dcos task`` and ``dcos node`` read the master with),
unmodified, pointed at an Agora master as at a Mesos one (``core.mesos_master_url``). It reads
``/master/state.json`` and lists the agents, the frameworks and their tasks, live and completed.

dcos 0.6.1 (2017) predates Python 3.10, which removed the ``collections`` aliases of the
``collections.abc`` classes that it subclasses at import; the test puts those aliases back before
importing it. It authenticates with DC/OS tokens (``Authorization: token=...``), which Agora does
not take, so the master serves its HTTP API anonymously here, as a master started ``--insecure``
does."""

from __future__ import annotations

import collections
import collections.abc
import getpass
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster import LocalCluster
from support.mesos_stream import Subscription, subscribe
from support.polling import wait_for

for _name in ("Mapping", "MutableMapping", "Sequence", "Iterable", "Callable"):
    if not hasattr(collections, _name):
        setattr(collections, _name, getattr(collections.abc, _name))

dcos_mesos = pytest.importorskip(
    "dcos.mesos", reason="dcos is installed by `make test` (tests/support/install_pymesos.sh)"
)
SMALL = [
    {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
    {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", agents=2, master_args=("--http-port", "0")) as c:
        url = (c.work_dir / "master.endpoint.http").read_text().strip()
        monkeypatch.setenv("DCOS_DIR", str(tmp_path / "dcos"))
        monkeypatch.setenv("DCOS_URL", url)
        monkeypatch.setenv("DCOS_MESOS_MASTER_URL", url + "/")
        yield c


def _master() -> Any:
    return dcos_mesos.get_master(dcos_mesos.DCOSClient())


def _launch(sub: Subscription, url: str, framework_id: dict[str, str], task_id: str) -> None:
    offer = sub.wait(lambda e: e["type"] == "OFFERS")["offers"]["offers"][0]
    task = {
        "task_id": {"value": task_id},
        "agent_id": offer["agent_id"],
        "name": task_id,
        "resources": SMALL,
        "command": {"value": "sleep 300"},
    }
    accept = {
        "type": "ACCEPT",
        "framework_id": framework_id,
        "accept": {
            "offer_ids": [offer["id"]],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": [task]}}],
            "filters": {"refuse_seconds": 0},
        },
    }
    assert sub.call(accept, url)[0] == 202


def test_the_dcos_library_reads_agents_frameworks_and_tasks(cluster: LocalCluster) -> None:
    url = (cluster.work_dir / "master.endpoint.http").read_text().strip()
    sub = subscribe(url, {"user": getpass.getuser(), "name": "read-by-dcos"})
    assert isinstance(sub, Subscription), sub
    try:
        framework_id = sub.wait(lambda e: e["type"] == "SUBSCRIBED")["subscribed"]["framework_id"]
        _launch(sub, url, framework_id, "keeper")
        _launch(sub, url, framework_id, "goner")
        wait_for(
            lambda: (
                {t["id"]: t["state"] for t in _master().tasks()}
                == {"keeper": "TASK_RUNNING", "goner": "TASK_RUNNING"}
            ),
            30,
            "both tasks RUNNING, as dcos lists them",
        )
        kill = {
            "type": "KILL",
            "framework_id": framework_id,
            "kill": {"task_id": {"value": "goner"}},
        }
        assert sub.call(kill, url)[0] == 202
        wait_for(
            lambda: [t["id"] for t in _master().tasks(completed=True)] == ["goner"],
            30,
            "the killed task among the completed ones",
        )

        master = _master()
        assert sorted(s["id"] for s in master.slaves()) == sorted(cluster.active_agents())
        [framework] = [f for f in master.frameworks() if f["id"] == framework_id["value"]]
        assert framework["name"] == "read-by-dcos"
        [keeper] = master.tasks(fltr="keeper")
        assert keeper["state"] == "TASK_RUNNING"
        assert keeper["framework_id"] == framework_id["value"]
        assert keeper["slave_id"] in cluster.active_agents()
        [goner] = master.tasks(fltr="goner", completed=True)
        assert goner["state"] == "TASK_KILLED"
        assert master.slave(keeper["slave_id"])["id"] == keeper["slave_id"]
    finally:
        sub.close()
