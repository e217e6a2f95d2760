"""A scheduler driver over the Mesos v1 scheduler HTTP API, for ``throughput.py --api mesos``.

It gives a :class:`agora.sdk.Scheduler` the same calls and callbacks as Agora's own driver, so
the same workload runs through either API: a SUBSCRIBE stream read as RecordIO (aiohttp), calls
POSTed in order on one keep-alive connection, every update with a uuid acknowledged explicitly,
as a Mesos framework does. What it costs over Agora's protocol is JSON, HTTP and the master's
translation at the edge.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
from agora.sdk import Filters, Offer, Resources, Scheduler, TaskSpec
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.mesos import resources_from_mesos, resources_to_mesos, task_status_from_mesos

PATH = "/api/v1/scheduler"


class MesosApiDriver:
    def __init__(
        self, scheduler: Scheduler, url: str, name: str, headers: dict[str, str] | None = None
    ) -> None:
        self._scheduler = scheduler
        self._url = url.rstrip("/")
        self._name = name
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._calls: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._stopped = asyncio.Event()
        self.framework_id: FrameworkID | None = None
        self.calls_made = 0

    # --- what the scheduler calls ---------------------------------------------------------
    def launch(self, offer: Offer, specs: Sequence[TaskSpec], filters: Filters) -> None:
        tasks = [
            {
                "name": spec.name,
                "task_id": {"value": spec.task_id or spec.name},
                "agent_id": {"value": offer.agent_id},
                "resources": resources_to_mesos(Resources.parse(str(spec.resources))),
                "command": {"value": spec.command},
            }
            for spec in specs
        ]
        accept = {
            "offer_ids": [{"value": offer.offer_id}],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}],
            "filters": {"refuse_seconds": filters.refuse_seconds},
        }
        self._call("ACCEPT", accept)

    def decline(self, offer_id: str, filters: Filters) -> None:
        decline = {
            "offer_ids": [{"value": offer_id}],
            "filters": {"refuse_seconds": filters.refuse_seconds},
        }
        self._call("DECLINE", decline)

    def stop(self) -> None:
        self._stopped.set()

    def _call(self, kind: str, body: dict[str, Any]) -> None:
        assert self.framework_id is not None
        call = {"type": kind, "framework_id": {"value": self.framework_id}, kind.lower(): body}
        self._calls.put_nowait(call)

    # --- the connection -------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe, then read events and make calls until :meth:`stop`."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as stream_session:
            subscribe = {
                "type": "SUBSCRIBE",
                "subscribe": {"framework_info": {"user": getpass.getuser(), "name": self._name}},
            }
            headers = {**self._headers, "Accept": "application/json"}
            async with stream_session.post(
                self._url + PATH, json=subscribe, headers=headers
            ) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"SUBSCRIBE: {resp.status} {await resp.text()}")
                stream_id = resp.headers["Mesos-Stream-Id"]
                sender = asyncio.create_task(self._send(stream_id))
                reader = asyncio.create_task(self._read(resp.content))
                stopped = asyncio.create_task(self._stopped.wait())
                try:
                    done, _ = await asyncio.wait(
                        [sender, reader, stopped], return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        if task is not stopped and task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                finally:
                    for task in (sender, reader, stopped):
                        task.cancel()
                    await asyncio.gather(sender, reader, stopped, return_exceptions=True)

    async def _send(self, stream_id: str) -> None:
        headers = {**self._headers, "Mesos-Stream-Id": stream_id}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while True:
                call = await self._calls.get()
                if call is None:
                    return
                async with session.post(self._url + PATH, json=call, headers=headers) as resp:
                    if resp.status != 202:
                        raise RuntimeError(f"{call['type']}: {resp.status} {await resp.text()}")
                self.calls_made += 1

    async def _read(self, content: aiohttp.StreamReader) -> None:
        while True:
            line = await content.readline()
            if not line:
                raise RuntimeError("the master closed the event stream")
            event = json.loads(await content.readexactly(int(line)))
            self._dispatch(event)

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "SUBSCRIBED":
            self.framework_id = FrameworkID(event["subscribed"]["framework_id"]["value"])
        elif kind == "OFFERS":
            offers = [_offer(o) for o in event["offers"]["offers"]]
            self._scheduler.offers(self, offers)  # type: ignore[arg-type]
        elif kind == "RESCIND":
            self._scheduler.offer_rescinded(self, event["rescind"]["offer_id"]["value"])  # type: ignore[arg-type]
        elif kind == "UPDATE":
            raw = event["update"]["status"]
            status = task_status_from_mesos(raw)
            self._scheduler.status_update(self, status)  # type: ignore[arg-type]
            if "uuid" in raw:
                ack = {"agent_id": raw["agent_id"], "task_id": raw["task_id"], "uuid": raw["uuid"]}
                self._call("ACKNOWLEDGE", ack)
        elif kind == "ERROR":
            raise RuntimeError(f"the master said: {event['error']['message']}")


def _offer(o: dict[str, Any]) -> Offer:
    resources = resources_from_mesos(o["resources"])
    role = o["resources"][0].get("allocation_info", {}).get("role", "*") if o["resources"] else "*"
    return Offer(
        offer_id=OfferID(o["id"]["value"]),
        framework_id=FrameworkID(o["framework_id"]["value"]),
        agent_id=AgentID(o["agent_id"]["value"]),
        hostname=o["hostname"],
        resources=resources,
        role=role,
    )
