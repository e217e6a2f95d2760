"""The agent HTTP API: a read-only JSON view of the agent and its tasks' output files.

Served by aiohttp in the daemon's own event loop (``--http-port``, default: any free port; the
bound port and ``--advertise-host`` go to the master in AgentInfo, so that ``agora logs`` can
find it). Handlers read the core synchronously, between two core calls.

Everything but ``/health`` needs a bearer token (see :mod:`agora.agent.server.http_auth`).

- ``GET /health``: ``{"status": "ok"}``.
- ``GET /state``: agent id, registered, frameworks, executors, tasks with their state.
- ``GET /files/read?task=ID&file=stdout|stderr&offset=N&length=N[&framework=ID]``: up to
  ``length`` (at most 1 MiB) bytes of the task's file from ``offset``, as
  ``{"data": text, "offset": N, "next_offset": N, "eof_offset": size}``. ``data`` is UTF-8 with
  replacement characters; a multi-byte character cut at the end of the chunk is left for the next
  read, so read on from ``next_offset`` (not ``offset + len(data)``). The task's sandbox is
  ``<work dir>/frameworks/<fid>/executors/<eid>/tasks/<tid>/`` (command tasks; found through the
  core, or on disk once the core has forgotten the task). Only ``stdout`` and ``stderr`` can be
  read; ids are checked like task ids, and a symlink is never followed. A sandbox the agent's
  garbage collection deleted answers 410 (Gone) with when, rather than 404.
- ``GET /metrics``: Prometheus text format (see :mod:`agora.agent.server.metrics`), from a
  registry of the app's own.

The daemon imports this module only when it serves HTTP: it loads prometheus_client.
"""

from __future__ import annotations

import codecs
import glob
import os
import stat
import time
from collections.abc import Callable
from typing import Any, Final

from agora.agent.core import Agent
from agora.agent.server.http_auth import (
    PRINCIPAL,
    HttpAuth,
    auth_middleware,
    log_refusal,
    may_read_files,
)
from agora.agent.server.metrics import AgentCounters, make_registry
from agora.agent.server.sandbox_gc import find_collected
from agora.sdk.daemon.httpd import HttpError, json_errors
from agora.sdk.daemon.ratelimit import KeyedLogLimiter
from agora.sdk.ids import FrameworkID, id_problem
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = [
    "FILES",
    "MAX_READ",
    "FileReadError",
    "find_sandbox",
    "make_app",
    "read_task_file",
    "sandbox_owner",
    "state_json",
]

#: The sandbox files that can be read.
FILES: Final = ("stdout", "stderr")
#: Longest read, in bytes.
MAX_READ: Final = 1 << 20


class FileReadError(HttpError):
    """A read that cannot be served: ``status`` is the HTTP status (400, 403, 404 or 410)."""


def state_json(
    core: Agent, shows: Callable[[str | None], bool] = lambda _owner: True
) -> dict[str, Any]:
    """The ``/state`` document, as plain JSON values: the frameworks (their executors and
    tasks) whose principal ``shows`` says the caller may see (an operator sees every one)."""
    seen = {
        fw.framework_id for fw in core.frameworks().values() if shows(fw.info.principal or None)
    }
    return {
        "agent_id": core.agent_id,
        "registered": core.registered,
        "hostname": core.config.hostname,
        "frameworks": [
            {
                "id": fw.framework_id,
                "name": fw.info.name,
                "terminating": fw.terminating,
                "executors": sorted(fw.executors),
                "tasks": sorted(fw.tasks),
            }
            for fw in core.frameworks().values()
            if fw.framework_id in seen
        ],
        "executors": [
            {
                "id": ex.executor_id,
                "framework_id": ex.framework_id,
                "state": ex.state.value,
                "builtin": ex.builtin,
                "sandbox": ex.sandbox,
                "tasks": sorted(ex.tasks),
            }
            for ex in core.executors().values()
            if ex.framework_id in seen
        ],
        "tasks": [
            {
                "id": task.info.task_id,
                "name": task.info.name,
                "framework_id": task.framework_id,
                "executor_id": task.executor_id,
                "state": task.state.value,
                "sandbox": f"frameworks/{task.framework_id}/executors/{task.executor_id}"
                f"/tasks/{task.info.task_id}",
            }
            for task in core.tasks().values()
            if task.framework_id in seen
        ],
    }


def find_sandbox(
    work_dir: str, core: Agent | None, task_id: str, framework_id: str | None = None
) -> str:
    """The task's sandbox directory under ``work_dir``; raises FileReadError (400/404)."""
    for what, value in (("task", task_id), ("framework", framework_id)):
        if value is not None:
            problem = id_problem(value)
            if problem is not None:
                raise FileReadError(400, f"bad {what} id: {problem}")
    candidates: list[str] = []
    if core is not None:
        for task in core.tasks().values():
            if task.info.task_id != task_id:
                continue
            if framework_id is not None and task.framework_id != framework_id:
                continue
            candidates.append(
                os.path.join(
                    work_dir,
                    "frameworks",
                    task.framework_id,
                    "executors",
                    task.executor_id,
                    "tasks",
                    task_id,
                )
            )
    found = [c for c in candidates if os.path.isdir(c)]
    if not found:
        # Finished tasks the core has forgotten: their sandboxes stay on disk.
        fw = glob.escape(framework_id) if framework_id is not None else "*"
        pattern = os.path.join(
            glob.escape(work_dir), "frameworks", fw, "executors", "*", "tasks", glob.escape(task_id)
        )
        found = [p for p in glob.glob(pattern) if os.path.isdir(p)]
    if not found:
        collected = find_collected(work_dir, task_id, framework_id)
        if collected is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(collected[0]))
            raise FileReadError(
                410,
                f"the sandbox of task {task_id} was garbage-collected at {when}, after the "
                "agent's --gc-delay (shorter as its disk fills): its output is gone",
            )
        raise FileReadError(404, f"no sandbox of task {task_id!r} on this agent")
    root = os.path.realpath(work_dir)
    inside = []
    for path in found:
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) == root:
            inside.append(real)
    if not inside:
        raise FileReadError(404, f"no sandbox of task {task_id!r} on this agent")
    # The same task id under several executors or frameworks: the newest sandbox.
    return max(inside, key=_mtime)


def sandbox_owner(work_dir: str, core: Agent | None, sandbox: str) -> str | None:
    """The principal of the framework whose sandbox ``sandbox`` is (a path under ``work_dir``
    from :func:`find_sandbox`); None when the core does not know the framework (any more)."""
    parts = os.path.relpath(sandbox, os.path.realpath(work_dir)).split(os.sep)
    if core is None or len(parts) < 2 or parts[0] != "frameworks":
        return None
    framework = core.framework(FrameworkID(parts[1]))
    return framework.info.principal if framework is not None else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def read_task_file(
    sandbox: str, name: str, offset: int = 0, length: int = MAX_READ
) -> dict[str, Any]:
    """Up to ``length`` bytes (capped at MAX_READ) of ``sandbox/name`` from ``offset``."""
    if name not in FILES:
        raise FileReadError(400, f"file must be one of {', '.join(FILES)}")
    if offset < 0 or length < 0:
        raise FileReadError(400, "offset and length must be >= 0")
    length = min(length, MAX_READ)
    try:
        fd = os.open(os.path.join(sandbox, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileReadError(404, f"no {name} in the task's sandbox") from None
    except OSError as exc:
        raise FileReadError(404, f"cannot open {name}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileReadError(404, f"{name} is not a regular file")
        size = info.st_size
        raw = os.pread(fd, length, offset) if length and offset < size else b""
    finally:
        os.close(fd)
    end = offset + len(raw)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    # A character cut at the end of the chunk waits for the next read, unless nothing follows.
    text = decoder.decode(raw, final=end >= size)
    pending = len(decoder.getstate()[0])
    if pending and pending == len(raw):
        text, pending = raw.decode("utf-8", "replace"), 0  # never return an empty chunk forever
    return {"data": text, "offset": offset, "next_offset": end - pending, "eof_offset": size}


def _int_param(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise FileReadError(400, f"{name} must be a whole number") from None


def make_app(
    core: Callable[[], Agent | None],
    work_dir: str,
    counters: AgentCounters | None = None,
    auth: HttpAuth | None = None,
) -> web.Application:
    """The agent app; ``core()`` is the daemon's current core (None: none yet); ``counters``
    (the daemon) adds its uptime, message counts and latest container usage to /metrics;
    ``auth`` says who may call it (default: nobody but for /health)."""
    registry = make_registry(core, counters)
    auth = auth or HttpAuth()
    limiter = KeyedLogLimiter()

    async def health(_: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok"})

    async def state(request: web.Request) -> web.StreamResponse:
        agent = core()
        if agent is None:
            return web.json_response({"error": "starting"}, status=503)
        principal = request.get(PRINCIPAL)
        # Like a task's files: its ids only to its framework's principal or an operator.
        return web.json_response(
            state_json(agent, lambda owner: may_read_files(principal, owner, auth))
        )

    async def files_read(request: web.Request) -> web.StreamResponse:
        task_id = request.query.get("task")
        if task_id is None:
            raise FileReadError(400, "task is required")
        name = request.query.get("file", "stdout")
        if name not in FILES:
            raise FileReadError(400, f"file must be one of {', '.join(FILES)}")
        offset = _int_param(request, "offset", 0)
        length = _int_param(request, "length", MAX_READ)
        agent = core()
        sandbox = find_sandbox(work_dir, agent, task_id, request.query.get("framework"))
        principal = request.get(PRINCIPAL)
        if not may_read_files(principal, sandbox_owner(work_dir, agent, sandbox), auth):
            text = f"{principal} may not read the files of task {task_id}"
            log_refusal(request, 403, text, limiter, principal or "")
            raise FileReadError(403, text)
        return web.json_response(read_task_file(sandbox, name, offset, length))

    async def metrics(_: web.Request) -> web.StreamResponse:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[auth_middleware(auth, limiter), json_errors])
    app.router.add_get("/health", health)
    app.router.add_get("/state", state)
    app.router.add_get("/files/read", files_read)
    app.router.add_get("/metrics", metrics)
    return app
