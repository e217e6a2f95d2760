"""The operator's view of a live `agora local`: the master's HTTP API is recorded in
$AGORA_HOME/master.http, its /metrics parse with prometheus_client's parser and agree with
/state, and an operator call over HTTP takes effect (a drained agent gets no new tasks)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.polling import wait_for
from test_cli import Local, _kill_everything, start_local

#: Every metric the issue names, by its Prometheus name.
REQUIRED = {
    "agora_master_elected",
    "agora_master_uptime_seconds",
    "agora_master_agents_active",
    "agora_master_agents_disconnected",
    "agora_master_agents_unreachable",
    "agora_master_frameworks_active",
    "agora_master_frameworks_inactive",
    "agora_master_tasks",
    "agora_master_offers_outstanding",
    "agora_master_resources_total",
    "agora_master_resources_allocated",
    "agora_master_allocation_run_seconds",
    "agora_master_messages_received",
    "agora_master_messages_dropped",
    "agora_master_event_queue_size",
}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-view"), agents=2)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def _url(local: Local) -> str:
    url = (local.home / "master.http").read_text().strip()
    assert url.startswith("http://127.0.0.1:")
    return url


def _token(local: Local) -> str:
    """The operator token `agora local` wrote for its user."""
    return (local.home / "keys" / "operator.token").read_text().strip()


def _get(url: str, token: str) -> tuple[int, str]:
    """A read: like every path but /health, it needs a token."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.status, resp.read().decode()


def _post(url: str, token: str) -> tuple[int, Any]:
    """An operator call over HTTP, with the token `agora local` wrote for its user."""
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=b"", method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=15) as resp:
        return resp.status, json.loads(resp.read())


def test_metrics_parse_and_agree_with_state(local: Local) -> None:
    for i in range(3):
        done = local.agora("run", "--task-id", f"view-{i}", "--", "echo", f"line {i}")
        assert done.returncode == 0, done.stderr
    url = _url(local)
    for path in ("/state", "/state/summary", "/metrics"):  # no token: nothing to read
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + path, timeout=10)
        assert refused.value.code == 401, path
    status, text = _get(url + "/metrics", _token(local))
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families.keys() >= REQUIRED, REQUIRED - families.keys()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    state = json.loads(_get(url + "/state", _token(local))[1])
    assert samples[("agora_master_elected", ())] == 1
    assert samples[("agora_master_agents_active", ())] == len(state["agents"]) == 2
    finished = sum(1 for t in state["tasks"] if t["state"] == "FINISHED")
    assert finished >= 3
    assert samples[("agora_master_tasks", (("state", "FINISHED"),))] == finished
    cpus = sum(a["resources"]["cpus"] for a in state["agents"])
    assert samples[("agora_master_resources_total", (("resource", "cpus"),))] == cpus
    assert samples[("agora_master_frameworks_inactive", ())] == sum(
        1 for f in state["frameworks"] if not f["active"]
    )
    out = local.agora("logs", "view-2")
    assert (out.returncode, out.stdout) == (0, "line 2\n"), out.stderr


def test_a_drained_agent_gets_no_new_tasks_until_reactivated(local: Local) -> None:
    url = _url(local)
    state = json.loads(_get(url + "/state", _token(local))[1])
    drained = state["agents"][0]["id"]
    token = _token(local)
    with pytest.raises(urllib.error.HTTPError) as refused:  # no token: no call
        urllib.request.urlopen(
            urllib.request.Request(f"{url}/agents/{drained}/drain", data=b"", method="POST"),
            timeout=15,
        )
    assert refused.value.code == 401
    status, body = _post(f"{url}/agents/{drained}/drain", token)
    assert (status, body["ok"]) == (200, True)
    agents = json.loads(_get(url + "/state", _token(local))[1])["agents"]
    assert {a["id"]: a["draining"] for a in agents}[drained] is True
    for i in range(4):
        done = local.agora("run", "--task-id", f"drained-{i}", "--", "true")
        assert done.returncode == 0, done.stderr
    placed = {t["task_id"]: t["agent_id"] for t in local.tasks()}
    assert all(placed[f"drained-{i}"] != drained for i in range(4)), placed
    status, body = _post(f"{url}/agents/{drained}/reactivate", token)
    assert status == 200
    wait_for(
        lambda: not json.loads(_get(url + "/state", _token(local))[1])["agents"][0]["draining"],
        timeout=10,
        what="the agent active again",
    )
    assert json.loads(_get(url + "/state/summary", _token(local))[1])["agents"]["DRAINING"] == 0
