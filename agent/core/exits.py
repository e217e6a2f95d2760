"""EXITED_EXECUTOR, sent until the master acknowledges it.

The master frees an executor's resources (and tells its framework) when it hears that the
executor exited. A lost EXITED_EXECUTOR would leave them allocated until the agent next
re-registered, and nothing makes a connected agent re-register. So the agent keeps each exit
until an EXITED_EXECUTOR_ACK names it, sending it again on the status-update retry schedule
(doubling up to its cap) while registered. A master that hears one twice changes nothing the
second time. An exit is no longer sent once a successor with the same id is launched: a late
copy must not take the successor's place at the master. Exits are not checkpointed: a restarted
agent re-registers, and the master drops the executors its report leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass

from agora.agent.core.state import AgentState, ExecutorKey
from agora.sdk.messages import ExitedExecutor, ExitedExecutorAck

__all__ = ["PendingExit", "exited", "forget", "on_ack", "tick_exits"]


@dataclass(slots=True)
class PendingExit:
    message: ExitedExecutor
    next_at: float
    interval: float


def exited(st: AgentState, message: ExitedExecutor, now: float) -> None:
    """Tell the master, and keep telling it until it acknowledges."""
    interval = st.config.status_update_retry
    st.exits[(message.framework_id, message.executor_id)] = PendingExit(
        message, now + interval, interval
    )
    st.to_master(message)


def forget(st: AgentState, key: ExecutorKey) -> None:
    """A successor with the same id was launched: the old exit is not sent again."""
    st.exits.pop(key, None)


def on_ack(st: AgentState, msg: ExitedExecutorAck, _now: float) -> None:
    st.exits.pop((msg.framework_id, msg.executor_id), None)


def tick_exits(st: AgentState, now: float) -> None:
    if not st.registered:
        return  # re-registration settles what the master tracks
    cap = st.config.status_update_retry_max
    for pending in st.exits.values():
        if now >= pending.next_at:
            st.to_master(pending.message)
            pending.interval = min(pending.interval * 2, cap)
            pending.next_at = now + pending.interval
