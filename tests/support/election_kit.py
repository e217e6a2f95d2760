"""Shared by the election node tests: what a master's ROUTER loop does for its node."""

from __future__ import annotations

from agora.master.election.node import ElectionNode
from agora.sdk.transport import Server, TransportClosed


async def forward(server: Server, node: ElectionNode) -> None:
    """The master's ROUTER loop, reduced to handing peer messages to the node."""
    while True:
        try:
            received = await server.recv()
        except TransportClosed:
            return
        if received.message is not None:
            node.receive(received.message)
