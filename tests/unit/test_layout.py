"""The source tree's shape: folders import each other one way only, no module grows past 600
lines, and ``agora.sdk``'s public surface carries none of the daemons' helpers.

Folders are the unit of layering (``sdk/messages``, ``master/core``, ...). A package's
``__init__.py`` that only re-exports (the lazy ``agora.sdk`` facade) sits above everything it
names, so it counts as a node of its own, ``<folder>:facade``; every other module belongs to its
folder. An edge A -> B means some module in A imports one in B.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("sdk", "master", "agent", "frameworks")
FACADES = {Path("sdk/__init__.py")}
MAX_LINES = 600


def sources() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for top in TOPS
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    )


def node_of_file(rel: Path) -> str:
    folder = ".".join(rel.parts[:-1])
    return f"{folder}:facade" if rel in FACADES else folder


def folder_of_module(name: str) -> str | None:
    """``agora.sdk.messages.enums`` -> ``sdk.messages``; ``agora.sdk.ids`` -> ``sdk``."""
    parts = name.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ROOT.joinpath(*parts[:end]).is_dir():
            return ".".join(parts[:end])
    return None


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agora."):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("agora."))
    return names


def folder_graph() -> dict[str, dict[str, set[str]]]:
    """node -> node it imports -> the files that do."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for rel in sources():
        here = node_of_file(rel)
        for name in imported(ast.parse((ROOT / rel).read_text())):
            there = folder_of_module(name)
            if there is not None and there != here.removesuffix(":facade"):
                graph[here][there].add(str(rel))
    return graph


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """One cycle as the list of its nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_folders_import_each_other_one_way_only() -> None:
    graph = folder_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        hops = [f"{a} -> {b} in {sorted(graph[a][b])[:3]}" for a, b in pairwise(cycle)]
        raise AssertionError("folder cycle:\n  " + "\n  ".join(hops))


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b": {"x.py"}}, "b": {"c": {"y.py"}}, "c": {"a": {"z.py"}}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) is None


def test_no_source_module_is_over_600_lines() -> None:
    long = {
        str(rel): n
        for rel in sources()
        if (n := len((ROOT / rel).read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_sdk_root_is_the_foundation_everything_else_builds_on() -> None:
    """``sdk/``'s own modules (ids, resources, errors, discovery, logs, ...) import nothing above
    them; protocol, codec, transport, drivers and the operator client are folders."""
    graph = folder_graph()
    assert dict(graph.get("sdk", {})) == {}


def test_daemon_helpers_are_not_loaded_by_the_public_sdk() -> None:
    graph = folder_graph()
    public = ("sdk.messages", "sdk.codec", "sdk.transport", "sdk.scheduler", "sdk.executor")
    for node in public:
        assert "sdk.daemon" not in graph.get(node, {}), node


def test_the_agent_shells_read_the_core_through_its_read_functions() -> None:
    """agent/server never reaches into the core's state (``core.state``, ``AgentState``)."""
    pattern = re.compile(r"core(\(\))?\.state\b(?! import)|\bAgentState\b")
    offenders = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted((ROOT / "agent" / "server").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
