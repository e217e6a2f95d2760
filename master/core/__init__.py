"""The master state machine: ``handle(sender, message, now)`` and ``tick(now)`` return actions."""

from agora.master.core.actions import Action, Peer, Send
from agora.master.core.config import MasterConfig
from agora.master.core.master import Master
from agora.master.core.state import AgentStatus, MasterState

__all__ = ["Action", "AgentStatus", "Master", "MasterConfig", "MasterState", "Peer", "Send"]
