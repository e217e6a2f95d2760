"""The agent's /metrics: counts read from a real agent core, parsed back as Prometheus text."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from agora.agent.server.http import make_app
from agora.agent.server.http_auth import HttpAuth
from agora.agent.server.metrics import make_registry
from agora.sdk.ids import ExecutorID, TaskID
from agora.sdk.messages import ContainerUsage, TaskState
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.agent_kit import FID, AgentHarness, executor_info

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name}


@dataclass
class Counters:
    """Stands in for the daemon's counters."""

    messages_received: int = 0
    bad_frames_received: int = 0
    latest_usage: tuple[ContainerUsage, ...] = ()
    started: float = field(default_factory=time.monotonic)
    by_peer: list[tuple[str, int]] = field(default_factory=list)

    def uptime(self) -> float:
        return time.monotonic() - self.started

    def bad_frames_by_peer(self) -> list[tuple[str, int]]:
        return self.by_peer


def busy_agent() -> AgentHarness:
    """t-run RUNNING, t-done FINISHED (unacknowledged), t-stage STAGING, all on the command
    executor; t-custom STAGING on a custom executor that has not registered yet."""
    h = AgentHarness()
    h.register()
    h.run("t-run", resources="cpus:1;mem:128")
    h.run("t-done", resources="cpus:2;mem:1024")
    h.start_executor("cmd")
    _, run_uuid = h.update("cmd", "t-run", TaskState.RUNNING)
    h.update("cmd", "t-done", TaskState.RUNNING)
    h.update("cmd", "t-done", TaskState.FINISHED)
    h.ack("t-run", run_uuid)
    h.run("t-stage", resources="cpus:0.5;mem:64")
    h.run("t-custom", executor=executor_info("exec-1"), resources="cpus:0.25;mem:32")
    return h


def scrape(h: AgentHarness | None, counters: Counters | None = None) -> Samples:
    agent = None if h is None else h.agent
    return parse(generate_latest(make_registry(lambda: agent, counters)).decode())


def test_task_counts_match_the_core() -> None:
    h = busy_agent()
    tasks = by_label(scrape(h), "agora_agent_tasks", "state")
    assert set(tasks) == {s.value for s in TaskState}  # every state, 0s included
    expected = {s.value: 0 for s in TaskState}
    for task in h.st.tasks.values():
        expected[task.state.value] += 1
    assert tasks == expected
    assert (tasks["RUNNING"], tasks["FINISHED"], tasks["STAGING"]) == (1, 1, 2)


def test_registration_executors_and_pending_updates() -> None:
    h = busy_agent()
    samples = scrape(h)
    assert samples[("agora_agent_registered", ())] == 1
    executors = by_label(samples, "agora_agent_executors", "state")
    assert executors == {"LAUNCHING": 1, "RUNNING": 1, "TERMINATING": 0, "RECOVERING": 0}
    # t-run's RUNNING was acknowledged; t-done's RUNNING and FINISHED were not.
    assert samples[("agora_agent_status_updates_pending", ())] == 2
    assert scrape(AgentHarness())[("agora_agent_registered", ())] == 0


def test_resources_used_are_live_tasks_and_custom_executors() -> None:
    samples = scrape(busy_agent())
    total = by_label(samples, "agora_agent_resources_total", "resource")
    assert total == {"cpus": 4, "mem": 4096, "disk": 0, "gpus": 0}
    used = by_label(samples, "agora_agent_resources_used", "resource")
    # t-run + t-stage + t-custom + exec-1's own 0.1 cpus / 32 mem; t-done is over.
    assert used["cpus"] == 1.85
    assert used["mem"] == 128 + 64 + 32 + 32
    assert (used["disk"], used["gpus"]) == (0, 0)


def test_container_usage_is_summed_and_omitted_when_there_is_none() -> None:
    counters = Counters(messages_received=7, bad_frames_received=2, by_peer=[("ab12", 2)])
    samples = scrape(busy_agent(), counters)
    assert samples[("agora_agent_messages_received_total", ())] == 7
    assert samples[("agora_agent_bad_frames_received_total", ())] == 2
    assert by_label(samples, "agora_agent_bad_frames_by_peer", "peer") == {"ab12": 2}
    assert samples[("agora_agent_uptime_seconds", ())] >= 0
    assert not any(name.startswith("agora_agent_container") for name, _ in samples)

    def usage(task: str, cpu: float, rss: int) -> ContainerUsage:
        return ContainerUsage(
            framework_id=FID,
            executor_id=ExecutorID("agora-command"),
            task_id=TaskID(task),
            cpu_seconds=cpu,
            rss_bytes=rss,
        )

    counters.latest_usage = (usage("t-run", 1.5, 1000), usage("t-stage", 0.25, 24))
    samples = scrape(busy_agent(), counters)
    assert samples[("agora_agent_container_cpu_seconds", ())] == 1.75
    assert samples[("agora_agent_container_memory_rss_bytes", ())] == 1024
    assert samples[("agora_agent_containers_sampled", ())] == 2


def test_no_core_yet_reports_only_unregistered() -> None:
    samples = scrape(None, Counters())
    assert samples[("agora_agent_registered", ())] == 0
    assert not by_label(samples, "agora_agent_tasks", "state")


def test_metrics_endpoint_serves_prometheus_text(tmp_path: Path) -> None:
    h = busy_agent()
    counters = Counters(messages_received=3)

    async def go() -> tuple[int, str, str]:
        app = make_app(lambda: h.agent, str(tmp_path), counters, HttpAuth(insecure=True))
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            return resp.status, resp.headers["Content-Type"], await resp.text()

    status, content_type, text = asyncio.run(go())
    assert status == 200 and content_type.startswith("text/plain")
    samples = parse(text)
    assert samples[("agora_agent_tasks", (("state", "RUNNING"),))] == 1
    assert samples[("agora_agent_messages_received_total", ())] == 3


def test_two_agents_in_one_process_do_not_mix() -> None:
    one, other = busy_agent(), AgentHarness()
    assert by_label(scrape(one), "agora_agent_tasks", "state")["STAGING"] == 2
    assert by_label(scrape(other), "agora_agent_tasks", "state")["STAGING"] == 0


def test_an_agent_without_http_does_not_load_prometheus() -> None:
    code = (
        "import sys, agora.agent.server.main\n"
        "sys.exit(1 if 'prometheus_client' in sys.modules else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=15)
    assert done.returncode == 0, done.stderr.decode()
