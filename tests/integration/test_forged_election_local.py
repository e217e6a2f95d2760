"""Forged election traffic against `agora local --masters 3` is refused.

The cluster's own user holds an admitted key (it is even an operator), yet it is not a master: an
AppendEntries naming a member as its sender with a huge term, or an InstallSnapshot, must neither
depose the leader nor plant a leader URL for standbys to redirect operators to. Each is logged.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from agora.sdk.discovery import client_key_files
from agora.sdk.messages import AppendEntries, InstallSnapshot
from agora.sdk.transport import CurveClient, ZmqClient
from integration.test_cli import Local, _kill_everything, start_local
from integration.test_cli_ha import _state
from support.polling import wait_for

EVIL = "http://127.0.0.1:9/evil"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-forged"), masters=3)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def _health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/health", timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
        return body


def test_forged_append_entries_and_snapshot_from_a_non_master_are_refused(ha: Local) -> None:
    before = _state(ha)["master_info"]
    leader, epoch = before["master_id"], before["epoch"]
    members = ha.endpoint.split(",")
    standby = next(m for m in members if m != leader)
    files = client_key_files(ha.env)
    assert files is not None, "agora local wrote no key for its user"
    curve = CurveClient(*files)

    async def forge() -> None:
        for target in (standby, leader):
            client = ZmqClient.connect(target, curve=curve)
            try:
                await client.send(
                    AppendEntries(
                        sender=leader if target == standby else standby,
                        term=10**9,
                        prev_log_index=0,
                        prev_log_term=0,
                        leader_http=EVIL,
                    )
                )
                await client.send(
                    InstallSnapshot(
                        sender=standby, term=10**9, last_index=10**6, last_term=10**9, data=b"x"
                    )
                )
                await asyncio.sleep(0.2)  # let the frames leave before the socket closes
            finally:
                client.close()

    asyncio.run(asyncio.wait_for(forge(), 20))

    logs = sorted((ha.work / "logs").glob("master-*.log"))
    refused = wait_for(
        lambda: (
            sum(p.read_text(errors="replace").count("election_traffic_refused") for p in logs) >= 4
            or None
        ),
        timeout=10,
        what="every forged frame logged as refused",
    )
    assert refused
    after = _state(ha)["master_info"]
    assert (after["master_id"], after["epoch"]) == (leader, epoch), "the leader was deposed"
    urls = (ha.home / "master.http").read_text().strip().split(",")
    assert all(_health(u)["leader_http"] != EVIL for u in urls)
