"""The master's state view (GET_STATE, /state, /state/summary and metrics from one view), the
core's read functions, and allocation once per drained burst (``Master.end_burst``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from agora.master.core import MasterConfig
from agora.master.core import offers as offers_module
from agora.master.core.operator import snapshot
from agora.master.server.http import state_json, summary_json
from agora.master.server.metrics import DaemonStats, count
from agora.sdk.ids import TaskID
from agora.sdk.messages import (
    GetState,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from support.master_kit import Harness, offers_in, only

SERVER = Path(__file__).resolve().parents[2] / "master" / "server"


def _busy(config: MasterConfig, tasks: int = 4) -> tuple[Harness, Any]:
    """One agent running ``tasks`` one-cpu tasks of framework s1; returns (harness, its id)."""
    h = Harness(config)
    agent = h.register_agent("a1", "cpus:4;mem:4096")
    fw = h.subscribe("s1")
    offer = only(offers_in(h.tick(), "s1"))
    launched = [(f"t{i}", "cpus:1;mem:1024", agent) for i in range(tasks)]
    h.launch("s1", fw, [offer], launched, refuse_seconds=0)
    for i in range(tasks):
        _, uuid = h.agent_update("a1", fw, f"t{i}", TaskState.RUNNING)
        h.ack("s1", fw, agent, f"t{i}", uuid)
    return h, fw


def _finished(fw: Any, i: int) -> StatusUpdateMessage:
    status = TaskStatus(
        task_id=TaskID(f"t{i}"),
        state=TaskState.FINISHED,
        source=StatusSource.EXECUTOR,
        uuid=bytes([100 + i]) * 16,
    )
    return StatusUpdateMessage(update=StatusUpdate(framework_id=fw, status=status))


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    passes: list[Any] = []
    real = offers_module.allocate

    def counting(st: Any, now: float, agents: Any) -> None:
        passes.append(agents)
        real(st, now, agents)

    monkeypatch.setattr(offers_module, "allocate", counting)
    return passes


def test_a_burst_of_frees_makes_one_allocation_pass_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, fw = _busy(MasterConfig(bursts=True))
    agent = only(list(h.master.view().agents()))
    passes = _count_passes(monkeypatch)
    for i in range(4):
        assert not offers_in(h.master.handle("a1", _finished(fw, i), h.now), "s1")
    assert passes == [], "handle leaves allocation to the end of the burst"
    offered = offers_in(h.master.end_burst(h.now), "s1")
    assert passes == [[agent.agent_id]], "one event-triggered pass, over the freed agent"
    offer = only(offered)
    assert offer.agent_id == agent.agent_id
    assert offer.resources == Resources.parse("cpus:4;mem:4096"), "the whole burst's frees"
    assert not h.master.end_burst(h.now) and len(passes) == 1, "nothing left to allocate"


def test_without_bursts_every_handle_allocates_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    h, fw = _busy(MasterConfig())
    passes = _count_passes(monkeypatch)
    offered = [offers_in(h.master.handle("a1", _finished(fw, i), h.now), "s1") for i in range(4)]
    assert len(passes) == 4, "one pass per message"
    assert only(offered[0]).resources == Resources.parse("cpus:1;mem:1024"), "offered at once"
    assert not h.master.end_burst(h.now), "end_burst has nothing left to do"


def _cluster() -> Harness:
    h, fw = _busy(MasterConfig(), tasks=3)
    h.master.handle("a1", _finished(fw, 0), h.now)  # one live task finishes ...
    h.register_agent("a2", "cpus:2;mem:2048;disk:10")
    h.subscribe("s2", roles=("batch",))
    return h


def test_get_state_and_the_state_document_list_the_same_rows_in_the_same_order() -> None:
    h = _cluster()
    reply = snapshot(h.master.state)
    doc = state_json(h.master, DaemonStats())
    assert [a["id"] for a in doc["agents"]] == [a.agent_id for a in reply.agents]
    assert [f["id"] for f in doc["frameworks"]] == [f.framework_id for f in reply.frameworks]
    assert [t["id"] for t in doc["tasks"]] == [t.task_id for t in reply.tasks]
    assert [t["state"] for t in doc["tasks"]] == [t.state.value for t in reply.tasks]
    assert [r["name"] for r in doc["roles"]] == [r.name for r in reply.roles] == ["*", "batch"]
    view = h.master.view()
    assert [a.agent_id for a in view.agents()] == [a.agent_id for a in reply.agents]
    assert [t.info.task_id for t in view.tasks()] == [t.task_id for t in reply.tasks]
    live = {state: n for state, n in view.counts().tasks.items() if n}
    assert live == {"FINISHED": 1, "RUNNING": 2}


def test_summary_metrics_and_a_partial_state_count_what_the_full_state_lists() -> None:
    h = _cluster()
    reply = snapshot(h.master.state)
    summary = summary_json(h.master)
    by_state: dict[str, int] = {}
    for task in reply.tasks:
        by_state[task.state.value] = by_state.get(task.state.value, 0) + 1
    assert summary["tasks"] == by_state
    assert summary["agents"]["ACTIVE"] == len(reply.agents) == 2
    assert summary["frameworks"]["active"] == len(reply.frameworks) == 2
    assert count(h.master) == h.master.view().counts()
    assert summary["resources"]["total"]["cpus"] == 6.0
    part = snapshot(h.master.state, GetState(agents_limit=1, tasks_limit=1))
    assert part.partial and len(part.agents) == 1 and len(part.tasks) == 1
    assert (part.agents_total, part.tasks_total) == (len(reply.agents), len(reply.tasks))


def test_the_core_answers_the_shells_reads() -> None:
    h = _cluster()
    core = h.master
    agent = core.view().agents()[0]
    assert core.agent(agent.agent_id) is agent
    assert core.agent_id_of("a1") == agent.agent_id and core.agent_id_of("nobody") is None
    fw = core.view().frameworks()[0].framework
    assert core.framework(fw.framework_id) is fw
    assert core.address == h.config.address


def test_the_master_shells_do_not_reach_into_the_core_state() -> None:
    """They read through the core's read functions and its view (state_doc, metrics, logs)."""
    offenders = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(SERVER.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"core\.state\b(?! import)|\bMasterState\b", line)
    ]
    assert offenders == []
