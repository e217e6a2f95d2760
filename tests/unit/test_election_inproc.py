"""Three election nodes in one process over the in-process transport (the node takes its links
to the other members as a parameter): a leader is elected, a proposal commits on every member,
and when the leader's links are cut the others elect a new one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from agora.master.election.node import ElectionNode
from agora.master.election.storage import RaftStorage
from agora.master.election.types import RaftConfig, Role
from agora.sdk.messages import LogEntry
from agora.sdk.transport import InprocClient, InprocHub
from support.election_kit import forward

MEMBERS = ("m1", "m2", "m3")
FAST = {"election_timeout": 0.3, "heartbeat_interval": 0.03}


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.01)


def test_a_group_in_one_process_elects_replicates_and_fails_over(tmp_path: Path) -> None:
    async def main() -> None:
        hub = InprocHub()
        applied: dict[str, list[bytes]] = {m: [] for m in MEMBERS}
        links: dict[str, list[InprocClient]] = {m: [] for m in MEMBERS}
        nodes: dict[str, ElectionNode] = {}
        forwarders: list[asyncio.Task[None]] = []
        servers = [hub.server(m) for m in MEMBERS]

        def link_of(me: str) -> Callable[[str], InprocClient]:
            def link(member: str) -> InprocClient:
                client = hub.client(member)
                links[me].append(client)
                return client

            return link

        def apply_to(me: str) -> Callable[[LogEntry], None]:
            return lambda entry: applied[me].append(entry.data) if entry.data else None

        try:
            for me, server in zip(MEMBERS, servers, strict=True):
                node = ElectionNode(
                    RaftConfig(node_id=me, members=MEMBERS, **FAST),  # type: ignore[arg-type]
                    RaftStorage(tmp_path / me),
                    apply=apply_to(me),
                    restore=lambda data: None,
                    take_snapshot=lambda: b"",
                    peer_link=link_of(me),
                )
                await node.start()
                nodes[me] = node
                forwarders.append(asyncio.create_task(forward(server, node)))

            def leaders() -> list[str]:
                return [m for m, n in nodes.items() if n.role is Role.LEADER]

            await _until(lambda: len(leaders()) == 1, "a leader")
            (first,) = leaders()
            await nodes[first].propose(b"one", timeout=5.0)
            await _until(lambda: all(a == [b"one"] for a in applied.values()), "replicated")

            for client in links[first]:  # the leader can no longer reach anyone
                hub.disconnect(client)
            await _until(
                lambda: any(m != first for m in leaders()), "a new leader among the others"
            )
        finally:
            for task in forwarders:
                task.cancel()
            await asyncio.gather(*forwarders, return_exceptions=True)
            for node in nodes.values():
                await node.stop()
            for server in servers:
                server.close()

    asyncio.run(asyncio.wait_for(main(), 30.0))
