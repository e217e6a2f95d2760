"""Three master processes elect one leader; standbys point clients at it; a killed leader is
replaced at a higher epoch; a restarted master never goes back on its term."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agora.sdk.cli.cluster import free_ports
from agora.sdk.messages import DetectLeader, GetState, LeaderInfo, StateReply
from agora.sdk.transport import ZmqClient
from support.master_process import clean_env
from support.polling import wait_for

T = 0.5  # election timeout for these tests: failovers stay well under a second or two


class Group:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.endpoints = [f"tcp://127.0.0.1:{p}" for p in free_ports(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, endpoint: str) -> None:
        i = self.endpoints.index(endpoint)
        log = open(self.tmp / f"master-{i}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.procs[endpoint] = subprocess.Popen(
            [
                *(sys.executable, "-m", "agora.master.server"),
                *("--bind", endpoint, "--advertise", endpoint),
                *("--masters", ",".join(self.endpoints), "--insecure"),
                *("--work-dir", str(self.tmp / f"master-{i}")),
                *("--election-timeout", str(T), "--election-heartbeat", str(T / 10)),
                *("--history", str(self.tmp / "history.jsonl")),
                *("--log-format", "json"),
            ],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def kill(self, endpoint: str) -> None:
        proc = self.procs.pop(endpoint)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()


@contextmanager
def group(tmp: Path) -> Iterator[Group]:
    g = Group(tmp)
    try:
        for endpoint in g.endpoints:
            g.start(endpoint)
        yield g
    finally:
        g.stop_all()


async def _ask(endpoint: str, message: object, timeout: float = 2.0) -> object | None:
    client = ZmqClient.connect(endpoint)
    try:
        await client.send(message)  # type: ignore[arg-type]
        async with asyncio.timeout(timeout):
            return (await client.recv()).message
    except TimeoutError:
        return None
    finally:
        client.close()


def ask(endpoint: str, message: object) -> object | None:
    return asyncio.run(_ask(endpoint, message))


def leader_of(g: Group) -> tuple[str, int] | None:
    """(leader, epoch) once exactly one live master says it leads, else None."""
    claims = []
    for endpoint in g.procs:
        info = ask(endpoint, DetectLeader())
        if isinstance(info, LeaderInfo) and info.leader == endpoint:
            claims.append((endpoint, info.epoch))
    return claims[0] if len(claims) == 1 else None


def test_one_leader_standbys_redirect_and_a_killed_leader_is_replaced(tmp_path: Path) -> None:
    with group(tmp_path) as g:
        leader, epoch = wait_for(lambda: leader_of(g), timeout=20, what="a leader")
        standbys = [e for e in g.endpoints if e != leader]
        # A standby answers a client call with where the leader is, not with state.
        answer = ask(standbys[0], GetState())
        assert isinstance(answer, LeaderInfo)
        assert answer.leader == leader and answer.epoch == epoch
        assert set(answer.masters) == set(g.endpoints)
        # The leader answers, and names the whole group.
        state = ask(leader, GetState())
        assert isinstance(state, StateReply) and state.master_info.epoch == epoch
        assert sorted(m.role for m in state.masters) == ["leader", "standby", "standby"]

        g.kill(leader)
        new_leader, new_epoch = wait_for(lambda: leader_of(g), timeout=20, what="a new leader")
        assert new_leader != leader and new_epoch > epoch

        # The killed master comes back on its data dir as a follower: it never goes back on
        # its term, and it learns the new leader.
        g.start(leader)

        def follows() -> LeaderInfo | None:
            info = ask(leader, DetectLeader())
            ok = isinstance(info, LeaderInfo) and info.leader == new_leader
            return info if ok else None  # type: ignore[return-value]

        info = wait_for(follows, timeout=20, what="the restarted master following")
        assert info.epoch >= new_epoch
    events = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    leaders_per_term: dict[int, set[str]] = {}
    for e in events:
        if e["kind"] == "leader":
            leaders_per_term.setdefault(e["term"], set()).add(e["node"])
    assert leaders_per_term and all(len(nodes) == 1 for nodes in leaders_per_term.values())
    terms_of_old: list[int] = [
        e["term"] for e in events if e["node"] == leader and e["kind"] == "term"
    ]
    assert terms_of_old == sorted(terms_of_old), "a master's term never decreases, restarts too"
