"""`agora local --masters 3`: the leader is SIGKILLed and the cluster carries on under a new one.

What an operator relies on: a task submitted after the kill still runs (the CLI, agents and the
framework find the new leader themselves), `agora state` names the new leader with a higher epoch
and the standbys, and the masters' data dirs hold the term they voted in. `agora local` starts a
killed master again on its data dir and ports, so it rejoins and a second kill is survived too.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.test_cli import Local, _kill_everything, cluster_pids, start_local
from support.polling import wait_for


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-ha"), masters=3)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def _state(local: Local) -> dict[str, Any]:
    out = local.agora("state", "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    state: dict[str, Any] = json.loads(out.stdout)
    return state


def _state_if_any(local: Local) -> dict[str, Any] | None:
    """`agora state --json`, or None while it fails (no leader yet)."""
    out = local.agora("state", "--json", timeout=30)
    if out.returncode != 0:
        return None
    state: dict[str, Any] = json.loads(out.stdout)
    return state


def _leader(local: Local) -> str | None:
    """The leading master's address, per `agora state`; None while there is none."""
    state = _state_if_any(local)
    if state is None:
        return None
    leaders = [m["address"] for m in state["masters"] if m["role"] == "leader"]
    return leaders[0] if leaders else None


def _restart_lines(local: Local) -> list[str]:
    """The masters `agora local` reported it restarts after a SIGKILL, in order."""
    return re.findall(
        r"agora local: (master-\d) was killed by signal 9; restarting it in",
        local.stderr_path.read_text(),
    )


def _master_pid(local: Local, endpoint: str) -> int:
    for pid in cluster_pids(local.work):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"agora.master.server" in cmdline
            and endpoint.encode()
            in cmdline[cmdline.index(b"--advertise") + 1 : cmdline.index(b"--advertise") + 2]
        ):
            return pid
    raise AssertionError(f"no master process advertises {endpoint}")


def test_the_address_names_every_master(ha: Local) -> None:
    masters = ha.endpoint.split(",")
    assert len(masters) == 3 and all(m.startswith("tcp://127.0.0.1:") for m in masters)
    assert (ha.home / "master").read_text().strip() == ha.endpoint


def test_state_shows_the_leader_the_standbys_and_the_epoch(ha: Local) -> None:
    state = _state(ha)
    roles = sorted(m["role"] for m in state["masters"])
    assert roles == ["leader", "standby", "standby"]
    leader = next(m["address"] for m in state["masters"] if m["role"] == "leader")
    assert state["master_info"]["master_id"] == leader
    assert state["master_info"]["epoch"] >= 1
    text = ha.agora("state", timeout=30)
    assert text.returncode == 0 and "(leader)" in text.stdout and "(standby)" in text.stdout


def test_standbys_redirect_http_readers_to_the_leader(ha: Local) -> None:
    urls = (ha.home / "master.http").read_text().strip().split(",")
    assert len(urls) == 3

    def health(url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body

    # The leader's HTTP URL reaches the standbys with its appends, within a heartbeat or two.
    leader_url = wait_for(
        lambda: (
            (found := [u for u in urls if health(u)["leading"]])
            and all(health(u)["leader_http"] == found[0] for u in urls)
            and found[0]
        ),
        timeout=10,
        what="every master to know the leader's HTTP API",
    )
    token = (ha.home / "keys" / "operator.token").read_text().strip()
    for url in urls:
        if url == leader_url:
            continue
        for headers, status in (({}, 401), ({"Authorization": f"Bearer {token}"}, 307)):
            conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
            try:
                conn.request("GET", "/state?pretty=1", headers=headers)
                resp = conn.getresponse()
                assert resp.status == status
                if status == 307:  # the leader's URL came over CURVE, from the masters' key
                    assert resp.getheader("Location") == leader_url + "/state?pretty=1"
            finally:
                conn.close()


def test_after_the_leader_is_killed_work_still_runs_under_a_new_leader(ha: Local) -> None:
    before = _state(ha)
    old_leader = before["master_info"]["master_id"]
    old_epoch = before["master_info"]["epoch"]
    os.kill(_master_pid(ha, old_leader), signal.SIGKILL)
    killed_at = time.monotonic()
    run = ha.agora("run", "--", "echo", "ok", timeout=60)
    took = time.monotonic() - killed_at
    assert run.returncode == 0, run.stderr
    assert "ok" in run.stdout
    assert took < 20, f"agora run took {took:.1f} s across the failover"
    after = wait_for(
        lambda: (s := _state(ha))["master_info"]["master_id"] != old_leader and s,
        timeout=20,
        what="a new leader in agora state",
    )
    assert after["master_info"]["epoch"] > old_epoch
    dead = next(m for m in after["masters"] if m["address"] == old_leader)
    assert dead["role"] == "standby"
    # The agents came back to the new leader with what they run.
    assert {a["status"] for a in after["agents"]} == {"ACTIVE"} and len(after["agents"]) == 2
    # `agora local` reports the loss, starts the master again and keeps going.
    assert ha.proc.poll() is None
    wait_for(
        lambda: f"master-{ha.endpoint.split(',').index(old_leader) + 1}" in _restart_lines(ha),
        timeout=10,
        what="agora local to report the restart",
    )


def test_two_leader_kills_in_a_row_the_cluster_lives_on_and_both_masters_rejoin(
    ha: Local,
) -> None:
    """Before supervision, the second master death stopped `agora local` (a majority lost for
    good); now each killed master is started again and the group keeps a leader."""
    addresses = ha.endpoint.split(",")
    reported = len(_restart_lines(ha))
    killed: list[tuple[str, int]] = []
    for _ in range(2):
        leader = wait_for(lambda: _leader(ha), timeout=30, what="a leader")
        pid = _master_pid(ha, leader)
        os.kill(pid, signal.SIGKILL)
        killed.append((leader, pid))
        # The next kill comes as soon as another master leads, whether or not the killed one
        # is back yet.
        wait_for(
            lambda: (new := _leader(ha)) is not None and new != leader,  # noqa: B023
            timeout=30,
            what="a new leader",
        )
    assert killed[0][0] != killed[1][0]
    # Both were started again (same advertised address, new process) and rejoined the group.
    for address, old_pid in killed:
        assert wait_for(lambda: _master_pid(ha, address) != old_pid, 10, "a restart")  # noqa: B023
    wait_for(
        lambda: (
            (s := _state_if_any(ha))
            and all(m["reachable"] for m in s["masters"])
            and sorted(m["role"] for m in s["masters"]) == ["leader", "standby", "standby"]
            and s
        ),
        timeout=30,
        what="every master to rejoin under a leader",
    )
    assert _restart_lines(ha)[reported:] == [
        f"master-{addresses.index(address) + 1}" for address, _ in killed
    ]
    run = ha.agora("run", "--", "true", timeout=60)
    assert run.returncode == 0, run.stderr
    assert ha.proc.poll() is None
    log = (ha.work / "logs" / "local.log").read_text()
    assert log.count("event='daemon_restarted'") >= 2, log
