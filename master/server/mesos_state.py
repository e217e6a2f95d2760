"""The master's state in Mesos's shapes: the ``/master/state`` document (also ``/state.json``)
and the v1 operator calls GET_STATE, GET_AGENTS, GET_FRAMEWORKS and GET_TASKS, built from
Agora's own ``/state`` document (:mod:`agora.master.server.state_doc`). Pure: a dict in, a dict
out.

Resources are Mesos's maps: scalars as floats, ranges as ``"[31000-32000]"``; an agent's
``resources`` sums every role, ``reserved_resources`` splits out the reserved ones by role.
Agora's task states become ``TASK_*``. What Agora does not keep (executors' own rows, a task's
whole status history) is left out or given as its latest value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["STATE_CALLS", "master_state", "state_call"]

#: The v1 operator calls answered here.
STATE_CALLS: Final = frozenset({"GET_STATE", "GET_AGENTS", "GET_FRAMEWORKS", "GET_TASKS"})


def _resource_map(view: Mapping[str, Any], *, role: str | None = None) -> dict[str, Any]:
    """Agora's JSON resources (``{"cpus": 2, "cpus(db)": 1, "ports": [[a, b]]}``) as a Mesos
    resource map; ``role`` keeps only that role's (``"*"``: unreserved), None sums them all."""
    scalars: dict[str, float] = defaultdict(float)
    ranges: dict[str, list[list[int]]] = defaultdict(list)
    for key, value in view.items():
        name, _, rest = key.partition("(")
        owner = rest.rstrip(")") if rest else "*"
        if role is not None and owner != role:
            continue
        if isinstance(value, list) and value and isinstance(value[0], list):
            ranges[name].extend(value)
        elif isinstance(value, int | float):
            scalars[name] += float(value)
    out: dict[str, Any] = {name: 0.0 for name in ("cpus", "mem", "disk", "gpus")}
    out.update(scalars)
    for name, spans in ranges.items():
        out[name] = "[" + ", ".join(f"{lo}-{hi}" for lo, hi in sorted(spans)) + "]"
    return out


def _roles(view: Mapping[str, Any]) -> set[str]:
    return {key.partition("(")[2].rstrip(")") for key in view if "(" in key}


def _task(task: Mapping[str, Any]) -> dict[str, Any]:
    state = "TASK_" + str(task["state"])
    return {
        "id": task["id"],
        "name": task["name"],
        "framework_id": task["framework_id"],
        "executor_id": "",
        "slave_id": task["agent_id"],
        "agent_id": task["agent_id"],
        "state": state,
        "resources": _resource_map(task.get("resources") or {}),
        "statuses": [{"state": state, "timestamp": task.get("timestamp", 0.0)}],
    }


def _agent(
    agent: Mapping[str, Any], used: Mapping[str, Any], offered: Mapping[str, Any]
) -> dict[str, Any]:
    total = agent.get("resources") or {}
    address = agent.get("address") or agent.get("hostname", "")
    return {
        "id": agent["id"],
        "pid": f"slave(1)@{address}:{agent.get('port', 0)}",
        "hostname": agent.get("hostname", ""),
        "port": agent.get("port", 0),
        "active": agent.get("status") == "ACTIVE",
        "resources": _resource_map(total),
        "used_resources": _resource_map(used),
        "offered_resources": _resource_map(offered),
        "unreserved_resources": _resource_map(total, role="*"),
        "reserved_resources": {role: _resource_map(total, role=role) for role in _roles(total)},
        "attributes": dict(agent.get("attributes") or {}),
    }


def _framework(
    fw: Mapping[str, Any], tasks: Iterable[Mapping[str, Any]], offers: list[Mapping[str, Any]]
) -> dict[str, Any]:
    live = [t for t in tasks if not _terminal(t)]
    done = [t for t in tasks if _terminal(t)]
    used: dict[str, Any] = {}
    for t in live:
        _add(used, t.get("resources") or {})
    offered: dict[str, Any] = {}
    for o in offers:
        _add(offered, o.get("resources") or {})
    roles = list(fw.get("roles") or ())
    return {
        "id": fw["id"],
        "name": fw.get("name", ""),
        "user": fw.get("user", ""),
        "principal": fw.get("principal"),
        "role": roles[0] if len(roles) == 1 else "*",
        "roles": roles,
        "active": bool(fw.get("active")),
        "connected": bool(fw.get("connected")),
        "hostname": "",
        "webui_url": "",
        "tasks": [_task(t) for t in live],
        "completed_tasks": [_task(t) for t in done],
        "offers": [
            {
                "id": o["id"],
                "framework_id": o["framework_id"],
                "slave_id": o["agent_id"],
                "resources": _resource_map(o.get("resources") or {}),
            }
            for o in offers
        ],
        "resources": _resource_map(_merged(used, offered)),
        "used_resources": _resource_map(used),
        "offered_resources": _resource_map(offered),
    }


_TERMINAL: Final = frozenset(
    {"FINISHED", "FAILED", "KILLED", "LOST", "ERROR", "DROPPED", "GONE", "GONE_BY_OPERATOR"}
)


def _terminal(task: Mapping[str, Any]) -> bool:
    return task.get("state") in _TERMINAL


def _add(into: dict[str, Any], view: Mapping[str, Any]) -> None:
    for key, value in view.items():
        if isinstance(value, list):
            into[key] = [*into.get(key, []), *value]
        elif isinstance(value, int | float):
            into[key] = into.get(key, 0) + value


def _merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _add(out, a)
    _add(out, b)
    return out


def master_state(doc: Mapping[str, Any], version: str) -> dict[str, Any]:
    """``/master/state`` from Agora's ``/state`` document (``version``: the Mesos API level)."""
    master = doc.get("master") or {}
    address = str(master.get("address") or "")
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    offers = list((doc.get("offers") or {}).get("list") or [])
    offers_by_agent: dict[str, dict[str, Any]] = defaultdict(dict)
    offers_by_framework: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for o in offers:
        _add(offers_by_agent[o["agent_id"]], o.get("resources") or {})
        offers_by_framework[o["framework_id"]].append(o)
    tasks_by_framework: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    used_by_agent: dict[str, dict[str, Any]] = defaultdict(dict)
    for t in doc.get("tasks") or ():
        tasks_by_framework[t["framework_id"]].append(t)
        if not _terminal(t):
            _add(used_by_agent[t["agent_id"]], t.get("resources") or {})
    agents = [
        _agent(a, used_by_agent.get(a["id"], {}), offers_by_agent.get(a["id"], {}))
        for a in doc.get("agents") or ()
    ]
    frameworks = [
        _framework(f, tasks_by_framework.get(f["id"], ()), offers_by_framework.get(f["id"], []))
        for f in doc.get("frameworks") or ()
    ]
    known = {f["id"] for f in doc.get("frameworks") or ()}
    pid = f"master@{host}:{port}"
    leader_info = {"id": master.get("id", ""), "pid": pid, "hostname": host, "port": _int(port)}
    return {
        "version": version,
        "id": master.get("id", ""),
        "pid": pid,
        "hostname": host,
        "leader": pid,
        "leader_info": leader_info,
        "elected_time": master.get("leader_since", 0.0),
        "activated_slaves": sum(1 for a in agents if a["active"]),
        "deactivated_slaves": sum(1 for a in agents if not a["active"]),
        "slaves": agents,
        "frameworks": [f for f in frameworks if f["active"]],
        "completed_frameworks": [f for f in frameworks if not f["active"]],
        "orphan_tasks": [
            _task(t)
            for fid, tasks in sorted(tasks_by_framework.items())
            if fid not in known
            for t in tasks
        ],
        "unregistered_frameworks": [],
    }


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def state_call(kind: str, doc: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The answer to a v1 operator ``GET_STATE``, ``GET_AGENTS``, ``GET_FRAMEWORKS`` or
    ``GET_TASKS`` call (v1 names: ``agent_info``, ``framework_info``, ``agent_id``)."""
    state = master_state(doc, version)
    agents = [
        {
            "agent_info": {
                "id": {"value": a["id"]},
                "hostname": a["hostname"],
                "port": a["port"],
                "attributes": [
                    {"name": k, "type": "TEXT", "text": {"value": v}}
                    for k, v in a["attributes"].items()
                ],
            },
            "active": a["active"],
            "pid": a["pid"],
        }
        for a in state["slaves"]
    ]

    def framework(f: Mapping[str, Any]) -> dict[str, Any]:
        info = {"id": {"value": f["id"]}, "name": f["name"], "user": f["user"], "roles": f["roles"]}
        if f["principal"] is not None:
            info["principal"] = f["principal"]
        return {"framework_info": info, "active": f["active"], "connected": f["connected"]}

    def v1_task(t: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "name": t["name"],
            "task_id": {"value": t["id"]},
            "framework_id": {"value": t["framework_id"]},
            "agent_id": {"value": t["agent_id"]},
            "state": t["state"],
        }

    frameworks = {
        "frameworks": [framework(f) for f in state["frameworks"]],
        "completed_frameworks": [framework(f) for f in state["completed_frameworks"]],
    }
    tasks = {
        "tasks": [v1_task(t) for f in state["frameworks"] for t in f["tasks"]],
        "completed_tasks": [
            v1_task(t)
            for f in (*state["frameworks"], *state["completed_frameworks"])
            for t in f["completed_tasks"]
        ],
        "orphan_tasks": [v1_task(t) for t in state["orphan_tasks"]],
    }
    if kind == "GET_AGENTS":
        return {"type": kind, "get_agents": {"agents": agents}}
    if kind == "GET_FRAMEWORKS":
        return {"type": kind, "get_frameworks": frameworks}
    if kind == "GET_TASKS":
        return {"type": kind, "get_tasks": tasks}
    return {
        "type": "GET_STATE",
        "get_state": {
            "get_agents": {"agents": agents},
            "get_frameworks": frameworks,
            "get_tasks": tasks,
        },
    }
