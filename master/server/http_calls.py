"""Operator calls over HTTP: each POST becomes the operator call it names, made through the
daemon exactly as one over ZeroMQ (same ACL, same core, answered once in effect).

- ``POST /weights`` ``{"weights": {"batch": 2, "mpi": 1}}``
- ``POST /quota`` ``{"role": "batch", "guarantee": "cpus:8;mem:16384", "limit": "cpus:16"}``
- ``DELETE /quota/{role}``
- ``POST /agents/{id}/drain`` (optional ``{"deadline": EPOCH_SECONDS}``: what still runs there
  then is killed), ``/agents/{id}/reactivate``, ``/agents/{id}/gone``
- ``POST /maintenance`` ``{"agents": [id, ...], "start": EPOCH_SECONDS, "duration": SECONDS}``;
  ``POST /maintenance/cancel`` ``{"agents": [id, ...]}``
- ``POST /frameworks/{id}/teardown``
- ``POST /tasks/{id}/kill`` (``?framework_id=`` when several frameworks use the id)

Answers: 200 ``{"ok": true, "call": ..., "message": ...}``; else ``{"error": ...}`` (with the
master's ``"code"`` when its core refused) and 400 (bad input), 401 (no or wrong token), 403 (the
ACL says no, or a web page's request), 404 (unknown id), 409 (removed), 413 (body too large), 503
(not the leader now) or 504 (no answer in time: the call may still take effect).

A request with an ``Origin`` header is refused: browsers send one with every cross-site POST,
command-line tools do not, so a web page cannot make calls with the operator's network access.

Authentication: see :mod:`agora.master.server.http_access`. With ``--http-credentials FILE``
every call needs ``Authorization: Bearer TOKEN`` and is made as that token's principal, which the
ACL then checks like a CURVE principal. Without it, calls are refused, except on a master started
``--insecure``, where they are anonymous as they are on its unauthenticated socket.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agora.master.server.daemon import NotActing
from agora.master.server.http_access import PRINCIPAL, HttpAccess, Refused
from agora.master.server.streams import Streams
from agora.sdk.codec import encode
from agora.sdk.daemon.http_auth import load_credentials
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    CancelMaintenance,
    DrainAgent,
    Error,
    ErrorCode,
    MarkAgentGone,
    Message,
    OperatorDone,
    OperatorKill,
    ReactivateAgent,
    RoleWeight,
    ScheduleMaintenance,
    TeardownFramework,
    UpdateQuota,
    UpdateWeights,
)
from agora.sdk.resources import Resources
from aiohttp import web

__all__ = ["Operator", "add_routes", "load_credentials"]

#: Request bodies larger than this are refused (a weights map of 1024 roles fits easily).
MAX_BODY: Final = 256 * 1024

_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNKNOWN_AGENT: 404,
    ErrorCode.UNKNOWN_FRAMEWORK: 404,
    ErrorCode.UNKNOWN_TASK: 404,
    ErrorCode.AGENT_REMOVED: 409,
    ErrorCode.FRAMEWORK_REMOVED: 409,
    ErrorCode.NOT_LEADER: 503,
}

#: Makes a call as a principal (None: anonymous) within a timeout: the daemon's ``call``.
CallFn = Callable[[Message, "str | None", float], Awaitable[Message]]
#: Makes a call as a stream's peer and principal within a timeout: the daemon's ``submit``.
SubmitFn = Callable[[str, Message, "str | None", float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Operator:
    """What the routes need: a way to make calls, and who may."""

    call: CallFn
    #: token -> principal; empty: only a master without CURVE serves (anonymous) calls.
    tokens: Mapping[str, str] = field(default_factory=dict)
    #: CURVE is on at the socket: anonymous HTTP calls are refused.
    authenticated: bool = False
    timeout: float = 10.0
    #: Makes calls for HTTP schedulers' streams (the daemon's ``submit``); None: no scheduler
    #: API.
    submit: SubmitFn | None = None
    #: The HTTP schedulers' streams (the daemon's).
    streams: Streams | None = None

    @property
    def access(self) -> HttpAccess:
        """Who may use the API: token holders, or anyone on a master without CURVE or tokens."""
        return HttpAccess(self.tokens, anonymous=not self.authenticated)


def add_routes(
    app: web.Application,
    operator: Operator,
    standby: Callable[[web.Request], web.StreamResponse | None],
) -> None:
    """The operator call routes; ``standby(request)`` answers instead when not the leader."""

    def route(build: Callable[[web.Request, Any], Message]) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            if "Origin" in request.headers:
                # Browsers send it with every cross-site POST, tools do not: a web page the
                # operator happens to open must not drain or tear down anything (CSRF).
                return _error(403, "operator calls are not taken from web pages (Origin set)")
            elsewhere = standby(request)
            if elsewhere is not None:
                return elsewhere
            try:
                principal = request.get(PRINCIPAL)  # authenticated by the app's middleware
                message = build(request, await _body(request))
                encode(message)  # the checks a frame gets (bounds, lengths), before the core
            except Refused as exc:
                return _error(exc.status, str(exc), headers=exc.headers)
            except (ProtocolError, ValueError, TypeError) as exc:
                return _error(400, str(exc))
            return await _make(operator, message, principal)

        return handler

    app.router.add_post("/weights", route(_weights))
    app.router.add_post("/quota", route(_quota))
    app.router.add_delete("/quota/{role}", route(_no_quota))
    app.router.add_post("/agents/{id}/drain", route(_drain))
    app.router.add_post("/maintenance", route(_schedule))
    app.router.add_post("/maintenance/cancel", route(_cancel))
    app.router.add_post("/agents/{id}/reactivate", route(_agent(ReactivateAgent)))
    app.router.add_post("/agents/{id}/gone", route(_agent(MarkAgentGone)))
    app.router.add_post("/frameworks/{id}/teardown", route(_teardown))
    app.router.add_post("/tasks/{id}/kill", route(_kill))


async def _make(operator: Operator, message: Message, principal: str | None) -> web.Response:
    try:
        answer = await operator.call(message, principal, operator.timeout)
    except NotActing as exc:
        return _error(503, str(exc), headers={"Retry-After": "1"})
    except TimeoutError:
        return _error(
            504, f"no answer in {operator.timeout:g}s: the call may still take effect; check /state"
        )
    if isinstance(answer, OperatorDone):
        return web.json_response({"ok": True, "call": answer.call, "message": answer.message})
    if isinstance(answer, Error):
        body = {"error": answer.message, "code": answer.code.value}
        return web.json_response(body, status=_STATUS.get(answer.code, 500))
    return _error(500, f"unexpected answer {answer.NAME}")


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()  # the whole body, however it arrives (the app caps its size)
    except web.HTTPRequestEntityTooLarge:
        raise Refused(413, f"request body over {MAX_BODY} bytes") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body


def _weights(_: web.Request, body: Any) -> Message:
    weights = _object(body).get("weights")
    if not isinstance(weights, dict) or not weights:
        raise Refused(400, 'expected {"weights": {"role": weight, ...}}')
    pairs = []
    for role, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise Refused(400, f"the weight of {role!r} must be a number")
        if not math.isfinite(weight):
            raise Refused(400, f"the weight of {role!r} must be finite")
        pairs.append(RoleWeight(role=role, weight=float(weight)))
    return UpdateWeights(weights=tuple(pairs))


def _quota(_: web.Request, body: Any) -> Message:
    obj = _object(body)
    role = obj.get("role")
    if not isinstance(role, str):
        raise Refused(400, 'expected {"role": ..., "guarantee": "cpus:4;mem:4096", "limit": ...}')
    unknown = sorted(set(obj) - {"role", "guarantee", "limit"})
    if unknown:
        raise Refused(400, f"unknown fields: {', '.join(unknown)}")
    guarantee = _resources(obj.get("guarantee"), "guarantee")
    limit = _resources(obj.get("limit"), "limit")
    if guarantee is None and limit is None:
        raise Refused(400, "give a guarantee, a limit or both (DELETE /quota/ROLE removes it)")
    return UpdateQuota(role=role, guarantee=guarantee or Resources(), limit=limit)


def _resources(value: Any, what: str) -> Resources | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise Refused(400, f"{what} must be resources in text form, like 'cpus:4;mem:4096'")
    return Resources.parse(value)


def _no_quota(request: web.Request, _: Any) -> Message:
    return UpdateQuota(role=request.match_info["role"])


def _drain(request: web.Request, body: Any) -> Message:
    deadline = None if body is None else _object(body).get("deadline")
    if body is not None and set(_object(body)) - {"deadline"}:
        raise Refused(400, 'expected no body or {"deadline": EPOCH_SECONDS}')
    return DrainAgent(
        agent_id=AgentID(request.match_info["id"]),
        deadline=None if deadline is None else _number(deadline, "deadline"),
    )


def _schedule(_: web.Request, body: Any) -> Message:
    obj = _object(body)
    if set(obj) != {"agents", "start", "duration"}:
        raise Refused(400, 'expected {"agents": [id, ...], "start": EPOCH_SECONDS, "duration": S}')
    return ScheduleMaintenance(
        agent_ids=_agent_ids(obj["agents"]),
        start=_number(obj["start"], "start"),
        duration=_number(obj["duration"], "duration"),
    )


def _cancel(_: web.Request, body: Any) -> Message:
    obj = _object(body)
    if set(obj) != {"agents"}:
        raise Refused(400, 'expected {"agents": [id, ...]}')
    return CancelMaintenance(agent_ids=_agent_ids(obj["agents"]))


def _agent_ids(value: Any) -> tuple[AgentID, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise Refused(400, "agents must be a non-empty list of agent ids")
    return tuple(AgentID(v) for v in value)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refused(400, f"{what} must be a number")
    return float(value)


def _agent(kind: type[ReactivateAgent | MarkAgentGone]) -> Any:
    def build(request: web.Request, _: Any) -> Message:
        return kind(agent_id=AgentID(request.match_info["id"]))

    return build


def _teardown(request: web.Request, _: Any) -> Message:
    return TeardownFramework(framework_id=FrameworkID(request.match_info["id"]))


def _kill(request: web.Request, _: Any) -> Message:
    framework = request.query.get("framework_id")
    return OperatorKill(
        task_id=TaskID(request.match_info["id"]),
        framework_id=FrameworkID(framework) if framework else None,
    )


def _error(status: int, text: str, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": text}, status=status, headers=headers)
