"""Thousands of simulated agents and schedulers in one thread, one TCP connection each.

A pyzmq DEALER costs two descriptors (its TCP connection and its mailbox's eventfd) and
``zmq.Poller`` walks every socket on each poll, so 10,000 of them neither fit under a 20,000
open-file limit nor keep up with the master. Here each simulated peer is a bare non-blocking TCP
socket speaking ZMTP 3.0 with the NULL mechanism as a DEALER would (greeting, READY, PING→PONG,
single-frame messages), and one ``selectors`` loop (epoll) serves only the sockets that are
ready. The masters must run without CURVE (``--insecure``).

With ``relay_links``, the agents instead share that many connections, each speaking to the master
as ``agora-relay`` does (every agent's frames behind its routing id and an empty principal): the
master still sees one peer per agent, over far fewer descriptors.

Simulated agents register, answer PING with PONG and, told to follow a new leader, reconnect there
and re-register with ``tasks_per_agent`` RUNNING tasks spread over the schedulers' frameworks.
Simulated schedulers subscribe with their offers suppressed (idle schedulers: a thousand that
each declined every agent in turn would make the master offer each agent a thousand times over),
decline any offer they still get (refusing the agent for ``refuse_seconds``) and send a
HEARTBEAT every few seconds.
"""

from __future__ import annotations

import errno
import queue
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agora.sdk import Resources
from agora.sdk.codec import decode, encode
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    AgentReregistered,
    AgentTask,
    CommandInfo,
    Decline,
    Filters,
    FrameworkInfo,
    Heartbeat,
    LeaderInfo,
    Offers,
    Ping,
    Pong,
    RegisterAgent,
    ReregisterAgent,
    RetryRegistration,
    Subscribe,
    Subscribed,
    TaskInfo,
    TaskState,
)
from agora.sdk.messages.batching import RETRY_REGISTRATION

_GREETING = (
    b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + b"\0" * 31
)


def _command(body: bytes) -> bytes:
    if len(body) < 256:
        return bytes((0x04, len(body))) + body
    return b"\x06" + len(body).to_bytes(8, "big") + body


_READY = _command(b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER")


def _frame(data: bytes, more: int = 0) -> bytes:
    if len(data) < 256:
        return bytes((more, len(data))) + data
    return bytes((0x02 | more,)) + len(data).to_bytes(8, "big") + data


def _relayed(rid: bytes) -> bytes:
    """What goes before an agent's frame on a relay's connection: its routing id, then the
    principal frame (empty: the masters run without CURVE)."""
    return _frame(rid, 0x01) + _frame(b"", 0x01)


#: What simulated agents announce: they read RETRY_REGISTRATION (not batches).
_FEATURES = (RETRY_REGISTRATION,)
_RESEND = 10.0  # seconds before an unanswered (re-)registration or subscription is sent again
_HEARTBEAT = 3.0  # seconds between a scheduler's HEARTBEATs
_RECONNECT = 0.1  # seconds before a lost connection is made again (libzmq's RECONNECT_IVL)
_RESOURCES = Resources.parse("cpus:16;mem:65536;disk:65536")
_TASK = Resources.parse("cpus:0.1;mem:32")


@dataclass(slots=True, eq=False)
class _Conn:
    kind: str  # "agent", "framework", or "relay" (a connection carrying agents)
    index: int
    sock: socket.socket | None = None
    inbuf: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    greeted: bool = False
    done: bool = False  # (re-)registered or subscribed with the leader followed now
    sent_at: float = 0.0
    #: Where it connects when not to the leader (a real relay).
    endpoint: str | None = None
    #: A relayed agent: the relay connection that carries it, and what precedes its frames.
    link: _Conn | None = None
    envelope: bytes = b""
    #: A relay connection: its agents by routing id, and the frames of a message read so far.
    behind: dict[bytes, _Conn] = field(default_factory=dict)
    parts: list[bytes] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Greeted by the master (over its relay's connection, for a relayed agent)."""
        return self.link.greeted if self.link is not None else self.greeted


class SimPeers(threading.Thread):
    """``agents`` simulated agents and ``frameworks`` simulated schedulers against ``leader``
    (``tcp://host:port``). Counters are read by the bench; :meth:`follow` and :meth:`reregister`
    are orders, carried out by the thread."""

    def __init__(
        self,
        agents: int,
        frameworks: int,
        leader: str,
        *,
        tasks_per_agent: int = 0,
        refuse_seconds: float = 30.0,
        relay_links: int = 0,
        agents_at: Sequence[str] = (),
    ) -> None:
        """``relay_links`` > 0: the agents share that many connections, speaking as a relay
        (``agora-relay``) does; else each has its own. ``agents_at``: the agents connect to
        these endpoints (real relays, in turn) instead of the leader, and stay there when told
        to follow a new one (the relays follow it)."""
        super().__init__(name="zmtp-sim", daemon=True)
        self.agents = agents
        self.relay_links = relay_links
        self._agents_at = tuple(agents_at)
        self.frameworks = frameworks
        self.tasks_per_agent = tasks_per_agent
        self.refuse_seconds = refuse_seconds
        self._leader = leader
        self._orders: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._halt = threading.Event()
        self.agent_ids: list[AgentID | None] = [None] * agents
        self.framework_ids: list[FrameworkID | None] = [None] * frameworks
        self.registered = 0
        self.subscribed = 0
        #: Agents answered since the last order (re-registration round), and when the last was.
        self.reregistered = 0
        self.last_reregistered_at = 0.0
        #: The leader the peers follow now (set once an order to follow is carried out).
        self.following = leader
        #: Whether agents re-register carrying their tasks (set by :meth:`reregister`).
        self.with_tasks = False
        self.pings = 0
        #: RETRY_REGISTRATION answers heard (registrations the master put off).
        self.put_off = 0
        self.declined = 0
        self.reconnects = 0
        self.other: dict[str, int] = {}
        self.error: BaseException | None = None

    # -- orders (from the bench's thread) -------------------------------------------------------

    def follow(self, leader: str) -> None:
        """Reconnect every peer to ``leader``; agents re-register, schedulers re-subscribe."""
        self._orders.put(("follow", leader))

    def reregister(self) -> None:
        """Every agent re-registers, with its tasks, to the leader it follows (no failover)."""
        self._orders.put(("reregister", ""))

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the bench
            self.error = exc

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        self._sel = selectors.EpollSelector()
        self._conns = [_Conn("framework", i) for i in range(self.frameworks)] + [
            _Conn("agent", i) for i in range(self.agents)
        ]
        for conn in self._conns[self.frameworks :] if self._agents_at else ():
            conn.endpoint = self._agents_at[conn.index % len(self._agents_at)]
        links = [_Conn("relay", j) for j in range(self.relay_links)]
        for conn in self._conns[self.frameworks :] if links else ():
            conn.link = link = links[conn.index % len(links)]
            rid = b"a" + conn.index.to_bytes(4, "big")
            conn.envelope = _relayed(rid)
            link.behind[rid] = conn
        #: What holds a TCP connection: the frameworks, and the agents or their relays.
        self._sockets = self._conns[: self.frameworks] + (links or self._conns[self.frameworks :])
        self._pending = list(self._conns)  # not (re-)registered yet: looked at every 0.1 s
        self._retry: list[tuple[float, _Conn]] = []  # (when, whom) to connect again
        self._pong = _frame(encode(Pong()))
        self._heartbeat = _frame(encode(Heartbeat()))
        next_heartbeat = time.perf_counter() + _HEARTBEAT
        try:
            for conn in self._sockets:
                self._connect(conn)
            next_scan = 0.0
            while not self._halt.is_set():
                now = time.perf_counter()
                self._take_orders()
                if now >= next_scan:
                    next_scan = now + 0.1
                    self._connect_due(now)
                    self._send_due(now)
                if now >= next_heartbeat:
                    next_heartbeat = now + _HEARTBEAT
                    for conn in self._conns[: self.frameworks]:
                        if conn.done:
                            self._send(conn, self._heartbeat)
                for key, events in self._sel.select(0.01):
                    conn = key.data
                    if events & selectors.EVENT_READ:
                        self._read(conn)
                    if events & selectors.EVENT_WRITE and conn.sock is not None:
                        self._flush(conn)
        finally:
            for conn in self._sockets:
                if conn.sock is not None:
                    conn.sock.close()
            self._sel.close()

    def _take_orders(self) -> None:
        while True:
            try:
                order, arg = self._orders.get_nowait()
            except queue.Empty:
                return
            if order == "follow":
                self._leader = arg
                self._retry = [(at, c) for at, c in self._retry if c.endpoint is not None]
                for conn in self._sockets:
                    if conn.endpoint is None:
                        self._close(conn)
                        self._connect(conn)
                self.following = arg
            self.with_tasks = self.with_tasks or order == "reregister" or self.tasks_per_agent > 0
            self.reregistered = 0
            for conn in self._conns:
                if conn.kind == "agent" or order == "follow":
                    conn.done = False
                    conn.sent_at = 0.0
            self._pending = [c for c in self._conns if not c.done]

    def _send_due(self, now: float) -> None:
        """(Re-)register or subscribe whoever is not answered yet and due. Agents wait until
        every scheduler has subscribed once (the tasks they report name the frameworks' ids);
        after a failover they re-register while the schedulers re-subscribe, as in a cluster."""
        still = []
        frameworks_ready = self.subscribed == self.frameworks
        for conn in self._pending:
            if conn.done:
                continue
            still.append(conn)
            if not conn.ready or now - conn.sent_at <= _RESEND:
                continue
            if conn.kind == "agent" and not frameworks_ready:
                continue
            self._send(conn, self._hello(conn))
            conn.sent_at = now
        self._pending = still

    def _hello(self, conn: _Conn) -> bytes:
        i = conn.index
        if conn.kind == "framework":
            fw_info = FrameworkInfo(
                name=f"sim-fw-{i}",
                user="nobody",
                failover_timeout=3600.0,
                framework_id=self.framework_ids[i],
            )
            # Idle, as a scheduler with nothing to launch should be: its offers suppressed.
            return _frame(encode(Subscribe(framework_info=fw_info, suppressed_roles=("*",))))
        agent_id = self.agent_ids[i]
        info = AgentInfo(hostname=f"sim-{i}", resources=_RESOURCES, agent_id=agent_id)
        if agent_id is None:
            return _frame(encode(RegisterAgent(agent_info=info, features=_FEATURES)))
        tasks = self._tasks(i) if self.with_tasks else ()
        reregister = ReregisterAgent(
            agent_id=agent_id, agent_info=info, tasks=tasks, features=_FEATURES
        )
        return _frame(encode(reregister))

    def _tasks(self, i: int) -> tuple[AgentTask, ...]:
        agent_id = self.agent_ids[i]
        assert agent_id is not None
        out = []
        for k in range(self.tasks_per_agent):
            framework_id = self.framework_ids[(i * self.tasks_per_agent + k) % self.frameworks]
            assert framework_id is not None
            info = TaskInfo(
                task_id=TaskID(f"t-{i}-{k}"),
                name=f"sim-{i}-{k}",
                agent_id=agent_id,
                resources=_TASK,
                command=CommandInfo(value="sleep 3600"),
            )
            out.append(AgentTask(task=info, framework_id=framework_id, state=TaskState.RUNNING))
        return tuple(out)

    # -- one connection --------------------------------------------------------------------------

    def _connect(self, conn: _Conn) -> None:
        target = conn.endpoint or self._leader
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rc = sock.connect_ex((host, int(port)))
        if rc not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(rc, f"connect to {target}: {errno.errorcode.get(rc, rc)}")
        conn.sock = sock
        conn.inbuf.clear()
        conn.parts.clear()
        conn.out[:] = _GREETING + _READY
        conn.greeted = False
        self._sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _close(self, conn: _Conn) -> None:
        if conn.sock is not None:
            self._sel.unregister(conn.sock)
            conn.sock.close()
            conn.sock = None
        conn.out.clear()

    def _reconnect(self, conn: _Conn) -> None:
        """The master closed the connection (or it failed, or is dead): connect again after
        ``_RECONNECT`` seconds, as libzmq does."""
        self.reconnects += 1
        self._close(conn)
        for peer in (*conn.behind.values(), conn):
            peer.done = False
            peer.sent_at = 0.0
        self._retry.append((time.perf_counter() + _RECONNECT, conn))

    def _connect_due(self, now: float) -> None:
        due = [conn for at, conn in self._retry if at <= now]
        self._retry = [(at, conn) for at, conn in self._retry if at > now]
        for conn in due:
            if conn.sock is None:
                self._connect(conn)
                self._pending.extend(conn.behind.values() or (conn,))

    def _send(self, conn: _Conn, data: bytes) -> None:
        if conn.link is not None:
            data = conn.envelope + data
            conn = conn.link
        if conn.sock is None:
            return
        pending = bool(conn.out)
        conn.out += data
        if not pending:
            self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        sock = conn.sock
        assert sock is not None
        try:
            sent = sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._reconnect(conn)
            return
        del conn.out[:sent]
        self._sel.modify(
            sock,
            selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0),
            conn,
        )

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        if sock is None:
            return
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._reconnect(conn)
            return
        buf = conn.inbuf
        buf += data
        if not conn.greeted:
            if len(buf) < 64:
                return
            del buf[:64]
            conn.greeted = True
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            flags = buf[pos]
            if flags & 0x02:
                if end - pos < 9:
                    break
                size = int.from_bytes(buf[pos + 1 : pos + 9], "big")
                head = 9
            else:
                size = buf[pos + 1]
                head = 2
            if end - pos < head + size:
                break
            body = bytes(buf[pos + head : pos + head + size])
            pos += head + size
            if flags & 0x04:
                self._on_command(conn, body)
            elif conn.kind != "relay":
                self._on_message(conn, body)
            elif flags & 0x01:  # more frames of this message follow
                conn.parts.append(body)
            else:
                self._on_relayed(conn, body)
        del buf[:pos]

    def _on_relayed(self, link: _Conn, body: bytes) -> None:
        """A message on a relay's connection: [agent's routing id, frame] for one of its agents,
        or the master's own to the relay."""
        parts, link.parts = link.parts, []
        agent = link.behind.get(parts[0]) if len(parts) == 1 else None
        if agent is not None:
            self._on_message(agent, body)
        else:
            self._note("to_relay")

    def _on_command(self, conn: _Conn, body: bytes) -> None:
        name = body[1 : 1 + body[0]]
        if name == b"PING":  # ZMTP heartbeat: PONG with the PING's context
            context = body[1 + body[0] + 2 :]
            self._send(conn, _command(b"\x04PONG" + context))

    def _on_message(self, conn: _Conn, body: bytes) -> None:
        try:
            message: Any = decode(body).message
        except ProtocolError:
            self._note("bad_frame")
            return
        kind = type(message)
        if kind is Ping:
            self.pings += 1
            self._send(conn, self._pong)
        elif kind is Offers:
            for offer in message.offers:
                decline = Decline(
                    framework_id=offer.framework_id,
                    offer_ids=(offer.offer_id,),
                    filters=Filters(refuse_seconds=self.refuse_seconds),
                )
                self._send(conn, _frame(encode(decline)))
                self.declined += 1
        elif kind is Subscribed and conn.kind == "framework" and not conn.done:
            if self.framework_ids[conn.index] is None:
                self.subscribed += 1
            self.framework_ids[conn.index] = message.framework_id
            conn.done = True
        elif kind is AgentRegistered and conn.kind == "agent" and not conn.done:
            if self.agent_ids[conn.index] is None:
                self.registered += 1
            self.agent_ids[conn.index] = message.agent_id
            conn.done = True
        elif kind is RetryRegistration and conn.kind == "agent" and not conn.done:
            # Sent again after retry_after, up to a tenth more, as an agent does.
            self.put_off += 1
            wait = message.retry_after * (1.0 + 0.1 * ((conn.index * 0.618034) % 1.0))
            conn.sent_at = time.perf_counter() - _RESEND + wait
        elif kind is LeaderInfo and conn.endpoint is not None:
            # A real relay says who leads: an agent still to re-register sends at once, as
            # its queued frame may have reached the relay before the relay had a leader.
            if message.leader is not None and not conn.done:
                conn.sent_at = 0.0
            self._note(message.NAME)
        elif kind is AgentReregistered and conn.kind == "agent" and not conn.done:
            conn.done = True
            self.reregistered += 1
            self.last_reregistered_at = time.perf_counter()
        else:
            self._note(message.NAME)

    def _note(self, name: str) -> None:
        self.other[name] = self.other.get(name, 0) + 1
