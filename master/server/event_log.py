"""The master's log lines for the calls and events an operator follows (a kill's every hop, who
registered, who subscribed, operator calls), with the fields that say which."""

from __future__ import annotations

from typing import Final

import structlog
from agora.master.core import Master, Send
from agora.sdk.messages import (
    OPERATOR_CALLS,
    AgentRegistered,
    AgentReregistered,
    Kill,
    KillTask,
    Message,
    OperatorKill,
    Subscribed,
    Teardown,
    UnregisterAgent,
)

__all__ = ["LOGGED_CALLS", "LOGGED_EVENTS", "log_call", "log_event"]

log = structlog.get_logger("agora.master.server.daemon")

#: Messages sent to a peer that are logged, and the event name of each.
LOGGED_EVENTS: Final[dict[type[Message], str]] = {
    AgentRegistered: "agent_registered",
    AgentReregistered: "agent_reregistered",
    KillTask: "kill_sent",
    Subscribed: "framework_subscribed",
}

#: Calls received that are logged, and the event name of each.
LOGGED_CALLS: Final[dict[type[Message], str]] = {
    Kill: "kill_received",
    Teardown: "framework_teardown",
    UnregisterAgent: "agent_unregistering",
    **{call: "operator_call" for call in OPERATOR_CALLS},
}


def log_call(peer: str, message: Message) -> None:
    """Log ``message`` from ``peer`` if it is one of :data:`LOGGED_CALLS`."""
    event = LOGGED_CALLS.get(type(message))
    if event is not None:
        log.info(event, peer=peer, **_fields(message))


def log_event(core: Master | None, action: Send) -> None:
    """Log what the core sends, if it is one of :data:`LOGGED_EVENTS`."""
    message = action.message
    if core is None or type(message) not in LOGGED_EVENTS:
        return
    if isinstance(message, AgentRegistered | AgentReregistered):
        agent = core.agent(message.agent_id)
        log.info(
            LOGGED_EVENTS[type(message)],
            agent_id=message.agent_id,
            hostname=agent.info.hostname if agent is not None else None,
            peer=action.to,
        )
    elif isinstance(message, KillTask):
        log.info(
            "kill_sent",
            framework_id=message.framework_id,
            task_id=message.task_id,
            kill_id=message.kill_id,
            agent_id=core.agent_id_of(action.to),
            peer=action.to,
        )
    elif isinstance(message, Subscribed):
        fw = core.framework(message.framework_id)
        log.info(
            "framework_subscribed",
            framework_id=message.framework_id,
            name=fw.info.name if fw is not None else None,
            roles=list(fw.info.roles) if fw is not None else None,
            peer=action.to,
        )


def _fields(message: Message) -> dict[str, object]:
    if isinstance(message, Teardown):
        return {"framework_id": message.framework_id}
    if isinstance(message, Kill):
        return {
            "framework_id": message.framework_id,
            "task_id": message.task_id,
            "agent_id": message.agent_id,
            "kill_id": message.kill_id,
        }
    if isinstance(message, OperatorKill):
        return {
            "call": message.NAME,
            "task_id": message.task_id,
            "framework_id": message.framework_id,
        }
    if isinstance(message, OPERATOR_CALLS):
        return {"call": message.NAME, "args": repr(message)}
    return {}
