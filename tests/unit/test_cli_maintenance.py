"""`agora maintenance` and `agora drain --deadline` without a master: time and duration parsing,
bad input as usage errors, the calls made, and the status text."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest
from agora.sdk.cli import maintenance, operate
from agora.sdk.cli.main import main
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    CancelMaintenance,
    InverseOfferAnswer,
    MaintenanceSummary,
    MasterInfo,
    OperatorDone,
    ScheduleMaintenance,
    StateReply,
)


class Recording:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def call(self, message: Any, timeout: float) -> OperatorDone:
        self.calls.append(message)
        return OperatorDone(call=message.NAME, message="ok")

    async def drain_agent(self, agent_id: Any, timeout: float, *, deadline: Any) -> OperatorDone:
        self.calls.append(("drain", agent_id, deadline))
        return OperatorDone(call="DRAIN_AGENT", message="ok")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Recording:
    rec = Recording()

    def call_master(master: str, timeout: float, call: Any, curve: Any = None) -> Any:
        return asyncio.run(call(rec))

    monkeypatch.setattr(maintenance, "call_master", call_master)
    monkeypatch.setattr(operate, "call_master", call_master)
    return rec


def test_times_and_durations() -> None:
    assert maintenance.duration("90") == 90 and maintenance.duration("10m") == 600
    assert maintenance.duration("2h") == 7200 and maintenance.duration("1d") == 86400
    assert maintenance.moment("+10m", now=1000.0) == 1600.0
    assert maintenance.moment("now", now=5.0) == 5.0
    assert maintenance.moment("1700000000") == 1_700_000_000
    assert maintenance.moment("2026-12-05T14:00:00+00:00") == 1_796_479_200
    for bad in ("-1", "0", "ten", "10x", "400d"):
        with pytest.raises(argparse.ArgumentTypeError):
            maintenance.duration(bad)
    for bad in ("tomorrow", "+ever", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            maintenance.moment(bad)


def test_schedule_and_cancel_make_the_calls(fake: Recording) -> None:
    assert main(["maintenance", "schedule", "a1", "a2", "--start", "100", "--duration", "1h"]) == 0
    assert main(["maintenance", "cancel", "a1"]) == 0
    assert fake.calls == [
        ScheduleMaintenance(agent_ids=(AgentID("a1"), AgentID("a2")), start=100.0, duration=3600),
        CancelMaintenance(agent_ids=(AgentID("a1"),)),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["maintenance", "schedule", "a1", "--start", "soon", "--duration", "1h"],
        ["maintenance", "schedule", "a1", "--start", "+1m", "--duration", "-5"],
        ["maintenance", "schedule", "--start", "+1m", "--duration", "5"],
        ["maintenance", "cancel"],
    ],
)
def test_bad_input_is_a_usage_error_that_calls_nothing(fake: Recording, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and fake.calls == []


def test_drain_deadline(fake: Recording, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drain", "a1", "--deadline", "1700000000"]) == 0
    assert fake.calls == [("drain", AgentID("a1"), 1_700_000_000.0)]
    assert main(["drain", "a1", "--deadline", "whenever"]) == 2
    assert "--deadline" in capsys.readouterr().err and len(fake.calls) == 1


def test_status_text() -> None:
    window = MaintenanceSummary(
        hostname="h1",
        agent_ids=(AgentID("a1"),),
        start=1000.0,
        duration=60,
        status="DRAINING",
        answers=(
            InverseOfferAnswer(
                inverse_offer_id="i1",
                framework_id=FrameworkID("f1"),
                agent_id=AgentID("a1"),
                answer="ACCEPTED",
            ),
        ),
    )
    info = MasterInfo(master_id="m", address="tcp://m", epoch=1)
    text = maintenance.format_status(StateReply(master_info=info, maintenance=(window,)), 1010.0)
    assert "h1  DRAINING" in text and "10s ago" in text and "f1 on a1: ACCEPTED" in text
    assert maintenance.format_status(StateReply(master_info=info), 0) == "no maintenance scheduled"


def test_agents_show_draining_and_drained_and_the_console_shows_windows() -> None:
    from agora.sdk.cli.show import agent_status
    from agora.sdk.cli.top_events import diff_states
    from agora.sdk.cli.top_render import maintenance_line
    from agora.sdk.messages import AgentSummary
    from agora.sdk.resources import Resources

    def agent(**kw: Any) -> AgentSummary:
        return AgentSummary(
            agent_id=AgentID("a1"), hostname="h1", status="ACTIVE", resources=Resources(), **kw
        )

    assert agent_status(agent()) == "ACTIVE"
    assert agent_status(agent(draining=True)) == "DRAINING"
    assert agent_status(agent(draining=True, drained=True)) == "DRAINED"
    info = MasterInfo(master_id="m", address="tcp://m", epoch=1)
    answer = InverseOfferAnswer(
        inverse_offer_id="i1", framework_id=FrameworkID("f1"), agent_id=AgentID("a1")
    )
    windows = (
        MaintenanceSummary(
            hostname="h1", start=0, duration=60, status="DRAINING", answers=(answer,)
        ),
        MaintenanceSummary(hostname="h2", start=700, duration=60),
    )
    line = maintenance_line(StateReply(master_info=info, maintenance=windows), 100.0)
    assert line == "maintenance h1 DRAINING (0/1 accepted), h2 in 10m00s"
    before = StateReply(master_info=info, agents=(agent(draining=True),))
    after = StateReply(master_info=info, agents=(agent(draining=True, drained=True),))
    assert any("DRAINED" in e.text for e in diff_states(before, after, 1.0))
