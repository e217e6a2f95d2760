"""The real master core behind a tiny shell, for driver and operator-client tests.

``FakeMaster`` binds a real ``ZmqServer`` (tcp loopback, ephemeral port) and does what the master
daemon does, minimally: received message -> ``Master.handle(peer, message, time.time())`` ->
send the actions; ``Master.tick`` on a short period; HEARTBEATs from clients are liveness only.
Agents are ``FakeAgent``s living inside the shell: their messages go straight into the core and
whatever the core sends to them lands in their ``inbox`` (an ``auto`` agent also runs every task
it is given to FINISHED, and answers kills with KILLED).

``MasterThread`` runs a FakeMaster on its own event loop thread for tests written as plain
synchronous code (the blocking driver, the operator client's sync wrappers).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from agora.master.core import Master, MasterConfig, Send
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentInfo,
    AgentRegistered,
    Error,
    ErrorCode,
    Heartbeat,
    KillTask,
    Message,
    Ping,
    Pong,
    RegisterAgent,
    RunTask,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Subscribe,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import CurveServer, ZmqServer

T = TypeVar("T")
M = TypeVar("M", bound=Message)

LOOPBACK = "tcp://127.0.0.1:0"


class FakeAgent:
    """An agent inside the shell: a peer name, an id once registered, and what it was sent."""

    def __init__(self, name: str, resources: str, *, auto: bool = False) -> None:
        self.name = name
        self.peer = f"agent:{name}"
        self.resources = Resources.parse(resources)
        self.auto = auto
        #: Stop answering PINGs (the master will find the agent unreachable).
        self.mute = False
        self.agent_id: AgentID | None = None
        self.inbox: list[Message] = []

    def of_type(self, cls: type[M]) -> list[M]:
        return [m for m in self.inbox if isinstance(m, cls)]

    def update(
        self, framework_id: FrameworkID, task_id: str, state: TaskState, *, with_uuid: bool = True
    ) -> StatusUpdateMessage:
        status = TaskStatus(
            task_id=TaskID(task_id),
            state=state,
            source=StatusSource.EXECUTOR,
            agent_id=self.agent_id,
            uuid=uuid.uuid4().bytes if with_uuid else None,
            timestamp=time.time(),
        )
        return StatusUpdateMessage(update=StatusUpdate(framework_id=framework_id, status=status))

    def deliver(self, message: Message) -> list[Message]:
        """Take one message from the master; returns what the agent answers."""
        self.inbox.append(message)
        if isinstance(message, AgentRegistered):
            self.agent_id = message.agent_id
        elif isinstance(message, Ping):
            return [] if self.mute else [Pong()]
        elif self.auto and isinstance(message, RunTask):
            fid, tid = message.framework_id, message.task.task_id
            return [
                self.update(fid, tid, TaskState.RUNNING),
                self.update(fid, tid, TaskState.FINISHED),
            ]
        elif self.auto and isinstance(message, KillTask):
            return [self.update(message.framework_id, message.task_id, TaskState.KILLED)]
        return []


class FakeMaster:
    """A ZmqServer in front of a real ``Master`` core. Create with :meth:`start`."""

    def __init__(self, server: ZmqServer, core: Master, tick: float) -> None:
        self.server = server
        self.core = core
        self.endpoint = server.endpoint
        self.agents: dict[str, FakeAgent] = {}
        #: Every message a client sent us, with its peer.
        self.received: list[tuple[str, Message]] = []
        #: Drop everything received and stop ticking (a hung master with its sockets open).
        self.paused = False
        #: Answer SUBSCRIBE with ERROR FORBIDDEN, as the daemon does for a denied role.
        self.forbid_subscribe = False
        self._tick = tick
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(
        cls,
        endpoint: str = LOOPBACK,
        *,
        epoch: int = 1,
        heartbeat_interval: float = 15.0,
        allocation_interval: float = 0.05,
        tick: float = 0.02,
        curve: CurveServer | None = None,
        **config_fields: Any,
    ) -> FakeMaster:
        config = MasterConfig(
            epoch=epoch,
            allocation_interval=allocation_interval,
            heartbeat_interval=heartbeat_interval,
            **config_fields,
        )
        server = ZmqServer.bind(endpoint, curve=curve)
        master = cls(server, Master(config), tick)
        loop = asyncio.get_running_loop()
        master._tasks = [loop.create_task(master._serve()), loop.create_task(master._ticker())]
        return master

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.server.close()

    async def aclose(self) -> None:
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def of_type(self, cls: type[M]) -> list[M]:
        return [m for _, m in self.received if isinstance(m, cls)]

    # ------------------------------------------------------------------ agents

    async def add_agent(self, name: str, resources: str, *, auto: bool = False) -> FakeAgent:
        agent = FakeAgent(name, resources, auto=auto)
        self.agents[agent.peer] = agent
        info = AgentInfo(hostname=name, resources=agent.resources)
        await self.from_agent(agent, RegisterAgent(agent_info=info))
        assert agent.agent_id is not None
        return agent

    async def from_agent(self, agent: FakeAgent, message: Message) -> None:
        await self._perform(self.core.handle(agent.peer, message, time.time()))

    # ------------------------------------------------------------------ the shell

    async def _serve(self) -> None:
        server = self.server
        while True:
            batch = [await server.recv()]
            while (more := server.recv_nowait()) is not None:
                batch.append(more)
            actions: list[Send] = []
            for received in batch:
                message = received.message
                if message is None:
                    error = Error(message=str(received.error), code=ErrorCode.BAD_REQUEST)
                    actions.append(Send(received.peer, error, self.core.epoch))
                    continue
                self.received.append((received.peer, message))
                if self.paused or isinstance(message, Heartbeat):
                    continue
                if self.forbid_subscribe and isinstance(message, Subscribe):
                    error = Error(message="SUBSCRIBE forbidden", code=ErrorCode.FORBIDDEN)
                    actions.append(Send(received.peer, error, self.core.epoch))
                    continue
                actions.extend(self.core.handle(received.peer, message, time.time()))
            await self._perform(actions)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            if not self.paused:
                await self._perform(self.core.tick(time.time()))

    async def _perform(self, actions: Iterable[Send]) -> None:
        queue = deque(actions)
        while queue:
            action = queue.popleft()
            agent = self.agents.get(action.to)
            if agent is None:
                await self.server.send(action.to, action.message, action.epoch)
                continue
            for reply in agent.deliver(action.message):
                queue.extend(self.core.handle(agent.peer, reply, time.time()))


async def eventually(predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def eventually_sync(predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class MasterThread:
    """A FakeMaster on its own event loop thread; use as a context manager."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.master: FakeMaster

    def __enter__(self) -> MasterThread:
        self._thread.start()
        self.master = self.call(FakeMaster.start(**self._options))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self.master.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    @property
    def endpoint(self) -> str:
        return self.master.endpoint

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Run ``coro`` on the master's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def add_agent(self, name: str, resources: str, *, auto: bool = False) -> FakeAgent:
        return self.call(self.master.add_agent(name, resources, auto=auto))

    def from_agent(self, agent: FakeAgent, message: Message) -> None:
        self.call(self.master.from_agent(agent, message))
