"""The agent's fault-suite history across a restart: a task launched before it (its launch in
the previous run's history) still gets its ``end`` when it finishes after it, else the checker
would take its ports and cpus for held forever."""

from __future__ import annotations

import json
from pathlib import Path

from agora.agent.core.state import Task
from agora.agent.server.history import AgentHistory
from agora.sdk.daemon.history import History
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import TaskInfo, TaskState
from agora.sdk.resources import Resources

FID = FrameworkID("F1")


def _task(name: str, state: TaskState) -> Task:
    resources = Resources.parse("cpus:1;ports:[31000-31000]")
    info = TaskInfo(task_id=TaskID(name), name=name, agent_id=AgentID("A1"), resources=resources)
    return Task(FID, info, ExecutorID("agora-command"), "*", state=state)


def _ends(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(e["task"], e["state"]) for e in map(json.loads, lines) if e["kind"] == "end"]


def _after_restart(path: Path, *, recovered: bool) -> list[tuple[str, str]]:
    history = History(path, "agent-1")
    agent = AgentHistory(history, Resources.parse("cpus:4"))
    running, done = _task("t1", TaskState.RUNNING), _task("t2", TaskState.FINISHED)
    tasks = {running.key: running, done.key: done}
    if recovered:
        agent.recovered(tasks)
    agent.settled(tasks)  # right after the recovery
    running.state = TaskState.FINISHED  # its executor, re-adopted, reports the end
    agent.settled(tasks)
    history.close()
    return _ends(path)


def test_a_task_recovered_from_the_checkpoint_gets_its_end_recorded(tmp_path: Path) -> None:
    ends = _after_restart(tmp_path / "h.jsonl", recovered=True)
    # t2 had ended before the restart: its end again is harmless (the checker pops it).
    assert ends == [("t2", "FINISHED"), ("t1", "FINISHED")]


def test_without_recovered_the_end_is_lost(tmp_path: Path) -> None:
    assert _after_restart(tmp_path / "h.jsonl", recovered=False) == []
