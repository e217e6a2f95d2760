"""The ``/state`` document is built a slice of rows per turn of the event loop, so the loop that
also carries the election's heartbeats is never held for the whole build."""

from __future__ import annotations

import asyncio

import pytest
from agora.master.server import state_doc
from agora.master.server.metrics import DaemonStats
from agora.master.server.state_doc import StateDocument
from agora.sdk.ids import FrameworkID
from agora.sdk.messages import TaskState
from support.master_kit import Harness, offers_in


def _cluster(agents: int, tasks_per_agent: int) -> tuple[Harness, FrameworkID]:
    """``agents`` agents (peers a0, a1, ...), each with ``tasks_per_agent`` STAGING tasks
    ``t<i>-<k>`` of one framework."""
    h = Harness()
    peers = {h.register_agent(f"a{i}", "cpus:8;mem:8192"): i for i in range(agents)}
    fw = h.subscribe("s1")
    for offer in offers_in(h.tick(), "s1"):
        i = peers[offer.agent_id]
        launched = [(f"t{i}-{k}", "cpus:1;mem:64", offer.agent_id) for k in range(tasks_per_agent)]
        h.launch("s1", fw, [offer], launched, refuse_seconds=0)
    return h, fw


def test_the_document_is_built_a_slice_per_turn_and_equals_the_one_built_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_doc, "ROWS_PER_TURN", 7)
    h, _ = _cluster(agents=10, tasks_per_agent=3)  # 10 agent rows, 30 task rows
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def both() -> dict[str, object]:
        ticker = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = turns
        try:
            built = await StateDocument().build_async(h.master, DaemonStats())
        finally:
            ticker.cancel()
        # ceil(10 / 7) + ceil(30 / 7) slices: the other work ran between each of them.
        assert turns - before >= 2 + 5
        return built

    built = asyncio.run(both())
    at_once = StateDocument().build(h.master, DaemonStats())
    for doc in (built, at_once):
        doc["master"]["uptime"] = 0  # type: ignore[index]
        for offer in doc["offers"]["list"]:  # type: ignore[index]
            offer["age"] = 0
    assert built == at_once
    assert len(built["tasks"]) == 30  # type: ignore[arg-type]
    assert len(built["agents"]) == 10  # type: ignore[arg-type]


def test_a_task_that_changes_during_the_build_is_listed_once_in_its_newer_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_doc, "ROWS_PER_TURN", 2)
    h, fw = _cluster(agents=2, tasks_per_agent=2)

    async def build_while_a_task_runs() -> dict[str, object]:
        building = asyncio.create_task(StateDocument().build_async(h.master, DaemonStats()))
        await asyncio.sleep(0)  # the lists are taken, no task row is built yet
        h.agent_update("a1", fw, "t1-1", TaskState.RUNNING)
        return await building

    doc = asyncio.run(build_while_a_task_runs())
    rows = {t["id"]: t["state"] for t in doc["tasks"]}  # type: ignore[attr-defined]
    assert rows == {"t0-0": "STAGING", "t0-1": "STAGING", "t1-0": "STAGING", "t1-1": "RUNNING"}
