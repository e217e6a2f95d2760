"""Operator calls from the `agora` CLI against a real `agora local` cluster of two agents: drain
and reactivate, weights, quota, teardown, and (on a cluster of its own) marking an agent gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from test_cli import Local, _kill_everything, cluster_pids, start_local


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-operate"), agents=2)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def json_of(local: Local, *args: str) -> Any:
    out = local.agora(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def agents(local: Local) -> dict[str, dict[str, Any]]:
    return {a["agent_id"]: a for a in json_of(local, "agents")}


def role(local: Local, name: str) -> dict[str, Any] | None:
    return next((r for r in json_of(local, "roles") if r["name"] == name), None)


def running(local: Local, task_id: str) -> dict[str, Any] | None:
    task = local.task(task_id)
    return task if task is not None and task["state"] == "RUNNING" else None


def ended(local: Local, task_id: str) -> dict[str, Any] | None:
    task = local.task(task_id)
    return (
        task
        if task is not None and task["state"] not in ("STAGING", "STARTING", "RUNNING", "KILLING")
        else None
    )


def reap(*procs: subprocess.Popen[str]) -> None:
    """End `agora run`s: SIGTERM kills the task and exits; SIGKILL what overstays."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)


# ------------------------------------------------------------------ one shared cluster


def test_drain_moves_new_tasks_away_and_keeps_running_ones(local: Local) -> None:
    sleeper = local.spawn("run", "--task-id", "op-sleeper", "--", "sleep", "60")
    hog: subprocess.Popen[str] | None = None
    try:
        drained = wait_for(lambda: running(local, "op-sleeper"), 30, "op-sleeper RUNNING")[
            "agent_id"
        ]
        other = next(a for a in agents(local) if a != drained)

        out = local.agora("drain", drained)
        assert (out.returncode, out.stdout) == (0, f"agent {drained} is draining\n"), out.stderr
        listed = agents(local)
        assert listed[drained]["draining"] is True and listed[drained]["status"] == "ACTIVE"
        assert listed[other]["draining"] is False

        # New tasks land on the other agent only...
        for i in range(2):
            done = local.agora("run", "--task-id", f"op-after-drain-{i}", "--", "true")
            assert done.returncode == 0, done.stderr
        placed = {t["task_id"]: t["agent_id"] for t in local.tasks()}
        assert [placed[f"op-after-drain-{i}"] for i in range(2)] == [other] * 2
        # ...and with the other agent full, none is placed at all: the drained one offers nothing.
        hog = local.spawn("run", "--task-id", "op-hog", "--cpus", "4", "--", "sleep", "60")
        assert wait_for(lambda: running(local, "op-hog"), 30, "op-hog RUNNING")["agent_id"] == other
        refused = local.agora("run", "--timeout", "2", "--", "true")
        assert refused.returncode == 1 and "no offer" in refused.stderr, refused.stderr
        # The task already on the drained agent runs on.
        assert running(local, "op-sleeper") is not None

        out = local.agora("reactivate", drained)
        assert (out.returncode, out.stdout) == (0, f"agent {drained} is active\n"), out.stderr
        assert agents(local)[drained]["draining"] is False
        again = local.agora("run", "--task-id", "op-after-reactivate", "--", "true")
        assert again.returncode == 0, again.stderr
        # The other agent is full, so the task ran on the reactivated one.
        placed = {t["task_id"]: t["agent_id"] for t in local.tasks()}
        assert placed["op-after-reactivate"] == drained
    finally:
        reap(sleeper, *([hog] if hog else []))


def test_weights_show_in_roles(local: Local) -> None:
    out = local.agora("weights", "batch=3")
    assert (out.returncode, out.stdout) == (0, "weights set: batch=3\n"), out.stderr
    batch = role(local, "batch")
    assert batch is not None and batch["weight"] == 3


def test_quota_set_then_removed(local: Local) -> None:
    out = local.agora("quota", "batch", "--guarantee", "cpus:1", "--limit", "cpus:2")
    assert (out.returncode, out.stdout) == (0, "quota of batch set\n"), out.stderr
    batch = role(local, "batch")
    assert batch is not None
    assert (batch["guarantee"], batch["limit"]) == ({"cpus": 1}, {"cpus": 2})

    out = local.agora("quota", "batch", "--remove")
    assert (out.returncode, out.stdout) == (0, "quota of batch removed\n"), out.stderr
    batch = role(local, "batch")
    assert batch is None or (batch["guarantee"], batch["limit"]) in ((None, None), ({}, None))


def test_teardown_kills_the_frameworks_task(local: Local) -> None:
    run = local.spawn("run", "--task-id", "op-torn", "--", "sleep", "60")
    try:
        framework = wait_for(lambda: running(local, "op-torn"), 30, "op-torn RUNNING")[
            "framework_id"
        ]
        refused = local.agora("teardown", framework)
        assert refused.returncode == 2 and "--yes" in refused.stderr
        assert running(local, "op-torn") is not None

        out = local.agora("teardown", framework, "--yes")
        assert (out.returncode, out.stdout) == (
            0,
            f"framework {framework} was torn down\n",
        ), out.stderr
        task = wait_for(lambda: ended(local, "op-torn"), 15, "op-torn to end")
        assert (task["state"], task["reason"]) == ("KILLED", "FRAMEWORK_REMOVED")
        # Its scheduler was told: `agora run` ends on its own, with the master's reason.
        _, err = run.communicate(timeout=30)
        assert run.returncode == 1 and "torn down by an operator" in err, err
        state = json_of(local, "state")
        assert all(f["framework_id"] != framework or not f["active"] for f in state["frameworks"])
    finally:
        reap(run)


@pytest.mark.parametrize("command", ["drain", "reactivate"])
def test_an_unknown_agent_is_the_masters_message_and_exit_1(local: Local, command: str) -> None:
    out = local.agora(command, "no-such-agent")
    assert out.returncode == 1
    assert out.stderr == (
        f"agora {command}: the master refused: {command.upper()}_AGENT: no agent no-such-agent "
        "in the cluster (UNKNOWN_AGENT)\n"
    )


def test_an_unknown_framework_is_the_masters_message_and_exit_1(local: Local) -> None:
    out = local.agora("teardown", "no-such-framework", "--yes")
    assert out.returncode == 1
    assert "no framework no-such-framework" in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------ a cluster of its own


def test_gone_ends_the_agent_and_its_task(tmp_path: Path) -> None:
    """The gone agent's task ends (LOST for `agora run`, which is not partition-aware), the
    master keeps it as completed, the agent is told to stop and does, and `agora local` carries
    on with the other agent."""
    local = start_local(tmp_path, agents=2)
    run: subprocess.Popen[str] | None = None
    try:
        run = local.spawn("run", "--task-id", "op-doomed", "--", "sleep", "60")
        agent_id = wait_for(lambda: running(local, "op-doomed"), 30, "op-doomed RUNNING")[
            "agent_id"
        ]
        hostname = agents(local)[agent_id]["hostname"]
        refused = local.agora("gone", agent_id)
        assert refused.returncode == 2 and "cannot be undone" in refused.stderr
        assert running(local, "op-doomed") is not None

        out = local.agora("gone", agent_id, "--yes")
        assert (out.returncode, out.stdout) == (0, f"agent {agent_id} is gone\n"), out.stderr
        assert agent_id not in agents(local)
        _, err = run.communicate(timeout=30)
        assert run.returncode == 1, err
        assert "task op-doomed ended LOST, reason AGENT_REMOVED_BY_OPERATOR" in err, err
        task = local.task("op-doomed")
        assert task is not None
        assert (task["state"], task["reason"]) == ("LOST", "AGENT_REMOVED_BY_OPERATOR"), task
        again = local.agora("gone", agent_id, "--yes")
        assert (again.returncode, again.stdout) == (0, f"agent {agent_id} is already gone\n")
        # The agent was told to shut down: it exits 0, and the cluster carries on without it.
        wait_for(
            lambda: f"{hostname} exited with status 0" in local.stderr_path.read_text(),
            30,
            f"{hostname} to exit",
        )
        assert "the cluster carries on" in local.stderr_path.read_text()
        assert local.proc.poll() is None
        after = local.agora("run", "--", "echo", "still here")
        assert (after.returncode, after.stdout) == (0, "still here\n"), after.stderr
        local.stop(timeout=30)
        assert not cluster_pids(local.work)
    finally:
        if run is not None:
            reap(run)
        _kill_everything(local)
