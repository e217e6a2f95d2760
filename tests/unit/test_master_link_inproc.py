"""The master link takes how to dial a master as a parameter: over the in-process transport it
finds a single master daemon in the same process and carries calls and answers."""

from __future__ import annotations

import asyncio

from agora.master.core import Master, MasterConfig
from agora.master.server.daemon import MasterDaemon
from agora.sdk.messages import GetState, StateReply
from agora.sdk.transport import InprocClient, InprocHub, MasterLink

DEADLINE = 10.0


def test_the_link_follows_a_master_in_the_same_process() -> None:
    async def main() -> None:
        hub = InprocHub()
        server = hub.server("master")
        daemon = MasterDaemon(Master(MasterConfig()), server, tick_interval=0.01, peer_timeout=60.0)
        running = asyncio.create_task(daemon.run())
        dialled: list[str] = []

        def dial(endpoint: str, up: object, down: object) -> InprocClient:
            dialled.append(endpoint)
            name = endpoint.split("://", 1)[1]
            return hub.client(name, on_connected=up, on_disconnected=down)  # type: ignore[arg-type]

        link = MasterLink.connect(["inproc-hub://master"], dial=dial)
        try:
            async with asyncio.timeout(DEADLINE):
                while not link.connected:
                    await asyncio.sleep(0.01)
            assert link.handshake_error is None
            await link.send(GetState())
            async with asyncio.timeout(DEADLINE):
                while not isinstance((await link.recv()).message, StateReply):
                    pass
            assert dialled == ["inproc-hub://master"]
        finally:
            link.close()
            daemon.stop()
            assert await asyncio.wait_for(running, DEADLINE) == 0
            server.close()

    asyncio.run(asyncio.wait_for(main(), 30.0))
