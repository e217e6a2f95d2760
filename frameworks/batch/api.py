"""The batch service's HTTP API (JSON), served by aiohttp in the service's own event loop.

``POST /jobs`` checks a job against what the service knows (its queues, the jobs it depends on)
and against the cluster (some agent must be able to hold one of its tasks, or, for a gang, the
agents together all of them) before anything is stored; a refusal is a 400 naming the problem.
Reads flush pending changes first, then answer from the job store.

Every request has an identified caller (:mod:`agora.frameworks.batch.api_auth`); a job runs as
the user who submitted it, and who may submit, read or cancel what is decided by
:mod:`agora.frameworks.batch.access`. A refusal is a 403 naming the rule, logged, and changes
nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog
from agora.frameworks.batch.access import Caller, list_filter, may_access, submit_problem
from agora.frameworks.batch.api_auth import ApiAuth, auth_middleware, caller_of
from agora.frameworks.batch.placement import task_resources
from agora.frameworks.batch.records import JobRecord, TaskState
from agora.frameworks.batch.service import BatchService
from agora.frameworks.batch.spec import JobSpec, SpecError
from agora.sdk.daemon.httpd import HttpError, json_errors
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.messages import AgentSummary
from agora.sdk.operator import OperatorClient
from agora.sdk.scheduler.spec import fit_resources
from aiohttp import web

__all__ = ["ClusterView", "make_app"]

log = structlog.get_logger(__name__)

MAX_BODY = 1 << 20
RECENT_SECONDS = 600.0
AGENTS_TTL = 5.0


class ClusterView:
    """The cluster's agents, from the master's state, cached for a few seconds."""

    def __init__(self, operator: OperatorClient | None) -> None:
        self._operator = operator
        self._agents: list[AgentSummary] | None = None
        self._at = 0.0

    async def agents(self) -> list[AgentSummary] | None:
        """The active agents, or None when the master cannot be asked."""
        if self._operator is None:
            return None
        now = time.monotonic()
        if self._agents is None or now - self._at > AGENTS_TTL:
            try:
                state = await self._operator.get_state(timeout=3.0)
            except Exception as exc:  # an unreachable master must not block submissions
                log.info("batch_cluster_state_unavailable", error=str(exc))
                return self._agents
            self._agents = [a for a in state.agents if a.status == "ACTIVE"]
            self._at = now
        return self._agents


def check_fits(spec: JobSpec, agents: list[AgentSummary]) -> None:
    """SpecError unless the cluster could ever run the job (ignoring what is in use now)."""
    need = task_resources(spec)
    per_agent = []
    for agent in agents:
        if not all(c.allows(agent.attributes) for c in spec.constraints):
            continue
        total, slots = agent.resources, 0
        while fit_resources(need, total, spec.role) is not None and slots < spec.ntasks:
            used = fit_resources(need, total, spec.role)
            assert used is not None
            total, slots = total - used, slots + 1
        if spec.ntasks_per_node:
            slots = min(slots, spec.ntasks_per_node)
        per_agent.append(slots)
    if not any(per_agent):
        where = f" with {', '.join(map(str, spec.constraints))}" if spec.constraints else ""
        raise SpecError(
            f"no agent{where} can hold a task of {need} (largest: "
            f"{_largest(agents)}); nothing was queued"
        )
    if spec.is_gang and sum(per_agent) < spec.ntasks:
        raise SpecError(
            f"the cluster can hold {sum(per_agent)} of the {spec.ntasks} tasks of {need} this "
            "gang needs at once; nothing was queued"
        )


def _largest(agents: list[AgentSummary]) -> str:
    if not agents:
        return "no agents"
    best = max(agents, key=lambda a: (a.resources.scalar("cpus"), a.resources.scalar("mem")))
    return str(best.resources)


def make_app(
    service: BatchService, cluster: ClusterView, roles: tuple[str, ...], *, auth: ApiAuth
) -> web.Application:
    """The API; ``auth`` says whom its TCP listener serves (its Unix socket serves everyone,
    each as the Unix user they are)."""
    limiter = KeyedLogLimiter()  # refusals: a few lines a second per caller
    app = web.Application(
        middlewares=[json_errors, auth_middleware(auth, limiter)], client_max_size=MAX_BODY
    )
    store = service.store

    def refuse(caller: Caller, problem: str, **what: Any) -> HttpError:
        if limiter.allow(caller.describe(), time.monotonic()):
            log.warning(
                "batch_request_refused",
                caller=caller.describe(),
                uid=caller.uid,
                principal=caller.principal,
                reason=problem,
                **what,
            )
        return HttpError(403, problem)

    def check_access(caller: Caller, found: JobRecord, action: str) -> None:
        if not may_access(caller, found.spec.user, found.submit_uid):
            problem = (
                f"{caller.describe()} may not {action} job {found.job_id}: it runs as "
                f"{found.spec.user!r} (only its own user, or root, may)"
            )
            raise refuse(caller, problem, job_id=found.job_id)

    def framework_id() -> str | None:
        return store.get_meta("framework_id")

    async def health(_: web.Request) -> web.Response:
        driver = service.driver
        return web.json_response(
            {
                "status": "ok",
                "framework_id": framework_id(),
                "subscribed": bool(driver is not None and driver.subscribed),
            }
        )

    async def submit(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "the body must be JSON") from None
        if not isinstance(body, dict) or "spec" not in body:
            raise HttpError(400, 'the body must be {"spec": {...}}')
        caller = caller_of(request)
        try:
            spec = JobSpec.from_json(body["spec"])
            problem = submit_problem(caller, spec.user)
            if problem is not None:
                raise refuse(caller, problem, user=spec.user)
            if spec.role not in roles:
                served = ", ".join("default" if r == "*" else r for r in roles)
                raise SpecError(f"unknown queue {spec.queue!r} (this service runs: {served})")
            if spec.is_gang and spec.constraints:
                raise SpecError("constraints are not supported on gang jobs (ntasks > 1)")
            known = store.load_job_states() if spec.dependencies else {}
            for dep in spec.dependencies:
                if dep.job_id not in known:
                    raise SpecError(f"dependency {dep}: there is no job {dep.job_id}")
            agents = await cluster.agents()
            if agents:
                check_fits(spec, agents)
        except (SpecError, ValueError) as exc:  # ValueError: a resource text Agora refuses
            raise HttpError(400, str(exc)) from None
        if service.failed is not None:
            raise HttpError(503, "the job store failed; the service is stopping")
        job, tasks = service.submit(spec, submitter=caller.submitter, submit_uid=caller.uid)
        service.flush()
        return web.json_response({"job_id": job.job_id, "tasks": len(tasks)}, status=201)

    def job_view(caller: Caller, job_id: int) -> dict[str, Any]:
        found = store.job(job_id)
        if found is None:
            raise HttpError(404, f"no job {job_id}")
        check_access(caller, found, "read")
        view = found.to_json()
        view["tasks"] = _counts(store.task_counts(job_id))
        return view

    async def jobs(request: web.Request) -> web.Response:
        service.flush()
        query = request.query
        caller = caller_of(request)
        user, problem = list_filter(caller, query.get("user") or None)
        if problem is not None:
            raise refuse(caller, problem)
        since = None if query.get("all") in ("1", "true") else time.time() - RECENT_SECONDS
        rows = store.jobs(
            include_ended_since=since,
            user=user,
            limit=_int(query.get("limit"), 1000),
        )
        out = []
        for job, counts in rows:
            view = job.to_json()
            view["tasks"] = _counts(counts)
            out.append(view)
        return web.json_response({"jobs": out})

    async def job(request: web.Request) -> web.Response:
        service.flush()
        job_id = _int(request.match_info["job"], -1)
        view = job_view(caller_of(request), job_id)
        tasks = [] if request.query.get("tasks") == "0" else store.tasks_of(job_id)
        return web.json_response({"job": view, "tasks": [t.to_json() for t in tasks]})

    async def task(request: web.Request) -> web.Response:
        service.flush()
        job_id = _int(request.match_info["job"], -1)
        index = _int(request.match_info["index"], -1)
        found = store.task(job_id, index)
        if found is None:
            raise HttpError(404, f"no task {job_id}.{index}")
        owner = store.job(job_id)
        if owner is not None:
            check_access(caller_of(request), owner, "read")
        return web.json_response({"task": found.to_json(), "framework_id": framework_id()})

    async def cancel(request: web.Request) -> web.Response:
        job_id = _int(request.match_info["job"], -1)
        index: int | None = None
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                raise HttpError(400, "the body must be JSON") from None
            if not isinstance(body, dict) or set(body) - {"index"}:
                raise HttpError(400, 'the body must be {"index": N} or {"index": null}')
            raw = body.get("index")
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
                raise HttpError(400, "index must be a whole number or null")
            index = raw
        found = service.core.jobs.get(job_id) or store.job(job_id)
        if found is None:
            raise HttpError(404, f"no job {job_id}")
        check_access(caller_of(request), found, "cancel")
        if job_id not in service.core.jobs:
            service.flush()
            ended = store.job(job_id)
            if ended is None:
                raise HttpError(404, f"no job {job_id}")
            if index is not None and store.task(job_id, index) is None:
                raise HttpError(404, f"no task {job_id}.{index}")
            return web.json_response({"cancelled": 0})
        try:
            count = service.cancel(job_id, index)
        except KeyError:
            raise HttpError(404, f"no task {job_id}.{index}") from None
        return web.json_response({"cancelled": count})

    async def history(request: web.Request) -> web.Response:
        service.flush()
        query = request.query
        since = query.get("since")
        try:
            since_value = float(since) if since else None
        except ValueError:
            raise HttpError(400, "since must be unix seconds") from None
        job_filter = query.get("job")
        caller = caller_of(request)
        user, problem = list_filter(caller, query.get("user") or None)
        if problem is not None:
            raise refuse(caller, problem)
        records = store.history(
            user=user,
            since=since_value,
            job_id=_int(job_filter, -1) if job_filter else None,
            limit=_int(query.get("limit"), 10_000),
        )
        return web.json_response({"records": records}, dumps=_dumps)

    app.router.add_get("/health", health)
    app.router.add_post("/jobs", submit)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/jobs/{job}", job)
    app.router.add_post("/jobs/{job}/cancel", cancel)
    app.router.add_get("/jobs/{job}/tasks/{index}", task)
    app.router.add_get("/history", history)
    return app


def _counts(counts: dict[str, int]) -> dict[str, int]:
    out = {"total": int(counts.get("total", 0))}
    for state in TaskState:
        out[state.value] = int(counts.get(state.value, 0))
    return out


def _int(text: str | None, default: int) -> int:
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**62:
        raise HttpError(400, f"expected 0 or more (and less than 2**62), got {text}")
    return value


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
