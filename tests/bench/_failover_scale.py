"""Mode 2 of the failover bench: N simulated agents in one thread against 3 master processes.

Each simulated agent is one DEALER connected to the current leader. It answers the master
minimally: REGISTER_AGENT once, PONG to every PING and, when told of a new leader, moves its
socket there and sends REREGISTER_AGENT with its agent id and no tasks. The thread owns every
socket (ZeroMQ sockets are not thread-safe); the bench talks to it through a queue and reads the
counters it publishes.
"""

from __future__ import annotations

import asyncio
import queue
import resource
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq
from _failover_procs import Group, Probe, percentiles
from agora.sdk import Resources
from agora.sdk.codec import decode, encode
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    AgentReregistered,
    Ping,
    Pong,
    RegisterAgent,
    ReregisterAgent,
)

_RESOURCES = Resources.parse("cpus:4;mem:4096;disk:4096")
_RESEND = 10.0  # seconds before an unanswered (re-)registration is sent again
_SCAN = 0.1  # seconds between looks for agents due a (re-)registration
_REGISTER_TIMEOUT = 600.0
_ROUND_TIMEOUT = 300.0
_FDS_PER_AGENT = 2  # the ZeroMQ socket's mailbox (an eventfd) and its TCP connection
_FDS_RESERVED = 600  # the bench's own: probes, asyncio, the ZeroMQ contexts' threads, logs


def raise_fd_limit(agents: int) -> int:
    """Raise RLIMIT_NOFILE (inherited by the masters started after) for ``agents``; the limit.

    Raising the hard limit needs CAP_SYS_RESOURCE; without it the soft limit goes up to the hard.
    """
    want = agents * _FDS_PER_AGENT + _FDS_RESERVED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, hard), max(want, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def most_agents(fd_limit: int) -> int:
    """How many simulated agents one process holds under ``fd_limit`` open files."""
    return max(0, (fd_limit - _FDS_RESERVED) // _FDS_PER_AGENT)


class SimAgents(threading.Thread):
    """``count`` simulated agents; :meth:`follow` moves them all to a new leader."""

    def __init__(self, count: int, leader: str, window: int) -> None:
        """``window``: most first registrations unanswered at a time (a burst of thousands
        starves the leader's Raft heartbeats: it loses the lead)."""
        super().__init__(name="sim-agents", daemon=True)
        self.count = count
        self.window = window
        self._leader = leader
        self._orders: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._halt = threading.Event()
        self.agent_ids: list[AgentID | None] = [None] * count
        self.registered = 0
        #: Agents re-registered with the leader given last, and when the last of them was.
        self.reregistered = 0
        self.last_reregistered_at = 0.0
        #: The leader the agents follow now (set once the move is done and the counters reset).
        self.following = leader
        self.pings = 0
        self.other: dict[str, int] = {}
        self.error: BaseException | None = None

    def follow(self, leader: str) -> None:
        self._orders.put(leader)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the bench
            self.error = exc

    def _run(self) -> None:
        ctx = zmq.Context(io_threads=2)
        ctx.set(zmq.MAX_SOCKETS, self.count + 1024)
        socks: list[zmq.Socket[bytes]] = []
        try:
            poller = zmq.Poller()
            index: dict[zmq.Socket[bytes], int] = {}
            for i in range(self.count):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(self._leader)
                socks.append(sock)
                index[sock] = i
                poller.register(sock, zmq.POLLIN)
            done = [False] * self.count
            sent_at = [0.0] * self.count
            pong = encode(Pong())
            next_scan = 0.0
            while not self._halt.is_set():
                now = time.perf_counter()
                try:
                    leader = self._orders.get_nowait()
                except queue.Empty:
                    pass
                else:
                    for sock in socks:
                        sock.disconnect(self._leader)
                        sock.connect(leader)
                    self._leader = leader
                    done = [False] * self.count
                    sent_at = [0.0] * self.count
                    self.reregistered = 0
                    self.following = leader
                    next_scan = 0.0
                if now >= next_scan:  # every 0.1 s: O(count) in Python, so not every poll
                    next_scan = now + _SCAN
                    self._send_due(socks, done, sent_at, now)
                for sock, _ in poller.poll(10):
                    i = index[sock]
                    while True:
                        try:
                            frame = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        try:
                            message = decode(frame).message
                        except ProtocolError:
                            self._note("bad_frame")
                            continue
                        if type(message) is Ping:
                            self.pings += 1
                            sock.send(pong, zmq.NOBLOCK)
                        elif type(message) is AgentRegistered and not done[i]:
                            if self.agent_ids[i] is None:
                                self.registered += 1
                            self.agent_ids[i] = message.agent_id
                            done[i] = True
                        elif type(message) is AgentReregistered and not done[i]:
                            done[i] = True
                            self.reregistered += 1
                            self.last_reregistered_at = time.perf_counter()
                        else:
                            self._note(message.NAME)
        finally:
            for sock in socks:
                sock.close(linger=0)
            ctx.term()

    def _send_due(
        self, socks: list[zmq.Socket[bytes]], done: list[bool], sent_at: list[float], now: float
    ) -> None:
        """(Re-)register every agent not answered yet whose turn it is; first registrations
        only while fewer than ``window`` are unanswered."""
        ids = self.agent_ids
        waiting = sum(1 for i in range(self.count) if not done[i] and sent_at[i] and ids[i] is None)
        for i in range(self.count):
            if done[i] or now - sent_at[i] <= _RESEND:
                continue
            if ids[i] is None and not sent_at[i]:
                if waiting >= self.window:
                    continue
                waiting += 1
            socks[i].send(self._hello(i), zmq.NOBLOCK)
            sent_at[i] = now

    def _hello(self, i: int) -> bytes:
        agent_id = self.agent_ids[i]
        info = AgentInfo(hostname=f"sim-{i}", resources=_RESOURCES, agent_id=agent_id)
        if agent_id is None:
            return encode(RegisterAgent(agent_info=info))
        return encode(ReregisterAgent(agent_id=agent_id, agent_info=info))

    def _note(self, name: str) -> None:
        self.other[name] = self.other.get(name, 0) + 1


@dataclass
class Leader:
    endpoint: str
    epoch: int
    changes: int = 0  # leader changes the bench did not cause


async def _wait(
    predicate: Any, deadline: float, what: str, sim: SimAgents, probe: Probe, leader: Leader
) -> None:
    """Until ``predicate()``; meanwhile moves the agents to any newer leader (every 0.2 s)."""
    next_look = 0.0
    next_report = time.perf_counter() + 10.0
    while not predicate():
        if sim.error is not None:
            raise RuntimeError(f"simulated agents failed: {sim.error!r}")
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(what)
        if now >= next_report:
            next_report = now + 10.0
            print(
                f"waiting for {what}: registered {sim.registered}, re-registered "
                f"{sim.reregistered}, other {sim.other}",
                file=sys.stderr,
                flush=True,
            )
        if now >= next_look:
            next_look = now + 0.2
            newer = probe.active_leader(probe.endpoints, leader.epoch)
            if newer is not None:
                leader.endpoint, leader.epoch = newer.responder, newer.epoch
                leader.changes += 1
                print(f"leader moved on its own to {newer.responder}", file=sys.stderr)
                sim.follow(newer.responder)
            probe.ask_leader(probe.endpoints)
        await asyncio.sleep(0.01)


async def run_scale(group: Group, count: int, kills: int, window: int = 200) -> dict[str, Any]:
    requested = count
    fd_limit = raise_fd_limit(count)
    limited_by = None
    if count > most_agents(fd_limit):
        count = most_agents(fd_limit)
        limited_by = (
            f"RLIMIT_NOFILE: hard limit {fd_limit} (raising it needs CAP_SYS_RESOURCE), "
            f"{_FDS_PER_AGENT} fds per simulated agent (ZeroMQ mailbox eventfd + TCP connection)"
        )
        print(f"only {count} simulated agents fit: {limited_by}", file=sys.stderr)
    group.start_masters(("--agent-reregister-timeout", "600"))
    elected: list[float] = []
    reregistered: list[float] = []
    in_state: list[float] = []
    async with Probe(group.endpoints) as probe:
        info = await probe.wait_leader(group.endpoints, -1, time.perf_counter() + 60, every=0.05)
        assert info.leader is not None
        leader = Leader(info.leader, info.epoch)
        sim = SimAgents(count, leader.endpoint, window)
        sim.start()
        started = time.perf_counter()
        try:
            await _wait(
                lambda: sim.registered == count,
                started + _REGISTER_TIMEOUT,
                "registration",
                sim,
                probe,
                leader,
            )
            register_s = time.perf_counter() - started
            await probe.wait_active_agents(
                leader.endpoint, count, time.perf_counter() + 120, every=0.5
            )
            print(f"{count} agents registered in {register_s:.1f}s", file=sys.stderr)
            for n in range(kills):
                old = leader.endpoint
                victim = group.master_at(old)
                survivors = [e for e in group.endpoints if e != old]
                killed_at = time.perf_counter()
                victim.kill()
                deadline = killed_at + _ROUND_TIMEOUT
                info = await probe.wait_leader(survivors, leader.epoch, deadline)
                elected.append(time.perf_counter() - killed_at)
                assert info.leader is not None
                leader.endpoint, leader.epoch = info.leader, info.epoch
                sim.follow(leader.endpoint)
                await _wait(
                    lambda: sim.following == leader.endpoint and sim.reregistered == count,
                    deadline,
                    "re-registration",
                    sim,
                    probe,
                    leader,
                )
                reregistered.append(sim.last_reregistered_at - killed_at)
                at = await probe.wait_active_agents(
                    leader.endpoint, count, deadline, killed_at, every=0.25
                )
                in_state.append(at - killed_at)
                print(
                    f"kill {n + 1}/{kills}: elected {elected[-1]:.3f}s, "
                    f"reregistered {reregistered[-1]:.3f}s, in state {in_state[-1]:.3f}s",
                    file=sys.stderr,
                    flush=True,
                )
                victim.start()
                await probe.wait_follower(
                    old, leader.endpoint, leader.epoch, time.perf_counter() + _ROUND_TIMEOUT
                )
                group.check_alive()
        finally:
            sim.stop()
            sim.join(30)
    return {
        "mode": "scale",
        "agents": count,
        "requested_agents": requested,
        "limited_by": limited_by,
        "kills": kills,
        "elected_s": percentiles(elected),
        "reregistered_s": percentiles(reregistered),
        "all_active_in_state_s": percentiles(in_state),
        "register_all_s": round(register_s, 3),
        "registration_window": window,
        "unforced_leader_changes": leader.changes,
        "election_timeout": group.election_timeout,
        "rlimit_nofile": fd_limit,
        "pings_answered": sim.pings,
        "other_messages": sim.other,
    }
