"""The fault suite's checker: reads the JSONL histories Agora processes write
(schema in :mod:`agora.sdk.daemon.history`) and reports every breach of the HA invariants I1-I8
(one check function each, below).

Pure except :func:`load`. Times in messages are seconds since the history's first event
(``t+1.234s``), followed by the raw monotonic ns where a person may want to grep for it.

Extra kinds read here, written by the fault suite itself:

* ``registered`` (workload): ``framework`` (id), ``name``, ``epoch`` — maps a framework's name
  to its id, so a ``teardown`` may name either.
* ``teardown`` (workload): ``framework`` — the framework was deliberately torn down; updates of
  its tasks need not reach it (I5).
* ``fault`` / ``healed`` (nemesis): ``what`` and details; I8 measures from the last ``healed``.
* ``kill`` (workload): ``task`` — the framework asked to kill the task; K1 wants a terminal
  ``received`` update for it afterwards (a kill is never left unanswered).
* ``snapshot`` (master): ``index`` — it installed a registry snapshot covering every index up to
  this one without a ``commit`` for each (I6 counts them as committed on that node).

CLI: ``python tests/support/history_checker.py FILE... [--liveness S] [--no-liveness]`` prints a
JSON report and exits 1 on any violation (2 when a file cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agora.sdk.messages import TaskState, is_terminal
from agora.sdk.resources import Resources

__all__ = ["Violation", "check", "load", "main"]

NS = 1_000_000_000
Event = dict[str, Any]


@dataclass(frozen=True)
class Violation:
    invariant: str  # "I1".."I8", "K1"
    message: str


def load(paths: Iterable[Path]) -> list[Event]:
    """Every event of every file, sorted by ``t`` (stable). A line that is not a JSON object with
    ``t``, ``node`` and ``kind`` raises ValueError naming ``file:line``; only a torn last line
    without its newline (a writer killed mid-write) is skipped."""
    events: list[Event] = []
    for path in paths:
        text = Path(path).read_text(encoding="utf-8")
        lines = text.split("\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            last_unterminated = number == len(lines)
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                if last_unterminated:
                    continue
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if (
                not isinstance(event, dict)
                or not isinstance(event.get("t"), int)
                or not isinstance(event.get("node"), str)
                or not isinstance(event.get("kind"), str)
            ):
                raise ValueError(f"{path}:{number}: not an event (needs int t, node and kind)")
            events.append(event)
    events.sort(key=lambda e: int(e["t"]))
    return events


class _Clock:
    """Formats monotonic ns relative to the history's first event."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.origin = min((int(e["t"]) for e in events), default=0)

    def __call__(self, t: int) -> str:
        return f"t+{(t - self.origin) / NS:.3f}s"


def check(
    events: Sequence[Event], *, liveness_s: float = 8.0, require_liveness: bool = True
) -> list[Violation]:
    """Every violation of I1-I8 in ``events`` (any order; sorted by ``t`` here)."""
    ordered = sorted(events, key=lambda e: int(e["t"]))
    at = _Clock(ordered)
    found: list[Violation] = []
    found += _one_leader_per_term(ordered, at)
    found += _lease(ordered, at)
    found += _epoch_fencing(ordered, at)
    found += _launches(ordered, at)
    found += _updates_acked(ordered, at)
    found += _registry(ordered, at)
    found += _terms_monotonic(ordered, at)
    found += _kills_answered(ordered, at)
    if require_liveness:
        found += _liveness(ordered, at, liveness_s)
    return found


def _by_kind(events: Sequence[Event], *kinds: str) -> list[Event]:
    return [e for e in events if e["kind"] in kinds]


# --------------------------------------------------------------------------- safety: masters


def _one_leader_per_term(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I1: ``leader`` and ``heard_leader`` events name at most one node per term."""
    claims: dict[int, dict[str, Event]] = defaultdict(dict)
    for e in _by_kind(events, "leader", "heard_leader"):
        if e["kind"] == "heard_leader" and e.get("leader") is None:
            continue  # names no one
        name = str(e["node"] if e["kind"] == "leader" else e["leader"])
        claims[int(e["term"])].setdefault(name, e)
    out = []
    for term, named in sorted(claims.items()):
        if len(named) > 1:
            how = "; ".join(
                f"{name} ({e['kind']} by {e['node']} at {at(e['t'])})" for name, e in named.items()
            )
            out.append(Violation("I1", f"term {term} has {len(named)} leaders: {how}"))
    return out


def _lease(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I2: every ``until`` of a term ends before the first ``acting`` of any higher term."""
    first: dict[int, Event] = {}
    latest: dict[int, Event] = {}
    for e in _by_kind(events, "acting"):
        term = int(e["term"])
        first.setdefault(term, e)
        if term not in latest or int(e["until"]) > int(latest[term]["until"]):
            latest[term] = e
    out = []
    terms = sorted(first)
    for i, t2 in enumerate(terms):
        start = first[t2]
        for t1 in terms[:i]:
            old = latest[t1]
            overlap = int(old["until"]) - int(start["t"])
            if overlap > 0:
                out.append(
                    Violation(
                        "I2",
                        f"lease of {old['node']} in term {t1} (acting at {at(old['t'])}, until "
                        f"{at(old['until'])}) overlaps {start['node']} acting in term {t2} at "
                        f"{at(start['t'])} by {overlap / 1e6:.1f} ms",
                    )
                )
    return out


def _terms_monotonic(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I7: the ``term`` events of one node never decrease, restarts included."""
    high: dict[str, Event] = {}
    out = []
    for e in _by_kind(events, "term"):
        node, term = e["node"], int(e["term"])
        before = high.get(node)
        if before is not None and term < int(before["term"]):
            out.append(
                Violation(
                    "I7",
                    f"{node}'s term fell from {before['term']} (at {at(before['t'])}) to {term} "
                    f"(at {at(e['t'])})",
                )
            )
        elif before is None or term > int(before["term"]):
            high[node] = e
    return out


def _registry(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I6: one digest per committed index on every node; a leader that commits anything commits
    (at some time) every index committed anywhere before it became leader, with that digest.
    A ``snapshot`` event (``index``) stands for every index up to it on that node."""
    out = []
    first: dict[int, Event] = {}
    by_node: dict[str, dict[int, Event]] = defaultdict(dict)
    reported: set[tuple[int, str]] = set()
    for e in _by_kind(events, "commit"):
        index, digest = int(e["index"]), str(e["digest"])
        seen = first.setdefault(index, e)
        if str(seen["digest"]) != digest and (index, e["node"]) not in reported:
            reported.add((index, e["node"]))
            out.append(
                Violation(
                    "I6",
                    f"index {index} committed as {seen['digest']} by {seen['node']} at "
                    f"{at(seen['t'])} but as {digest} by {e['node']} at {at(e['t'])}",
                )
            )
        by_node[e["node"]].setdefault(index, e)
    snapshot: dict[str, int] = {}
    for e in _by_kind(events, "snapshot"):
        snapshot[e["node"]] = max(snapshot.get(e["node"], -1), int(e["index"]))
    for lead in _by_kind(events, "leader"):
        node, t0 = lead["node"], int(lead["t"])
        own = by_node.get(node, {})
        if not any(int(c["t"]) > t0 for c in own.values()):
            continue  # it never committed as leader: nothing it could have lost yet
        for index, c in sorted(first.items()):
            if int(c["t"]) >= t0:
                continue
            if index not in own and index > snapshot.get(node, -1):
                out.append(
                    Violation(
                        "I6",
                        f"index {index} ({c['digest']}) committed by {c['node']} at {at(c['t'])} "
                        f"is missing from {node}, leader of term {lead['term']} since {at(t0)}",
                    )
                )
    return out


# --------------------------------------------------------------------------- safety: agents


def _epoch_fencing(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I3: an agent launches only at an epoch >= the highest it recorded before; a framework's
    offers never come from an epoch lower than one it already got offers from."""
    high: dict[tuple[str, str], Event] = {}
    out = []
    for e in _by_kind(events, "epoch", "launch", "offer"):
        node, epoch = e["node"], int(e["epoch"])
        key = (node, "offer" if e["kind"] == "offer" else "agent")
        before = high.get(key)
        if e["kind"] != "epoch" and before is not None and epoch < int(before["epoch"]):
            act = f"launched {e.get('task')}" if e["kind"] == "launch" else "got offers"
            out.append(
                Violation(
                    "I3",
                    f"{node} {act} at epoch {epoch} at {at(e['t'])} after seeing epoch "
                    f"{before['epoch']} at {at(before['t'])}",
                )
            )
        if e["kind"] != "launch" and (before is None or epoch > int(before["epoch"])):
            high[key] = e
    return out


def _launches(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I4: no (framework, task) launched twice; per agent, live tasks fit its ``total`` and hold
    no port twice."""
    out = []
    launched: dict[tuple[str, str], Event] = {}
    totals: dict[str, Resources] = {}
    live: dict[str, dict[tuple[str, str], Resources]] = defaultdict(dict)
    over: set[tuple[str, str]] = set()  # (agent, resource) overcommitted: reported once a spell
    for e in _by_kind(events, "total", "launch", "end"):
        node = e["node"]
        if e["kind"] == "total":
            totals[node] = Resources.parse(str(e["resources"]))
            continue
        key = (str(e.get("framework")), str(e["task"]))
        if e["kind"] == "end":
            live[node].pop(key, None)
            continue
        first = launched.setdefault(key, e)
        if first is not e:
            out.append(
                Violation(
                    "I4",
                    f"task {key[1]} of {key[0]} launched twice: on {first['node']} at "
                    f"{at(first['t'])} (epoch {first.get('epoch')}) and on {node} at "
                    f"{at(e['t'])} (epoch {e.get('epoch')})",
                )
            )
        res = Resources.parse(str(e.get("resources", "")))
        out += _ports_clash(node, key, res, live[node], e, at)
        live[node][key] = res
        total = totals.get(node)
        if total is None:
            continue
        found = _overcommit(node, total, live[node], e, at)
        names = {name for name, _ in found}
        out += [v for name, v in found if (node, name) not in over]
        over -= {(node, n) for n in _scalar_names(total, live[node]) - names}
        over |= {(node, n) for n in names}
    return out


def _scalar_names(total: Resources, running: dict[tuple[str, str], Resources]) -> set[str]:
    names = set(total.scalar_totals_milli())
    for res in running.values():
        names |= set(res.scalar_totals_milli())
    return names


def _ports_clash(
    node: str,
    key: tuple[str, str],
    res: Resources,
    running: dict[tuple[str, str], Resources],
    e: Event,
    at: _Clock,
) -> list[Violation]:
    out: list[Violation] = []
    mine = res.ranges("ports")
    if not mine:
        return out
    for other, held in running.items():
        if other == key:
            continue
        for lo, hi in mine:
            for olo, ohi in held.ranges("ports"):
                if lo <= ohi and olo <= hi:
                    out.append(
                        Violation(
                            "I4",
                            f"on {node} task {key[1]} of {key[0]} launched at {at(e['t'])} holds "
                            f"ports [{max(lo, olo)}-{min(hi, ohi)}] already held by live task "
                            f"{other[1]} of {other[0]}",
                        )
                    )
    return out


def _overcommit(
    node: str,
    total: Resources,
    running: dict[tuple[str, str], Resources],
    e: Event,
    at: _Clock,
) -> list[tuple[str, Violation]]:
    used: dict[str, int] = defaultdict(int)
    for res in running.values():
        for name, milli in res.scalar_totals_milli().items():
            used[name] += milli
    have = total.scalar_totals_milli()
    out = []
    for name, milli in sorted(used.items()):
        if milli > have.get(name, 0):
            tasks = ", ".join(sorted(t for _, t in running))
            out.append(
                (
                    name,
                    Violation(
                        "I4",
                        f"{node} overcommitted {name} at {at(e['t'])} launching {e['task']}: "
                        f"{milli / 1000:g} used of {have.get(name, 0) / 1000:g} by live tasks "
                        f"{tasks}",
                    ),
                )
            )
    return out


def _updates_acked(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """I5: every ``update`` uuid was ``received`` and ``ack``ed, unless its framework was torn
    down deliberately (``teardown``, by framework id or name). Only frameworks that keep a
    history (a ``registered`` event) can be checked: `agora run` beside the workloads keeps none."""
    received = {str(e["uuid"]) for e in _by_kind(events, "received") if e.get("uuid")}
    acked = {str(e["uuid"]) for e in _by_kind(events, "ack") if e.get("uuid")}
    observed = {str(e["framework"]) for e in _by_kind(events, "registered")}
    torn = _torn_down(events)
    out = []
    seen: set[str] = set()
    for e in _by_kind(events, "update"):
        uuid, fw = str(e["uuid"]), str(e.get("framework"))
        if uuid in seen or fw in torn or fw not in observed:
            continue
        seen.add(uuid)
        missing = [
            what for what, got in (("received", received), ("ack", acked)) if uuid not in got
        ]
        if missing:
            out.append(
                Violation(
                    "I5",
                    f"update {uuid} ({e.get('state')}) of task {e.get('task')} of {fw} written by "
                    f"{e['node']} at {at(e['t'])} has no {' and no '.join(missing)}",
                )
            )
    return out


def _torn_down(events: Sequence[Event]) -> set[str]:
    """Framework ids and names recorded as deliberately torn down (``teardown``, which may name
    either): both the ids and the names of each such framework."""
    aliases: dict[str, set[str]] = defaultdict(set)
    for e in _by_kind(events, "registered"):
        name, fid = str(e.get("name", e["node"])), str(e["framework"])
        aliases[name].add(fid)
        aliases[fid].add(name)
    torn: set[str] = set()
    for e in _by_kind(events, "teardown"):
        fw = str(e["framework"])
        torn |= {fw} | aliases.get(fw, set())
    return torn


def _kills_answered(events: Sequence[Event], at: _Clock) -> list[Violation]:
    """K1: every task a framework asked to ``kill`` is later ``received`` by that framework in a
    terminal state, unless the framework was torn down deliberately."""
    torn = _torn_down(events)
    first_kill: dict[tuple[str, str], Event] = {}
    for e in _by_kind(events, "kill"):
        first_kill.setdefault((str(e["node"]), str(e["task"])), e)
    ended: set[tuple[str, str]] = set()
    for e in _by_kind(events, "received"):
        try:
            terminal = is_terminal(TaskState(e.get("state")))
        except ValueError:
            continue
        if terminal:
            ended.add((str(e["node"]), str(e["task"])))
    out = []
    for (node, task), kill in first_kill.items():
        if node not in torn and (node, task) not in ended:
            out.append(
                Violation(
                    "K1",
                    f"{node} killed task {task} at {at(kill['t'])} and never heard it end",
                )
            )
    return out


# --------------------------------------------------------------------------- liveness


def _leader_at(events: Sequence[Event], t: int) -> Event | None:
    """The leader event still in force at ``t``: the highest-term leader before ``t`` whose node
    wrote no ``stepped_down``/``term`` after it (a restart writes ``term``) and no higher term."""
    best: Event | None = None
    for e in events:
        if int(e["t"]) > t:
            break
        if e["kind"] == "leader" and (best is None or int(e["term"]) >= int(best["term"])):
            best = e
        elif (
            best is not None and e["node"] == best["node"] and e["kind"] in ("stepped_down", "term")
        ):
            best = None
    return best


def _liveness(events: Sequence[Event], at: _Clock, liveness_s: float) -> list[Violation]:
    """I8: after the last ``healed``, a leader exists and a framework records an ``offer`` within
    ``liveness_s`` (not checked when the history has no ``healed``)."""
    healed = _by_kind(events, "healed")
    if not healed:
        return []
    t0 = int(healed[-1]["t"])
    t1 = t0 + int(liveness_s * NS)
    leader = _leader_at(events, t0)
    if leader is None:
        leader = next((e for e in _by_kind(events, "leader") if t0 <= int(e["t"]) <= t1), None)
    offer = next((e for e in _by_kind(events, "offer") if t0 <= int(e["t"]) <= t1), None)
    out = []
    if leader is None:
        out.append(
            Violation("I8", f"no leader within {liveness_s:g} s of the last heal at {at(t0)}")
        )
    if offer is None:
        out.append(
            Violation(
                "I8",
                f"no framework got an offer within {liveness_s:g} s of the last heal at {at(t0)}"
                + (f" (leader: {leader['node']}, term {leader['term']})" if leader else ""),
            )
        )
    return out


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check Agora histories against I1-I8.")
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--liveness", type=float, default=8.0, metavar="S")
    parser.add_argument("--no-liveness", action="store_true", help="skip I8")
    args = parser.parse_args(argv)
    try:
        events = load(args.files)
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}), file=sys.stderr)
        return 2
    found = check(events, liveness_s=args.liveness, require_liveness=not args.no_liveness)
    counts: dict[str, int] = defaultdict(int)
    for v in found:
        counts[v.invariant] += 1
    kinds: dict[str, int] = defaultdict(int)
    for e in events:
        kinds[e["kind"]] += 1
    report = {
        "ok": not found,
        "files": [str(p) for p in args.files],
        "events": len(events),
        "kinds": dict(sorted(kinds.items())),
        "violations_by_invariant": dict(sorted(counts.items())),
        "violations": [asdict(v) for v in found],
    }
    print(json.dumps(report, indent=2))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
