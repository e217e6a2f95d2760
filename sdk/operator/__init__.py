"""The operator client: read the master's state and make operator calls (kill a task, set weights
and quota, drain an agent or mark it gone, tear a framework down).

Each call opens its own short-lived connection, so a client object is cheap, holds no socket
between calls and may be used from any event loop (or from plain code via the ``*_sync``
wrappers, which must not be called from a running event loop)::

    client = OperatorClient(master_address(None))
    state = client.get_state_sync()
    client.kill_sync("task-7")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

from agora.sdk.discovery import parse_masters
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.logs import default_logging
from agora.sdk.messages import Error, ErrorCode, Message
from agora.sdk.messages.operator import (
    OPERATOR_CALLS,
    DrainAgent,
    GetState,
    MarkAgentGone,
    OperatorDone,
    OperatorKill,
    ReactivateAgent,
    ReserveResources,
    RoleWeight,
    StateReply,
    TeardownFramework,
    UnreserveResources,
    UpdateQuota,
    UpdateWeights,
)
from agora.sdk.resources import Resources
from agora.sdk.transport import MasterLink, discover_client

if TYPE_CHECKING:
    from agora.sdk.transport.curve import CurveClient

__all__ = ["DEFAULT_TIMEOUT", "OperatorClient", "OperatorError"]

DEFAULT_TIMEOUT = 5.0

_Answer = TypeVar("_Answer", StateReply, OperatorDone)


class OperatorError(RuntimeError):
    """The master refused an operator call (unknown task, forbidden, ...)."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


class OperatorClient:
    """Operator calls to the master at ``master`` (``curve``: credentials when CURVE is on; by
    default this user's keys in ``$AGORA_HOME/keys`` if ``agora local`` wrote them)."""

    def __init__(self, master: str, *, curve: CurveClient | None = None) -> None:
        self.master = master
        self._curve = curve if curve is not None else discover_client()
        # A library prints nothing on the program's stdout: unless the program set up logging,
        # only warnings and errors, on stderr (as the drivers do).
        default_logging()

    async def get_state(
        self, timeout: float = DEFAULT_TIMEOUT, *, query: GetState | None = None
    ) -> StateReply:
        """A snapshot of agents, frameworks and tasks; ``query`` limits and filters the rows
        (a console on a big cluster: see GetState). TimeoutError when the master is silent."""
        return await self._exchange(query or GetState(), StateReply, timeout)

    async def call(self, message: Message, timeout: float = DEFAULT_TIMEOUT) -> OperatorDone:
        """Make one operator call; its answer once it took effect (calls that change the
        registry answer once the change is committed). OperatorError when the master refuses
        it; TimeoutError when no answer came (then the call may still take effect)."""
        if not isinstance(message, OPERATOR_CALLS):
            raise TypeError(f"{type(message).__name__} is not an operator call")
        return await self._exchange(message, OperatorDone, timeout)

    async def kill(
        self,
        task_id: TaskID | str,
        framework_id: FrameworkID | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Kill a live task as if its framework asked (``framework_id`` disambiguates).

        Returns once the master has taken the call (the task's end arrives to its framework
        as usual); raises OperatorError when the master refuses it (e.g. UNKNOWN_TASK).
        """
        fid = FrameworkID(framework_id) if framework_id is not None else None
        await self.call(OperatorKill(task_id=TaskID(task_id), framework_id=fid), timeout)

    async def update_weights(
        self, weights: Mapping[str, float], timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        """Set the DRF weight of each role named (> 0; the others keep theirs)."""
        pairs = tuple(RoleWeight(role=r, weight=w) for r, w in sorted(weights.items()))
        return await self.call(UpdateWeights(weights=pairs), timeout)

    async def update_quota(
        self,
        role: str,
        guarantee: Resources | str,
        limit: Resources | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> OperatorDone:
        """Set ``role``'s quota: a scalar guarantee (``"cpus:4;mem:8192"``) and maybe a limit."""
        g = Resources.parse(guarantee) if isinstance(guarantee, str) else guarantee
        lim = Resources.parse(limit) if isinstance(limit, str) else limit
        return await self.call(UpdateQuota(role=role, guarantee=g, limit=lim), timeout)

    async def remove_quota(self, role: str, timeout: float = DEFAULT_TIMEOUT) -> OperatorDone:
        return await self.call(UpdateQuota(role=role), timeout)

    async def drain_agent(
        self,
        agent_id: AgentID | str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        deadline: float | None = None,
    ) -> OperatorDone:
        """No new offers on the agent; what runs there runs on, until ``deadline`` (seconds
        since the epoch) if given: then it is killed (reason AGENT_DRAINING)."""
        return await self.call(DrainAgent(agent_id=AgentID(agent_id), deadline=deadline), timeout)

    async def reactivate_agent(
        self, agent_id: AgentID | str, timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        return await self.call(ReactivateAgent(agent_id=AgentID(agent_id)), timeout)

    async def reserve_resources(
        self, agent_id: AgentID | str, resources: Resources | str, timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        """Reserve free resources of the agent to their role (``"cpus(db):2;mem(db):1024"``)."""
        res = Resources.parse(resources) if isinstance(resources, str) else resources
        return await self.call(ReserveResources(agent_id=AgentID(agent_id), resources=res), timeout)

    async def unreserve_resources(
        self, agent_id: AgentID | str, resources: Resources | str, timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        """Give back resources dynamically reserved on the agent (``"cpus(db):1"``)."""
        res = Resources.parse(resources) if isinstance(resources, str) else resources
        msg = UnreserveResources(agent_id=AgentID(agent_id), resources=res)
        return await self.call(msg, timeout)

    async def mark_agent_gone(
        self, agent_id: AgentID | str, timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        """The agent is gone for good: its tasks end GONE_BY_OPERATOR; it may not come back."""
        return await self.call(MarkAgentGone(agent_id=AgentID(agent_id)), timeout)

    async def teardown_framework(
        self, framework_id: FrameworkID | str, timeout: float = DEFAULT_TIMEOUT
    ) -> OperatorDone:
        """Remove the framework: its offers are rescinded and its tasks killed."""
        return await self.call(TeardownFramework(framework_id=FrameworkID(framework_id)), timeout)

    def get_state_sync(self, timeout: float = DEFAULT_TIMEOUT) -> StateReply:
        _no_running_loop("get_state_sync")
        return asyncio.run(self.get_state(timeout))

    def kill_sync(
        self,
        task_id: TaskID | str,
        framework_id: FrameworkID | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        _no_running_loop("kill_sync")
        asyncio.run(self.kill(task_id, framework_id, timeout))

    async def _exchange(self, message: Message, answer: type[_Answer], timeout: float) -> _Answer:
        """Send ``message``; an ERROR raises, else the first ``answer`` is the answer."""
        client = MasterLink.connect(parse_masters(self.master), curve=self._curve)
        deadline = time.monotonic() + timeout
        try:
            try:
                await client.wait_leader(timeout)
            except TimeoutError:
                why = client.handshake_error
                detail = f" ({why})" if why else " (no master says it leads)"
                raise TimeoutError(
                    f"no answer from the master at {self.master} in {timeout}s{detail}"
                ) from None
            await client.send(message)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer from the master at {self.master} in {timeout}s")
                try:
                    async with asyncio.timeout(left):
                        received = await client.recv()
                except TimeoutError:
                    why = client.handshake_error
                    detail = f" ({why})" if why else ""
                    raise TimeoutError(
                        f"no answer from the master at {self.master} in {timeout}s{detail}"
                    ) from None
                reply = received.message
                if isinstance(reply, Error):
                    raise OperatorError(reply.message, reply.code)
                if isinstance(reply, answer):
                    return reply
                # anything else (a master HEARTBEAT, say) is not an answer: keep waiting
        finally:
            client.close()


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"OperatorClient.{name} blocks: inside an event loop, await the async call")
