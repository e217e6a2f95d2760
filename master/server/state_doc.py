"""The ``/state`` document: the master's state view (:mod:`agora.master.core.view`) as JSON,
encoded with orjson.

At 10,000 agents and 20,000 tasks the document is about 9 MB: building it through the snapshot
records and ``Resources.to_dict`` took most of a second. Here every row is one dict made from the
view's rows, which are the core's own objects; resource values, which are immutable and repeat,
are turned into JSON once (:meth:`Resources.json_view`); an agent's allocated and reserved parts
are remembered until its total or free resources change; and the garbage collector is kept out
of the build, which makes hundreds of thousands of short-lived objects and no cycles.

At 10,000 agents and 100,000 tasks the build still takes a few hundred milliseconds, too long
for one turn of the event loop that also carries the election's heartbeats (a leader that
stops answering for an election timeout is replaced). So the HTTP handlers build it with
:meth:`StateDocument.build_async`, :data:`ROWS_PER_TURN` agent or task rows per turn. The lists
of agents and tasks are taken in one turn; each row is read when it is built, so a task that
changes meanwhile shows its newer state (as a Mesos master's state is as of its own moment).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import orjson
from agora.master.core import Master
from agora.master.core.state import Agent, Task
from agora.master.core.view import FrameworkRow, StateView
from agora.master.server.stats import DaemonStats
from agora.sdk.messages import ContainerUsage, MasterMember, RoleSummary
from agora.sdk.resources import Resources

__all__ = ["ROWS_PER_TURN", "StateDocument"]

#: Agent or task rows built per turn of the event loop by :meth:`StateDocument.build_async`
#: (some 10 ms of work).
ROWS_PER_TURN = 5_000


class StateDocument:
    """Builds ``/state`` for one master; keeps per-agent derived values between requests."""

    def __init__(self) -> None:
        #: agent id -> (its total, its free, allocated JSON, reserved JSON), while both hold.
        self._agents: dict[str, tuple[Resources, Resources, object, object]] = {}

    async def encode(
        self, core: Master, stats: DaemonStats, masters: tuple[MasterMember, ...]
    ) -> bytes:
        with _gc_paused():  # (through the encoding too: the rows are alive until then)
            document = await self.build_async(core, stats, masters)
            return orjson.dumps(document)

    def build(
        self, core: Master, stats: DaemonStats, masters: tuple[MasterMember, ...] = ()
    ) -> dict[str, Any]:
        """The document, in one go."""
        document: dict[str, Any] = {}
        for _ in self._steps(core, stats, masters, document):
            pass
        return document

    async def build_async(
        self, core: Master, stats: DaemonStats, masters: tuple[MasterMember, ...] = ()
    ) -> dict[str, Any]:
        """The document, :data:`ROWS_PER_TURN` rows per turn of the event loop."""
        document: dict[str, Any] = {}
        for _ in self._steps(core, stats, masters, document):
            await asyncio.sleep(0)
        return document

    def _steps(
        self,
        core: Master,
        stats: DaemonStats,
        masters: tuple[MasterMember, ...],
        out: dict[str, Any],
    ) -> Iterator[None]:
        """Fill ``out``, yielding between slices of rows. The collector stays off until the
        whole document is built: its rows live until it is sent, and a collection after each
        slice would walk all the rows made so far again."""
        with _gc_paused():
            view = core.view()
            info = view.master_info
            now = time.time()
            tasks_by_framework = view.task_states()
            rows = view.frameworks()
            agents = view.agents()
            tasks = view.tasks(rows)
            agent_rows: list[dict[str, Any]] = []
            task_rows: list[dict[str, Any]] = []
            out.update(
                {
                    "cluster": view.cluster,
                    "insecure": view.insecure,
                    "master": {
                        "id": info.master_id,
                        "epoch": info.epoch,
                        "address": info.address,
                        "uptime": stats.uptime(),
                        "leader_since": view.leader_since,
                        "elected": True,
                    },
                    "masters": [
                        {
                            "address": m.address,
                            "role": m.role,
                            "reachable": m.reachable,
                            "last_contact": m.last_contact,
                        }
                        for m in masters
                    ],
                    "agents": agent_rows,
                    "frameworks": [_framework(row, tasks_by_framework) for row in rows],
                    "tasks": task_rows,
                    "offers": _offers(view, now),
                    "roles": [_role(r) for r in view.roles()],
                    "maintenance": [msgspec.to_builtins(w) for w in view.maintenance()],
                }
            )
            if len(self._agents) > len(agents):  # forget agents that are gone
                known = {agent.agent_id for agent in agents}
                self._agents = {aid: v for aid, v in self._agents.items() if aid in known}
            for start in range(0, len(agents), ROWS_PER_TURN):
                yield
                agent_rows.extend(
                    self._agent(view, a) for a in agents[start : start + ROWS_PER_TURN]
                )
            for start in range(0, len(tasks), ROWS_PER_TURN):
                yield
                task_rows.extend(_task(t) for t in tasks[start : start + ROWS_PER_TURN])

    def _agent(self, view: StateView, agent: Agent) -> dict[str, Any]:
        aid = agent.agent_id
        total = agent.info.resources
        allocated: object = _EMPTY
        reserved: object = _EMPTY
        held = view.held(agent)
        if held is not None:
            held_total, free = held
            known = self._agents.get(aid)
            if known is not None and known[0] is held_total and known[1] is free:
                allocated, reserved = known[2], known[3]
            else:
                allocated = (held_total - free).json_view()
                reserved = (held_total - held_total.unreserved()).json_view()
                self._agents[aid] = (held_total, free, allocated, reserved)
        elif total.roles() - {"*"}:
            reserved = (total - total.unreserved()).json_view()
        info = agent.info
        return {
            "id": aid,
            "hostname": info.hostname,
            "port": info.port,
            "http_port": info.http_port,
            "address": info.address,
            "status": agent.status.value,
            "resources": total.json_view(),
            "allocated": allocated,
            "reserved": reserved,
            "draining": view.draining(agent),
            "drained": view.drained(agent),
            "drain_deadline": view.drain_deadline(agent),
            "attributes": dict(info.attributes),
        }


def _framework(row: FrameworkRow, tasks: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    fw = row.framework
    info = fw.info
    active = row.active
    return {
        "id": fw.framework_id,
        "name": info.name,
        "roles": info.roles,
        "active": active,
        "connected": active and fw.connected,
        "user": info.user,
        "principal": info.principal,
        "share": row.share,
        "offers": row.offers,
        "failovers": fw.failovers,
        "tasks": tasks.get(fw.framework_id, {}) if active else {},
    }


def _offers(view: StateView, now: float) -> dict[str, Any]:
    offers = [
        {
            "id": o.offer_id,
            "framework_id": o.framework_id,
            "agent_id": o.agent_id,
            "role": o.role,
            "resources": o.resources.json_view(),
            "age": max(0.0, now - o.created_at),
            "gang_id": o.gang_id,
        }
        for o in view.offers()
    ]
    return {"outstanding": len(offers), "list": offers}


def _task(t: Task) -> dict[str, Any]:
    status = t.status
    return {
        "id": t.info.task_id,
        "name": t.info.name,
        "framework_id": t.framework_id,
        "agent_id": t.agent_id,
        "state": t.state.value,
        "reason": None if status is None or status.reason is None else status.reason.value,
        "message": "" if status is None else status.message,
        "exit_code": None if status is None else status.exit_code,
        "resources": t.resources.json_view(),
        "timestamp": 0.0 if status is None else status.timestamp,
        "usage": None if t.usage is None else _usage(t.usage),
    }


def _usage(u: ContainerUsage) -> dict[str, Any]:
    return {
        "cpu_seconds": u.cpu_seconds,
        "rss_bytes": u.rss_bytes,
        "mem_limit_bytes": u.mem_limit_bytes,
        "cpu_limit": u.cpu_limit,
        "disk_used_bytes": u.disk_used_bytes,
        "disk_limit_bytes": u.disk_limit_bytes,
        "timestamp": u.timestamp,
    }


def _role(r: RoleSummary) -> dict[str, Any]:
    quota = None
    if r.guarantee is not None or r.limit is not None:
        quota = {
            "guarantee": (r.guarantee or _NO_RESOURCES).json_view(),
            "limit": None if r.limit is None else r.limit.json_view(),
        }
    return {"name": r.name, "weight": r.weight, "quota": quota, "share": r.share}


_NO_RESOURCES = Resources()
_EMPTY: Mapping[str, object] = {}


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No collection while the document is built and encoded (it holds no cycles): a full
    collection over the master's heap would cost more than the build itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
