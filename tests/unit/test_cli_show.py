"""`agora agents`, `agora roles` and `agora state` without a master: drained agents, the roles
table and its JSON, from StateReply objects made here."""

from __future__ import annotations

import argparse
import json

import msgspec
import pytest
from agora.sdk.cli import show
from agora.sdk.cli.main import build_parser
from agora.sdk.cli.show import agent_status, agents_json, agents_table, roles_json, roles_table
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    MasterInfo,
    RoleSummary,
    StateReply,
)
from agora.sdk.resources import Resources
from rich.console import Console


def _agent(n: int, *, draining: bool = False, status: str = "ACTIVE") -> AgentSummary:
    return AgentSummary(
        agent_id=AgentID(f"a-{n}"),
        hostname=f"agent-{n}",
        status=status,
        resources=Resources.parse("cpus:4;mem:4096"),
        draining=draining,
    )


def _reply() -> StateReply:
    return StateReply(
        master_info=MasterInfo(master_id="m-1", address="tcp://127.0.0.1:5050", epoch=3),
        cluster="prod-eu",
        agents=(
            _agent(1, draining=True),
            _agent(2),
            _agent(3, draining=True, status="UNREACHABLE"),
        ),
        frameworks=(
            FrameworkSummary(
                framework_id=FrameworkID("f-1"), name="spark", roles=("analytics",), share=0.25
            ),
        ),
        roles=(
            RoleSummary(
                name="analytics",
                weight=2.0,
                guarantee=Resources.parse("cpus:8;mem:8192"),
                limit=Resources.parse("cpus:16"),
                share=0.125,
            ),
            RoleSummary(name="*"),
        ),
    )


def _text(*renderables: object) -> str:
    console = Console(record=True, width=200, color_system=None)
    for r in renderables:
        console.print(r)
    return console.export_text()


def _row(text: str, needle: str) -> str:
    return next(line for line in text.splitlines() if needle in line)


def test_a_drained_agent_shows_draining_in_the_agents_table() -> None:
    reply = _reply()
    assert [agent_status(a) for a in reply.agents] == ["DRAINING", "ACTIVE", "UNREACHABLE"]
    out = _text(agents_table(reply.agents))
    assert "DRAINING" in _row(out, "agent-1")
    assert "ACTIVE" in _row(out, "agent-2") and "DRAINING" not in _row(out, "agent-2")


def test_agents_json_carries_draining() -> None:
    doc = json.loads(json.dumps(agents_json(_reply())))
    assert [(a["agent_id"], a["draining"]) for a in doc] == [
        ("a-1", True),
        ("a-2", False),
        ("a-3", True),
    ]


def test_roles_table_shows_weight_quota_and_share() -> None:
    out = _text(roles_table(_reply().roles))
    assert "Roles (2)" in out
    for header in ("NAME", "WEIGHT", "GUARANTEE", "LIMIT", "SHARE"):
        assert header in out
    analytics = _row(out, "analytics")
    for cell in ("2", "cpus:8;mem:8192", "cpus:16", "12.5%"):
        assert cell in analytics
    star = _row(out, "│ *")
    assert star.count(" - ") == 2  # no guarantee, no limit
    assert "1" in star and "0.0%" in star


def test_roles_json() -> None:
    doc = json.loads(json.dumps(roles_json(_reply())))
    analytics, star = doc
    assert analytics == {
        "name": "analytics",
        "weight": 2.0,
        "guarantee": {"cpus": 8, "mem": 8192},
        "limit": {"cpus": 16},
        "share": 0.125,
    }
    assert (star["name"], star["guarantee"], star["limit"]) == ("*", None, None)


def test_parser_knows_roles() -> None:
    args = build_parser().parse_args(["roles", "--json", "--master", "tcp://m:5050"])
    assert (args.command, args.json, args.func) == ("roles", True, show.cmd_roles)


@pytest.mark.parametrize("as_json", [False, True])
def test_agora_roles_prints_the_roles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    monkeypatch.setattr(show, "_fetch", lambda _args: _reply())
    assert show.cmd_roles(argparse.Namespace(json=as_json)) == 0
    out = capsys.readouterr().out
    if as_json:
        assert [r["name"] for r in json.loads(out)] == ["analytics", "*"]
    else:
        assert "cpus:8;mem:8192" in _row(out, "analytics")


def test_agora_state_shows_the_cluster_and_a_roles_section(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(show, "_fetch", lambda _args: _reply())
    assert show.cmd_state(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster prod-eu  master m-1")
    assert "Roles (2)" in out and "12.5%" in _row(out, "│ analytics │      2")
    assert "25.0%" in _row(out, "spark")  # the framework's share
    monkeypatch.setattr(show, "_fetch", lambda _args: StateReply(master_info=_reply().master_info))
    show.cmd_state(argparse.Namespace(json=False))
    bare = capsys.readouterr().out
    assert bare.startswith("master m-1") and "Roles" not in bare


def test_agora_state_says_when_the_master_runs_without_curve(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        show, "_fetch", lambda _args: msgspec.structs.replace(_reply(), insecure=True)
    )
    assert show.cmd_state(argparse.Namespace(json=False)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("cluster prod-eu  master m-1") and "INSECURE (no CURVE)" in first
    assert show.cmd_state(argparse.Namespace(json=True)) == 0
    assert json.loads(capsys.readouterr().out)["insecure"] is True
    monkeypatch.setattr(show, "_fetch", lambda _args: _reply())
    show.cmd_state(argparse.Namespace(json=False))
    assert "INSECURE" not in capsys.readouterr().out


def test_agora_state_json_counts_the_agents_and_sums_the_resources_it_lists(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A full GET_STATE reply leaves the whole-cluster counts at 0 (its rows are the cluster);
    # the JSON used to show "agents_total": 0 beside three agents.
    reply = msgspec.structs.replace(
        _reply(),
        agents=(
            *_reply().agents,
            msgspec.structs.replace(_agent(4), allocated=Resources.parse("cpus:1.5;mem:512")),
        ),
    )
    monkeypatch.setattr(show, "_fetch", lambda _args: reply)
    assert show.cmd_state(argparse.Namespace(json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["agents"]) == doc["agents_total"] == 4
    assert doc["agents_unreachable"] == 1 and doc["agents_draining"] == 1
    assert doc["tasks_total"] == 0 and doc["partial"] is False
    assert doc["resources_total"] == show.to_json(Resources.parse("cpus:16;mem:16384"))
    assert doc["resources_allocated"] == show.to_json(Resources.parse("cpus:1.5;mem:512"))


def test_a_partial_reply_keeps_the_counts_the_master_gave() -> None:
    partial = msgspec.structs.replace(_reply(), partial=True, agents_total=10_000, tasks_total=7)
    assert show.with_totals(partial) is partial
    assert show.state_json(partial)["agents_total"] == 10_000


def test_the_agents_table_shows_where_each_agents_http_api_is() -> None:
    with_api = msgspec.structs.replace(_agent(1), address="10.0.0.7", http_port=5051)
    v6 = msgspec.structs.replace(_agent(2), address="fd00::7", http_port=5051)
    out = _text(agents_table([with_api, v6, _agent(3)]))
    assert "10.0.0.7:5051" in _row(out, "agent-1") and "[fd00::7]:5051" in _row(out, "agent-2")
    assert show.http_api(_agent(3)) == "-"
