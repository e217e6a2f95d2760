"""An agent's GET /metrics on a real `agora local` cluster agrees with its own GET /state."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.polling import wait_for
from test_cli import Local, _kill_everything, start_local

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-agent-metrics"), agents=1)
    token = (cluster.home / "keys" / "operator.token").read_text().strip()
    TOKEN["Authorization"] = f"Bearer {token}"
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def agent_url(local: Local) -> str:
    """The one agent's HTTP API, as the master reports it (AgentSummary.address / http_port)."""
    out = local.agora("agents", "--json")
    assert out.returncode == 0, out.stderr
    (agent,) = json.loads(out.stdout)
    assert agent["http_port"] > 0, agent
    return f"http://{agent['address']}:{agent['http_port']}"


#: agora local's operator token (set by the fixture): the agent's API needs it.
TOKEN: dict[str, str] = {}


def get(url: str) -> tuple[str, bytes]:
    request = urllib.request.Request(url, headers=TOKEN)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def scrape(base: str) -> Samples:
    content_type, body = get(base + "/metrics")
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def task_counts(samples: Samples) -> dict[str, int]:
    return {
        dict(labels)["state"]: int(v)
        for (name, labels), v in samples.items()
        if name == "agora_agent_tasks" and v
    }


def state_counts(base: str) -> dict[str, int]:
    state: dict[str, Any] = json.loads(get(base + "/state")[1])
    counts: dict[str, int] = {}
    for task in state["tasks"]:
        counts[task["state"]] = counts.get(task["state"], 0) + 1
    return counts


def agreeing(base: str, want: dict[str, int]) -> Samples | None:
    """A scrape whose task counts equal both ``want`` and the agent's /state (read after it;
    states move, so the caller polls)."""
    samples = scrape(base)
    counts = task_counts(samples)
    return samples if counts == want == state_counts(base) else None


def test_agent_metrics_agree_with_its_state(local: Local) -> None:
    base = agent_url(local)
    run = local.spawn("run", "--task-id", "metrics-sleep", "--", "sleep", "60")
    try:
        wait_for(
            lambda: (local.task("metrics-sleep") or {}).get("state") == "RUNNING",
            timeout=30,
            what="metrics-sleep RUNNING",
        )
        samples = wait_for(
            lambda: agreeing(base, {"RUNNING": 1}), timeout=15, what="a RUNNING task in /metrics"
        )
        assert samples[("agora_agent_registered", ())] == 1
        assert samples[("agora_agent_uptime_seconds", ())] > 0
        assert samples[("agora_agent_messages_received_total", ())] >= 2
        assert samples[("agora_agent_bad_frames_received_total", ())] == 0
        assert samples[("agora_agent_executors", (("state", "RUNNING"),))] == 1
        assert samples[("agora_agent_resources_total", (("resource", "cpus"),))] == 4
        assert samples[("agora_agent_resources_used", (("resource", "cpus"),))] == 0.1
        assert samples[("agora_agent_resources_used", (("resource", "mem"),))] == 32

        killed = local.agora("kill", "metrics-sleep")
        assert killed.returncode == 0, killed.stderr
        run.communicate(timeout=30)
        # Once the master has acknowledged KILLED, the agent forgets the task.
        after = wait_for(lambda: agreeing(base, {}), timeout=15, what="no task in /metrics")
        assert after[("agora_agent_resources_used", (("resource", "cpus"),))] == 0
        assert after[("agora_agent_status_updates_pending", ())] == 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
