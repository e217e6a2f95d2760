"""The relay's I/O: a ROUTER for the agents, a :class:`MasterLink` to the masters.

Frames are carried as they came, without being decoded: only their envelope is read, to answer
DETECT_LEADER here and to keep masters' LEADER frames (which name the masters) from the agents.
Nothing waits on a busy peer: a frame that would block is dropped and counted (agents resend,
as they do when a master drops it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import time
from collections.abc import Callable, Sequence
from typing import Final, cast

import structlog
import zmq
import zmq.asyncio
from agora.master.relay.core import DEFAULT_MAX_AGENTS, Downstream, leader_info
from agora.sdk.codec import encode, envelope_head
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import DetectLeader, LeaderInfo
from agora.sdk.transport import (
    CurveClient,
    CurveServer,
    MasterLink,
    Received,
    ZmqClient,
    ZmqServer,
)
from agora.sdk.transport.base import decode_received
from agora.sdk.transport.master_link import RECONNECT_MAX

__all__ = ["IDLE_SECONDS", "Relay", "RelayStats"]

log = structlog.get_logger(__name__)

#: An agent silent this long is forgotten (a master pings each of its agents every 15 s).
IDLE_SECONDS: Final = 120.0
#: Seconds between log lines of what the relay carried and dropped (when anything changed).
STATS_EVERY: Final = 60.0
#: Frames read in one go before the loop lets other tasks run.
_BATCH: Final = 256
_DETECT_LEADER: Final = DetectLeader.NAME
_LEADER: Final = LeaderInfo.NAME


@dataclasses.dataclass(slots=True)
class RelayStats:
    """What the relay has carried and dropped since it started."""

    to_masters: int = 0
    to_agents: int = 0
    #: Agents' frames dropped: no master leads, or its connection is backed up.
    dropped_no_leader: int = 0
    dropped_backlog: int = 0
    #: Frames from agents beyond ``max_agents``, or not one ZeroMQ frame.
    refused: int = 0


class _AgentSide(ZmqServer):
    """The ROUTER the agents connect to; frames are handed over undecoded."""

    @property
    def curve(self) -> bool:
        return self._curve

    async def recv_parts(self) -> list[bytes] | list[zmq.Frame]:
        parts: list[bytes] | list[zmq.Frame] = await self._io.recv(copy=not self._curve)
        return parts

    def recv_parts_nowait(self) -> list[bytes] | list[zmq.Frame] | None:
        parts: list[bytes] | list[zmq.Frame] | None = self._io.recv_nowait(copy=not self._curve)
        return parts

    def send_frame(self, agent: bytes, frame: bytes | zmq.Frame) -> bool | None:
        """True when queued, False at the high-water mark, None when the agent is gone."""
        try:
            return self._io.send_nowait(agent, cast(bytes, frame))
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                return None
            raise


class _MasterSide(ZmqClient):
    """A DEALER to one master: its own frames (LEADER) go to the :class:`MasterLink` as usual,
    frames for an agent (``[agent's routing id, frame]``) to ``on_relayed``."""

    on_relayed: Callable[[bytes, bytes], None] | None = None

    def recv_nowait(self) -> Received | None:
        while (parts := self._io.recv_nowait()) is not None:
            received = self._sort(parts)
            if received is not None:
                return received
        return None

    async def recv(self) -> Received:
        carried = 0
        while True:
            received = self._sort(await self._io.recv())
            if received is not None:
                return received
            carried += 1
            if carried % _BATCH == 0:
                await asyncio.sleep(0)

    def _sort(self, parts: list[bytes]) -> Received | None:
        if len(parts) == 2:
            if self.on_relayed is not None:
                self.on_relayed(parts[0], parts[1])
            return None
        if len(parts) != 1:
            error = ProtocolError(f"expected one or two frames, got {len(parts)}")
            return Received("", None, 0, error)
        return decode_received("", parts[0])

    def carry(self, agent: bytes, principal: bytes, frame: bytes | zmq.Frame) -> bool:
        """Queue an agent's frame to this master; False at the high-water mark."""
        return self._io.send_nowait(agent, principal, cast(bytes, frame))


class Relay:
    """Carries agents' frames to the leading master and its frames back.

    Create with :meth:`start` from a coroutine, then :meth:`serve` until cancelled; :meth:`close`
    frees the sockets. ``advertise``: the name it gives itself in LEADER (default: its endpoint).
    """

    def __init__(
        self,
        agents: _AgentSide,
        context: zmq.asyncio.Context,
        *,
        advertise: str | None,
        idle: float,
        max_agents: int,
    ) -> None:
        self._agents = agents
        self._context = context
        self._curve = agents.curve
        self.endpoint = agents.endpoint
        self.name = advertise or agents.endpoint
        self._books = Downstream(idle=idle, max_agents=max_agents)
        self._masters: dict[str, _MasterSide] = {}
        self._link: MasterLink | None = None
        #: The newest epoch on the leader's frames to agents (a lone master is never asked).
        self._epoch = 0
        self.stats = RelayStats()
        self._refusals = KeyedLogLimiter(rate=1.0, burst=3, max_keys=64)

    @classmethod
    async def start(
        cls,
        bind: str,
        masters: Sequence[str],
        *,
        agents_curve: CurveServer | None = None,
        masters_curve: CurveClient | None = None,
        advertise: str | None = None,
        idle: float = IDLE_SECONDS,
        max_agents: int = DEFAULT_MAX_AGENTS,
    ) -> Relay:
        """Bind ``bind`` for the agents (CURVE with ``agents_curve``) and connect to every master
        in ``masters`` (CURVE with ``masters_curve``: the relay's keypair and the masters' key)."""
        context = zmq.asyncio.Context(io_threads=2)
        agents: _AgentSide | None = None
        try:
            agents = cast(_AgentSide, _AgentSide.bind(bind, curve=agents_curve, context=context))
            relay = cls(agents, context, advertise=advertise, idle=idle, max_agents=max_agents)
            relay._link = MasterLink.connect(
                masters,
                context=context,
                on_connected=functools.partial(relay._tell_all, True),
                on_disconnected=functools.partial(relay._tell_all, False),
                dial=functools.partial(relay._dial, masters_curve),
            )
        except BaseException:
            if agents is not None:
                agents.close()
            context.destroy(linger=0)
            raise
        log.info("relay_started", endpoint=relay.endpoint, masters=list(masters))
        return relay

    @property
    def leading(self) -> str | None:
        """The master the relay carries frames to, while its connection is up."""
        link = self._link
        return link.leader if link is not None and link.connected else None

    @property
    def agents(self) -> int:
        return len(self._books)

    def _dial(
        self,
        curve: CurveClient | None,
        endpoint: str,
        up: Callable[[], None],
        down: Callable[[], None],
    ) -> _MasterSide:
        side = cast(
            _MasterSide,
            _MasterSide.connect(
                endpoint,
                curve=curve,
                context=self._context,
                on_connected=up,
                on_disconnected=down,
                reconnect_max=RECONNECT_MAX,
            ),
        )
        side.on_relayed = functools.partial(self._to_agent, endpoint)
        self._masters[endpoint] = side
        return side

    async def serve(self) -> None:
        """Carry frames until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._from_agents(), name="relay-agents")
            tasks.create_task(self._from_link(), name="relay-link")
            tasks.create_task(self._expire(), name="relay-expire")

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
        self._agents.close()
        self._context.destroy(linger=0)

    # -- agents -> the leading master ---------------------------------------------------------

    async def _from_agents(self) -> None:
        agents = self._agents
        while True:
            self._carry_up(await agents.recv_parts())
            for _ in range(_BATCH):
                parts = agents.recv_parts_nowait()
                if parts is None:
                    break
                self._carry_up(parts)
            await asyncio.sleep(0)

    def _carry_up(self, parts: list[bytes] | list[zmq.Frame]) -> None:
        try:
            self._from_agent(parts)
        except Exception:  # never let one frame stop the relay
            log.exception("relay_agent_frame_failed")

    def _from_agent(self, parts: list[bytes] | list[zmq.Frame]) -> None:
        head, body = parts[0], parts[-1]
        agent = head.bytes if isinstance(head, zmq.Frame) else head
        if len(parts) != 2:
            self._refuse(agent, "not one frame")
            return
        principal = b""
        if isinstance(body, zmq.Frame):
            user = body.get("User-Id") if self._curve else None
            principal = user.encode() if isinstance(user, str) else b""
            data: bytes | memoryview = body.buffer
        else:
            data = body
        verdict = self._books.heard(agent, time.monotonic())
        if not verdict.carry:
            self._refuse(agent, "the relay serves as many agents as it may")
            return
        envelope = envelope_head(data)
        name = envelope[0] if envelope is not None else None
        if verdict.new or name == _DETECT_LEADER:
            self._tell(agent, self.leading is not None)
        if name in (_DETECT_LEADER, _LEADER):
            return
        master = self._masters.get(self.leading or "")
        if master is None:
            self.stats.dropped_no_leader += 1
        elif master.carry(agent, principal, body):
            self.stats.to_masters += 1
        else:
            self.stats.dropped_backlog += 1

    def _refuse(self, agent: bytes, why: str) -> None:
        self.stats.refused += 1
        if self._refusals.allow(why, time.monotonic()):
            log.warning("relay_frame_refused", agent=agent.hex(), why=why, agents=self.agents)

    # -- the leading master -> agents ----------------------------------------------------------

    def _to_agent(self, endpoint: str, agent: bytes, frame: bytes) -> None:
        if endpoint != self.leading:
            return  # a deposed master's
        head = envelope_head(frame)
        if head is not None:
            if head[0] == _LEADER:
                return  # it names the masters, which the agents must not dial
            self._epoch = max(self._epoch, head[1])  # what LEADER then says (a lone master's)
        try:
            sent = self._agents.send_frame(agent, frame)
        except zmq.ZMQError as exc:  # e.g. a routing id longer than ZeroMQ allows
            log.warning("relay_send_failed", agent=agent.hex()[:64], error=str(exc))
            return
        if sent is None:
            self._books.forget(agent)
        elif sent:
            self.stats.to_agents += 1

    async def _from_link(self) -> None:
        """The leader's own frames to the relay (an ERROR, say): logged, nothing else."""
        assert self._link is not None
        while True:
            received = await self._link.recv()
            name = received.message.NAME if received.message is not None else None
            log.debug("relay_master_frame", message=name, error=str(received.error or ""))

    # -- what the agents are told ---------------------------------------------------------------

    def _tell(self, agent: bytes, leading: bool) -> None:
        if self._agents.send_frame(agent, self._leader_frame(leading)) is None:
            self._books.forget(agent)

    def _tell_all(self, leading: bool) -> None:
        """The leader came or went: every agent hears it (and re-registers on a new one)."""
        frame = self._leader_frame(leading)
        for agent in self._books:
            if self._agents.send_frame(agent, frame) is None:
                self._books.forget(agent)
        log.info("relay_leader", leader=self.leading, agents=self.agents)

    def _leader_frame(self, leading: bool) -> bytes:
        epoch = max(self._link.epoch if self._link is not None else 0, self._epoch)
        return encode(leader_info(self.name, epoch, leading), epoch=epoch)

    async def _expire(self) -> None:
        """Forget silent agents; log what was carried and dropped when it changed."""
        logged = dataclasses.replace(self.stats)
        while True:
            await asyncio.sleep(min(self._books.idle / 4, STATS_EVERY))
            gone = self._books.expire(time.monotonic())
            if gone:
                log.debug("relay_agents_forgotten", count=len(gone), agents=self.agents)
            if self.stats != logged:
                logged = dataclasses.replace(self.stats)
                log.info("relay_stats", agents=self.agents, **dataclasses.asdict(logged))
