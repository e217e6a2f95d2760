"""The history checker passes a clean history and fails each doctored one: proof it can fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.history_checker import Violation, check, load, main

S = 1_000_000_000
CHECKER = Path(__file__).resolve().parents[1] / "support" / "history_checker.py"


def ev(t: float, node: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": int(t * S), "node": node, "kind": kind, **fields}


def clean() -> list[dict[str, Any]]:
    """Three masters, one agent, one framework; m1 leads term 1, is killed, m2 leads term 2."""
    return [
        ev(0.0, "m1", "term", term=1),
        ev(0.0, "m2", "term", term=1),
        ev(0.0, "m3", "term", term=1),
        ev(0.5, "m1", "leader", term=1),
        ev(0.6, "m2", "heard_leader", term=1, leader="m1"),
        ev(0.6, "m3", "heard_leader", term=1, leader="m1"),
        ev(0.7, "m1", "commit", term=1, index=1, digest="d1"),
        ev(0.7, "m2", "commit", term=1, index=1, digest="d1"),
        ev(0.7, "m3", "commit", term=1, index=1, digest="d1"),
        ev(0.8, "m1", "acting", term=1, until=int(2.0 * S)),
        ev(0.8, "a1", "total", resources="cpus:1;mem:128;ports:[31000-31010]"),
        ev(0.9, "a1", "epoch", epoch=1),
        ev(1.0, "fw1", "registered", framework="F1", name="fw1", epoch=1),
        ev(1.0, "fw1", "offer", epoch=1),
        ev(
            1.1,
            "a1",
            "launch",
            task="fw1-0",
            framework="F1",
            epoch=1,
            resources="cpus:0.5;mem:64;ports:[31000-31000]",
        ),
        ev(
            1.1,
            "a1",
            "launch",
            task="fw1-1",
            framework="F1",
            epoch=1,
            resources="cpus:0.5;mem:64;ports:[31001-31001]",
        ),
        ev(1.2, "a1", "update", task="fw1-0", framework="F1", uuid="aa01", state="RUNNING"),
        ev(1.3, "fw1", "received", task="fw1-0", uuid="aa01", state="RUNNING"),
        ev(1.3, "fw1", "ack", task="fw1-0", uuid="aa01"),
        ev(1.4, "a1", "end", task="fw1-0", framework="F1", state="FINISHED"),
        ev(1.4, "a1", "update", task="fw1-0", framework="F1", uuid="aa02", state="FINISHED"),
        ev(1.5, "fw1", "received", task="fw1-0", uuid="aa02", state="FINISHED"),
        ev(1.5, "fw1", "ack", task="fw1-0", uuid="aa02"),
        ev(1.6, "nemesis", "fault", what="kill m1", fault="kill", master=0),
        ev(3.0, "m2", "term", term=2),
        ev(3.1, "m2", "leader", term=2),
        ev(3.1, "m3", "heard_leader", term=2, leader="m2"),
        ev(3.2, "m2", "commit", term=2, index=2, digest="d2"),
        ev(3.2, "m3", "commit", term=2, index=2, digest="d2"),
        ev(3.3, "m2", "acting", term=2, until=int(4.5 * S)),
        ev(3.4, "a1", "epoch", epoch=2),
        ev(3.5, "fw1", "offer", epoch=2),
        ev(
            3.6,
            "a1",
            "launch",
            task="fw1-2",
            framework="F1",
            epoch=2,
            resources="cpus:0.5;mem:64;ports:[31000-31000]",
        ),
        ev(4.0, "nemesis", "healed", what="restart m1"),
        ev(4.1, "m1", "term", term=2),
        ev(4.2, "m1", "heard_leader", term=2, leader="m2"),
        ev(4.2, "m1", "commit", term=2, index=2, digest="d2"),
        ev(4.4, "m2", "acting", term=2, until=int(5.5 * S)),
        ev(5.0, "fw1", "offer", epoch=2),
    ]


def only(found: list[Violation], invariant: str) -> Violation:
    assert [v.invariant for v in found] == [invariant], found
    return found[0]


def test_clean_history_passes() -> None:
    assert check(clean()) == []


def test_clean_history_passes_in_any_order() -> None:
    assert check(list(reversed(clean()))) == []


def test_two_leaders_in_one_term_fail_i1() -> None:
    h = [*clean(), ev(3.15, "m3", "leader", term=2)]
    v = only(check(h), "I1")
    assert "term 2" in v.message and "m2" in v.message and "m3" in v.message


def test_heard_leader_naming_another_node_fails_i1() -> None:
    h = [*clean(), ev(3.15, "m1", "heard_leader", term=1, leader="m3")]
    v = only(check(h), "I1")
    assert "term 1" in v.message and "m3" in v.message


def test_overlapping_leases_fail_i2_with_the_overlap() -> None:
    h = [e for e in clean() if not (e["kind"] == "acting" and e["term"] == 1)]
    h.append(ev(0.8, "m1", "acting", term=1, until=int(3.55 * S)))
    v = only(check(h), "I2")
    assert "m1" in v.message and "m2" in v.message and "250.0 ms" in v.message


def test_deposed_leader_acting_late_fails_i2() -> None:
    h = [*clean(), ev(3.4, "m1", "acting", term=1, until=int(3.9 * S))]
    v = only(check(h), "I2")
    assert "term 1" in v.message and "term 2" in v.message


def test_launch_with_an_old_epoch_fails_i3() -> None:
    h = [
        *clean(),
        ev(3.7, "a1", "launch", task="fw1-9", framework="F1", epoch=1, resources=""),
    ]
    v = only(check(h), "I3")
    assert "a1" in v.message and "fw1-9" in v.message and "epoch 1" in v.message


def test_offers_from_an_older_epoch_fail_i3() -> None:
    h = [*clean(), ev(5.1, "fw1", "offer", epoch=1)]
    v = only(check(h), "I3")
    assert "fw1" in v.message and "epoch 2" in v.message


def test_duplicate_launch_fails_i4() -> None:
    h = [
        *clean(),
        ev(3.7, "a2", "launch", task="fw1-0", framework="F1", epoch=2, resources="cpus:0.1"),
    ]
    v = only(check(h), "I4")
    assert "fw1-0" in v.message and "a1" in v.message and "a2" in v.message


def test_overcommitted_cpus_fail_i4() -> None:
    h = [
        *clean(),
        ev(3.7, "a1", "launch", task="fw1-3", framework="F1", epoch=2, resources="cpus:0.25"),
    ]
    v = only(check(h), "I4")
    assert "overcommitted cpus" in v.message and "1.25 used of 1" in v.message
    assert "fw1-3" in v.message


def test_overlapping_ports_fail_i4() -> None:
    h = [
        *clean(),
        ev(
            1.15,
            "a1",
            "launch",
            task="fw1-5",
            framework="F2",
            epoch=1,
            resources="ports:[30990-31000]",
        ),
        ev(1.2, "a1", "end", task="fw1-5", framework="F2", state="FAILED"),
    ]
    v = only(check(h), "I4")
    assert "[31000-31000]" in v.message and "fw1-0" in v.message and "fw1-5" in v.message


def test_port_reused_after_the_task_ended_passes() -> None:
    h = [
        *clean(),
        ev(
            1.45,
            "a1",
            "launch",
            task="fw1-6",
            framework="F1",
            epoch=1,
            resources="ports:[31000-31000]",
        ),
    ]
    # fw1-2 later takes 31000 again while fw1-6 still holds it: exactly one clash, at fw1-2
    v = only(check(h), "I4")
    assert "fw1-2" in v.message and "fw1-6" in v.message


def test_update_never_acked_fails_i5() -> None:
    h = [e for e in clean() if not (e["kind"] == "ack" and e["uuid"] == "aa02")]
    v = only(check(h), "I5")
    assert "aa02" in v.message and "fw1-0" in v.message and "no ack" in v.message


def test_update_never_received_fails_i5() -> None:
    h = [
        *clean(),
        ev(3.8, "a1", "update", task="fw1-2", framework="F1", uuid="bb", state="RUNNING"),
    ]
    v = only(check(h), "I5")
    assert "no received and no ack" in v.message and "a1" in v.message


def test_a_framework_that_keeps_no_history_is_not_checked_for_i5() -> None:
    h = [*clean(), ev(3.8, "a1", "update", task="run-1", framework="F9", uuid="c", state="RUNNING")]
    assert check(h) == [], "F9 (agora run) never wrote a registered event"


def test_torn_down_framework_is_exempt_from_i5() -> None:
    h = [*clean(), ev(3.8, "a1", "update", task="fw1-2", framework="F1", uuid="bb", state="KILLED")]
    assert check([*h, ev(3.7, "fw1", "teardown", framework="F1")]) == []
    assert check([*h, ev(3.7, "fw1", "teardown", framework="fw1")]) == []  # by name
    assert only(check([*h, ev(3.7, "fw2", "teardown", framework="F2")]), "I5")


def test_a_kill_never_answered_fails_k1() -> None:
    h = [*clean(), ev(3.7, "fw1", "kill", task="fw1-2")]
    v = only(check(h), "K1")
    assert "fw1-2" in v.message and "never heard it end" in v.message


def test_a_kill_answered_by_a_terminal_update_passes_k1() -> None:
    h = [
        *clean(),
        ev(3.7, "fw1", "kill", task="fw1-2"),
        ev(3.8, "fw1", "kill", task="fw1-2"),  # sent again: still one kill to answer
        ev(3.9, "fw1", "received", task="fw1-2", uuid=None, state="KILLING"),
    ]
    assert only(check(h), "K1"), "a non-terminal state does not answer a kill"
    assert check([*h, ev(4.0, "fw1", "received", task="fw1-2", uuid=None, state="KILLED")]) == []


def test_a_torn_down_framework_is_exempt_from_k1() -> None:
    h = [*clean(), ev(3.7, "fw1", "kill", task="fw1-2"), ev(3.8, "fw1", "teardown", framework="F1")]
    assert check(h) == []


def test_different_digest_at_one_index_fails_i6() -> None:
    h = [*clean(), ev(0.75, "m3", "commit", term=1, index=1, digest="evil")]
    v = only(check(h), "I6")
    assert "index 1" in v.message and "evil" in v.message and "m3" in v.message


def test_committed_entry_lost_by_the_next_leader_fails_i6() -> None:
    h = [*clean(), ev(1.0, "m1", "commit", term=1, index=3, digest="d3")]
    v = only(check(h), "I6")
    assert "index 3" in v.message and "m2" in v.message and "term 2" in v.message


def test_snapshot_covers_the_entries_it_replaced() -> None:
    h = [*clean(), ev(1.0, "m1", "commit", term=1, index=3, digest="d3")]
    assert check([*h, ev(3.05, "m2", "snapshot", term=1, index=3)]) == []
    assert only(check([*h, ev(3.05, "m2", "snapshot", term=1, index=2)]), "I6")


def test_decreasing_term_after_restart_fails_i7() -> None:
    h = [*clean(), ev(4.5, "m2", "term", term=1)]
    v = only(check(h), "I7")
    assert "m2" in v.message and "from 2" in v.message and "to 1" in v.message


def test_no_leader_after_heal_fails_i8() -> None:
    h = [*clean(), ev(4.5, "m2", "stepped_down", term=2), ev(6.0, "nemesis", "healed", what="x")]
    found = check(h, liveness_s=3.0)
    assert {v.invariant for v in found} == {"I8"}
    assert any("no leader" in v.message for v in found)
    assert any("no framework got an offer" in v.message for v in found)
    assert check(h, liveness_s=3.0, require_liveness=False) == []


def test_new_leader_and_offer_after_heal_pass_i8() -> None:
    h = [
        *clean(),
        ev(4.5, "m2", "stepped_down", term=2),
        ev(6.0, "nemesis", "healed", what="x"),
        ev(6.2, "m3", "term", term=3),
        ev(6.5, "m3", "leader", term=3),
        ev(6.6, "m3", "commit", term=3, index=3, digest="d3"),
        ev(7.0, "fw1", "offer", epoch=3),
    ]
    assert check(h, liveness_s=3.0) == []
    v = only(check(h, liveness_s=0.8), "I8")  # the offer came 1 s after the heal
    assert "offer" in v.message and "m3" in v.message


def write(path: Path, events: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + tail)
    return path


def test_load_merges_files_in_time_order(tmp_path: Path) -> None:
    h = clean()
    a = write(tmp_path / "a.jsonl", h[1::2])
    b = write(tmp_path / "b.jsonl", h[0::2], tail='{"t": 99, "no')  # torn last line: skipped
    events = load([a, b])
    assert [e["t"] for e in events] == sorted(e["t"] for e in h)
    assert len(events) == len(h)


def test_load_names_the_bad_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.jsonl", clean()[:3], tail='{"t": 1, "node": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:4"):
        load([bad])
    garbage = write(tmp_path / "g.jsonl", clean()[:2], tail="not json\n{}\n")
    with pytest.raises(ValueError, match=r"g\.jsonl:3: not JSON"):
        load([garbage])


def test_cli_reports_json_and_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.jsonl", clean())
    assert main([str(good)]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    bad = write(tmp_path / "dup.jsonl", [*clean(), ev(3.15, "m3", "leader", term=2)])
    assert main([str(bad), "--liveness", "5"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["violations_by_invariant"] == {"I1": 1}
    assert report["violations"][0]["invariant"] == "I1"


def test_cli_runs_as_a_script(tmp_path: Path) -> None:
    bad = write(tmp_path / "h.jsonl", [*clean(), ev(4.5, "m2", "term", term=1)])
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(bad)], capture_output=True, text=True, timeout=15
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["violations_by_invariant"] == {"I7": 1}
