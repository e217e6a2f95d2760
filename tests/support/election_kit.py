"""Shared by the election node tests: what a master's ROUTER loop does for its node."""

from __future__ import annotations

import functools

from agora.master.election.node import ElectionNode
from agora.sdk.transport import Server, TransportClosed


async def forward(
    server: Server, node: ElectionNode, *, answer_back: bool = True, seen: list[str] | None = None
) -> None:
    """The master's ROUTER loop, reduced to handing peer messages to the node, with the way back
    over each one's connection (none without ``answer_back``: answers then take the replier's
    own link). ``seen``: the names of the messages this socket received, appended as they come."""
    while True:
        try:
            received = await server.recv()
        except TransportClosed:
            return
        message = received.message
        if message is None:
            continue
        if seen is not None:
            seen.append(message.NAME)
        reply = functools.partial(server.try_send, received.peer) if answer_back else None
        node.receive(message, reply)
