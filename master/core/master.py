"""The master core: every stimulus in, the actions it causes out.

``Master`` is the only public entry point. The daemon feeds it decoded
messages with the sender's peer name and the current time, reports lost
connections, and calls ``tick`` regularly; it then performs the returned
``Send`` actions. Nothing here does I/O or reads a clock, so a test can drive
thousands of agents through it deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agora.master.allocator import Allocator
from agora.master.core import (
    agents,
    frameworks,
    launch,
    maintenance,
    offers,
    operator,
    operator_calls,
    reclaim,
    recovery,
    tasks,
)
from agora.master.core.actions import Action, Notice, Peer
from agora.master.core.config import MasterConfig
from agora.master.core.prompt import prompt_allocation
from agora.master.core.state import Agent, AgentStatus, Framework, MasterState
from agora.master.core.view import StateView
from agora.master.registry import Registry
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    OPERATOR_CALLS,
    Accept,
    AcceptInverseOffers,
    Acknowledge,
    Decline,
    DeclineInverseOffers,
    Error,
    ErrorCode,
    ExecutorToFramework,
    ExitedExecutor,
    GetState,
    Heartbeat,
    Kill,
    Message,
    Pong,
    Reconcile,
    RegisterAgent,
    Request,
    ReregisterAgent,
    Revive,
    SendMessage,
    Shutdown,
    StatusUpdateMessage,
    Subscribe,
    Suppress,
    Teardown,
    UnregisterAgent,
)
from agora.sdk.messages.batching import unbatch

__all__ = ["Master"]

_FrameworkHandler = Callable[[MasterState, Peer, Framework, Any, float], None]
_AgentHandler = Callable[[MasterState, Agent, Any, float], None]

#: Calls a subscribed scheduler may make, each naming its framework.
_FRAMEWORK_CALLS: dict[type[Any], _FrameworkHandler] = {
    Accept: lambda st, _p, fw, m, now: launch.on_accept(st, fw, m, now),
    Decline: lambda st, _p, fw, m, now: launch.on_decline(st, fw, m, now),
    Revive: lambda st, _p, fw, m, _now: frameworks.on_revive(st, fw, m),
    Suppress: lambda st, _p, fw, m, _now: frameworks.on_suppress(st, fw, m),
    Kill: lambda st, _p, fw, m, now: tasks.on_kill(st, fw, m, now),
    Shutdown: lambda st, _p, fw, m, _now: tasks.on_shutdown(st, fw, m),
    Acknowledge: lambda st, _p, fw, m, _now: tasks.on_acknowledge(st, fw, m),
    Reconcile: lambda st, _p, fw, m, now: tasks.on_reconcile(st, fw, m, now),
    SendMessage: lambda st, _p, fw, m, _now: tasks.on_message(st, fw, m),
    Request: lambda st, p, fw, m, now: frameworks.on_request(st, p, fw, m, now),
    AcceptInverseOffers: lambda st, _p, fw, m, now: maintenance.on_answer(st, fw, m, now),
    DeclineInverseOffers: lambda st, _p, fw, m, now: maintenance.on_answer(st, fw, m, now),
    Teardown: lambda st, _p, fw, _m, now: frameworks.remove_framework(
        st, fw, now, reason="torn down by its scheduler"
    ),
}

#: Messages a registered agent may send.
_AGENT_MESSAGES: dict[type[Any], _AgentHandler] = {
    StatusUpdateMessage: tasks.on_status_update,
    Pong: lambda st, agent, msg, _now: agents.on_pong(st, agent, msg),
    ExitedExecutor: tasks.on_exited_executor,
    ExecutorToFramework: lambda st, agent, m, _now: tasks.on_executor_message(st, agent, m),
    UnregisterAgent: lambda st, agent, _m, now: agents.on_unregister(st, agent, now),
}


class Master:
    """The master's state machine (sans-IO)."""

    def __init__(
        self,
        config: MasterConfig | None = None,
        allocator: Allocator | None = None,
        *,
        registry: Registry | None = None,
        now: float = 0.0,
    ) -> None:
        """A core for one term. ``registry``: the replicated registry as of this master's
        election (shared with the daemon, which applies committed operations to it); agents and
        frameworks in it are expected back, and allocation waits for them (see ``recovery``)."""
        cfg = config or MasterConfig()
        alloc = allocator or Allocator(cfg.allocator)
        for role, weight in cfg.weights.items():
            alloc.set_weight(role, weight)
        for role, (guarantee, limit) in cfg.quotas.items():
            alloc.set_quota(role, guarantee, limit)
        self._st = MasterState(config=cfg, allocator=alloc, registry=registry or Registry())
        self._st.leader_since = now
        recovery.activate(self._st, now)

    @property
    def state(self) -> MasterState:
        """Read-only view for introspection and tests; mutate only through stimuli."""
        return self._st

    @property
    def epoch(self) -> int:
        return self._st.config.epoch

    # ------------------------------------------------------------------ reads, for the shells

    @property
    def address(self) -> str:
        """The endpoint this master serves clients on."""
        return self._st.config.address

    def view(self) -> StateView:
        """What the master shows readers (GET_STATE, ``/state``, metrics): read it at once."""
        return StateView(self._st)

    def agent(self, agent_id: AgentID) -> Agent | None:
        """The agent with this id, whatever its status; None if unknown."""
        return self._st.agents.get(agent_id)

    def agent_id_of(self, peer: Peer) -> AgentID | None:
        """The id of the agent registered from ``peer``, if any."""
        return self._st.agents_by_peer.get(peer)

    def framework(self, framework_id: FrameworkID) -> Framework | None:
        """The live framework with this id; None if unknown or completed."""
        return self._st.frameworks.get(framework_id)

    def handle(self, sender: Peer, message: Message, now: float) -> list[Action]:
        """One decoded message from ``sender``.

        What the message freed is offered at once, unless the config says the shell feeds
        messages in bursts (``MasterConfig.bursts``): then once per burst, by :meth:`end_burst`.
        """
        for part in unbatch(message):  # a batch is handled as the messages it carries
            self._dispatch(sender, part, now)
        return self._finish(now, not self._st.config.bursts)

    def end_burst(self, now: float) -> list[Action]:
        """The shell has handled a burst of messages: one event-triggered allocation pass over
        the agents whose free resources they changed, so a thousand finishing tasks make a few
        offers rather than a thousand small ones. Call it after every burst (with
        ``MasterConfig.bursts`` on, ``handle`` leaves allocation to it)."""
        return self._finish(now)

    def _dispatch(self, sender: Peer, message: Message, now: float) -> None:
        st = self._st
        if isinstance(message, Subscribe):
            frameworks.on_subscribe(st, sender, message, now)
        elif isinstance(message, RegisterAgent):
            agents.on_register(st, sender, message, now)
        elif isinstance(message, ReregisterAgent):
            agents.on_reregister(st, sender, message, now)
        elif isinstance(message, GetState):
            operator.on_get_state(st, sender, message)
        elif isinstance(message, OPERATOR_CALLS):
            # Who may do this is the daemon's decision (its ACL); the core only carries it out.
            operator_calls.on_operator_call(st, sender, message, now)
        elif type(message) in _FRAMEWORK_CALLS:
            fw = frameworks.authorized(st, sender, message.framework_id)  # type: ignore[attr-defined]
            if fw is not None:
                _FRAMEWORK_CALLS[type(message)](st, sender, fw, message, now)
        elif type(message) in _AGENT_MESSAGES:
            agent = self._agent_of(sender)
            if agent is not None:
                _AGENT_MESSAGES[type(message)](st, agent, message, now)
            # Anything from an agent that is unknown or unreachable is dropped: it must
            # (re-)register first (Mesos: updates from a removed agent are dropped).
        else:
            st.send(
                sender,
                Error(
                    message=f"{type(message).__name__} is not a call a master accepts",
                    code=ErrorCode.BAD_REQUEST,
                ),
            )

    def committed(self, seq: int, now: float) -> list[Action]:
        """The registry operation of ``Propose(seq)`` is committed (and applied to the registry):
        let it take effect. Like :meth:`handle`, what it frees is offered by :meth:`end_burst`
        when the shell feeds the core in bursts (a storm of registrations commits thousands)."""
        pending = self._st.pending.pop(seq, None)
        if pending is not None and pending.then is not None:
            pending.then(now)
        return self._finish(now, not self._st.config.bursts)

    def abandoned(self, seq: int, now: float) -> list[Action]:
        """``Propose(seq)`` will not commit under this core: its change never takes effect."""
        pending = self._st.pending.pop(seq, None)
        if pending is not None and pending.abandon is not None:
            pending.abandon()
        return self._finish(now, not self._st.config.bursts)

    def disconnected(self, peer: Peer, now: float) -> list[Action]:
        """The transport lost ``peer`` (a scheduler's connection closed or timed out)."""
        frameworks.disconnect(self._st, peer, now)
        return self._finish(now)

    def notices(self) -> list[Notice]:
        """What happened since the last call that an operator should read in the log."""
        out = list(self._st.notices)
        self._st.notices.clear()
        return out

    def tick(self, now: float) -> list[Action]:
        """Timers: pings, failover and offer timeouts, gang holds, heartbeats, batch allocation."""
        st = self._st
        cfg = st.config
        if now >= st.next_ping_at:
            st.next_ping_at = now + cfg.agent_ping_interval
            agents.ping_agents(st, now)
            agents.gc_unreachable(st, now)
        recovery.expire_recovery(st, now)
        frameworks.expire_failovers(st, now)
        offers.expire_offers(st, now)
        offers.expire_gangs(st, now)
        maintenance.tick(st, now)  # inverse offers, windows that start, drain deadlines
        if now >= st.next_heartbeat_at:
            st.next_heartbeat_at = now + cfg.heartbeat_interval
            for framework_id in list(st.frameworks):
                st.send_framework(framework_id, Heartbeat())
        if not recovery.allocation_allowed(st, now):
            pass  # after a failover: wait for the agents to come back (see recovery)
        elif st.full_allocation_due or now >= st.next_batch_at:
            st.full_allocation_due = False
            st.next_batch_at = now + cfg.allocation_interval
            st.dirty_agents.clear()
            offers.allocate(st, now, None)
            reclaim.reclaim(st, now)
        return self._finish(now)

    def _agent_of(self, sender: Peer) -> Agent | None:
        agent_id = self._st.agents_by_peer.get(sender)
        if agent_id is None:
            return None
        agent = self._st.agents[agent_id]
        return agent if agent.status is AgentStatus.ACTIVE else None

    def _finish(self, now: float, allocate: bool = True) -> list[Action]:
        """Event-triggered allocation on agents whose free resources changed, then drain."""
        st = self._st
        if allocate and prompt_allocation(st, now):
            pass  # a full pass covered the dirty agents too
        elif allocate and st.dirty_agents and recovery.allocation_allowed(st, now):
            dirty = sorted(st.dirty_agents)
            st.dirty_agents.clear()
            offers.allocate(st, now, dirty)
        out, st.outbox = st.outbox, []
        return out
