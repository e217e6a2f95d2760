"""A leader stopped (SIGSTOP) past the election timeout is replaced; the moment it resumes, before
it has heard of the new leader, it must not say it leads: its lease ran out while it was stopped.

The requests are written while it is stopped, on connections it accepted before, so they are the
first thing it reads when it resumes (SIGCONT), together with whatever the other masters sent.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from agora.sdk.messages import DetectLeader, LeaderInfo
from agora.sdk.transport import ZmqClient
from prometheus_client.parser import text_string_to_metric_families
from support.master_http_group import DEADLINE, HttpGroup, RawRequest, http_group
from support.polling import wait_for

#: Stop/resume rounds: each stops whoever leads then.
ROUNDS = 2


async def _detect(client: ZmqClient) -> LeaderInfo:
    await client.send(DetectLeader())
    return await _answer(client)


async def _answer(client: ZmqClient) -> LeaderInfo:
    async with asyncio.timeout(DEADLINE):
        info = (await client.recv()).message
    assert isinstance(info, LeaderInfo)
    return info


def _elected(metrics: str) -> float:
    for family in text_string_to_metric_families(metrics):
        if family.name == "agora_master_elected":
            return family.samples[0].value
    raise AssertionError(f"no agora_master_elected in {metrics!r}")


async def _stop_and_resume(g: HttpGroup) -> None:
    old, epoch = wait_for(lambda: g.leader(), timeout=20, what="a leader")
    url = g.http_url(old)
    client = ZmqClient.connect(old)
    try:
        assert (await _detect(client)).leader == old  # the link is up before the stop
        requests = {path: RawRequest(url, path) for path in ("/health", "/metrics", "/state")}
        g.signal(old, signal.SIGSTOP)
        try:
            others = [e for e in g.procs if e != old]
            new, new_epoch = wait_for(lambda: g.leader(others), timeout=20, what="a new leader")
            assert new_epoch > epoch
            for request in requests.values():
                request.send()
            await client.send(DetectLeader())
        finally:
            g.signal(old, signal.SIGCONT)
        answers = {path: request.response() for path, request in requests.items()}
        status, body = answers["/health"]
        health = json.loads(body)
        assert status == 200 and health["leading"] is False, health
        assert health["leader"] in (None, new), health
        status, body = answers["/metrics"]
        assert status == 200 and _elected(body) == 0
        status, body = answers["/state"]
        assert status in (307, 503), (status, body)
        assert json.loads(body)["error"] == "this master is not the leader"
        info = await _answer(client)
        assert info.leader != old, info
    finally:
        client.close()
    # It then learns of the new leader and follows it.
    wait_for(
        lambda: (g.health(old) or {}).get("leader") == new and g.leader() == (new, new_epoch),
        timeout=20,
        what="the old leader following the new one",
    )


def test_a_leader_resumed_after_being_deposed_says_at_once_that_it_does_not_lead(
    tmp_path: Path,
) -> None:
    with http_group(tmp_path) as g:
        for _ in range(ROUNDS):
            asyncio.run(_stop_and_resume(g))
