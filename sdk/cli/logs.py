"""``agora logs TASK_ID``: a task's stdout (or stderr), read from its agent's HTTP API.

The master's state (GET_STATE) names the task's agent, and the agent's AgentSummary its HTTP API
(``address`` and ``http_port``, reported by the agent at registration). The file is read in
chunks through the agent's ``/files/read``; ``--follow`` keeps polling every 0.5 s until the task
is terminal and everything is read (or Ctrl-C, which exits 0). Each read sends this user's bearer
token (``$AGORA_HTTP_TOKEN``, else ``$AGORA_HOME/keys/operator.token``).
:func:`print_task_output` is that reading loop, for other commands too (``agora batch logs``
names the agent its task ran on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from typing import Any, Final

from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    ask_master,
    resolve_curve,
    resolve_master,
)
from agora.sdk.discovery import http_token
from agora.sdk.ids import AgentID
from agora.sdk.messages import AgentSummary, StateReply, TaskSummary
from agora.sdk.messages.enums import is_terminal
from agora.sdk.transport import CurveClient

__all__ = [
    "SandboxNotFound",
    "add_parser",
    "agent_url",
    "cmd_logs",
    "print_task_output",
    "read_sandbox_file",
]

POLL_INTERVAL: Final = 0.5
CHUNK: Final = 1 << 20


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    logs = sub.add_parser(
        "logs",
        help="print a task's stdout or stderr",
        description="Print a task's stdout (or --stderr) from its sandbox, read through its "
        "agent's HTTP API (agent option --http-port). With --follow, keep printing new output "
        "until the task ends (or Ctrl-C).",
    )
    logs.add_argument("task_id", metavar="TASK_ID")
    logs.add_argument("--stderr", action="store_true", help="the task's stderr, not its stdout")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new output until the task ends"
    )
    logs.add_argument(
        "--framework",
        metavar="ID",
        help="the task's framework, when several frameworks have a task with this id",
    )
    add_master_options(logs)
    logs.set_defaults(func=cmd_logs)


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_logs(args))
    except KeyboardInterrupt:
        if args.follow:
            return 0
        raise


def agent_url(agent: AgentSummary) -> str:
    """The base URL of ``agent``'s HTTP API; CliError when it serves none."""
    if not agent.http_port:
        raise CliError(f"agent {agent.agent_id} ({agent.hostname}) serves no HTTP API")
    host = agent.address or agent.hostname
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{agent.http_port}"


def _find_task(state: StateReply, task_id: str, framework_id: str | None) -> TaskSummary | None:
    found = [
        t
        for t in state.tasks
        if t.task_id == task_id and (framework_id is None or t.framework_id == framework_id)
    ]
    frameworks = {t.framework_id for t in found}
    if len(frameworks) > 1:
        raise CliError(
            f"task {task_id} exists in several frameworks ({', '.join(sorted(frameworks))}); "
            "pick one with --framework"
        )
    return found[0] if found else None  # live tasks come first


async def _state(master: str, curve: CurveClient | None, timeout: float) -> StateReply:
    return await ask_master(master, timeout, lambda c: c.get_state(timeout=timeout), curve)


def _get(url: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a GET, with this user's bearer token (``$AGORA_HTTP_TOKEN``, else
    ``agora local``'s, see :func:`agora.sdk.discovery.http_token`); CliError when the agent
    cannot be reached."""
    token = http_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {"error": exc.reason}
        return exc.code, body if isinstance(body, dict) else {"error": str(body)}
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        where = url.split("/files")[0]
        raise CliError(f"cannot read from the agent at {where}: {reason}") from None


class SandboxNotFound(CliError):
    """The agent has no such task file (yet, or any more)."""


async def read_sandbox_file(
    base: str,
    task_id: str,
    framework_id: str | None,
    stream: str,
    offset: int,
    timeout: float,
) -> AsyncIterator[tuple[str, int]]:
    """Read a task's ``stream`` file from the agent at ``base`` from byte ``offset`` to its end as
    it is now: yields ``(text, next offset)`` per chunk. CliError when the agent refuses
    (:class:`SandboxNotFound` for a file it does not have), with one clear line when its sandbox
    garbage collection deleted the sandbox."""
    while True:
        params: dict[str, str | int] = {
            "task": task_id,
            "file": stream,
            "offset": offset,
            "length": CHUNK,
        }
        if framework_id is not None:
            params["framework"] = framework_id
        query = urllib.parse.urlencode(params)
        status, body = await asyncio.to_thread(_get, f"{base}/files/read?{query}", timeout)
        if status == 200:
            data = str(body.get("data", ""))
            new_offset = int(body.get("next_offset", offset + len(data.encode())))
            eof = int(body.get("eof_offset", new_offset))
            progressed, offset = new_offset > offset, new_offset
            if data:
                yield data, offset
            if offset < eof and progressed:
                continue  # more is there already
            return
        if status == 404:
            raise SandboxNotFound(f"the agent refused: {body.get('error', status)} (HTTP {status})")
        if status == 410:  # the agent's sandbox garbage collection deleted it
            default = f"the sandbox of task {task_id} was garbage-collected: its output is gone"
            raise CliError(str(body.get("error", default)))
        if status == 401:
            raise CliError(
                f"the agent refused: {body.get('error', status)} (HTTP 401): set "
                "AGORA_HTTP_TOKEN to a token of the agent's --http-credentials"
            )
        raise CliError(f"the agent refused: {body.get('error', status)} (HTTP {status})")


async def _logs(args: argparse.Namespace) -> int:
    return await print_task_output(
        resolve_master(args),
        resolve_curve(args),
        args.timeout,
        args.task_id,
        args.framework,
        None,
        "stderr" if args.stderr else "stdout",
        args.follow,
    )


async def print_task_output(
    master: str,
    curve: CurveClient | None,
    timeout: float,
    task_id: str,
    framework_id: str | None,
    agent_id: str | None,
    stream: str,
    follow: bool,
) -> int:
    """Print a task's ``stream`` ("stdout" or "stderr") from its sandbox on its agent; with
    ``follow``, keep printing until the task has ended and all is read. 0, or CliError.

    The master's state names the task's agent. With ``agent_id`` (a framework that remembers
    where its task ran), that agent is used even when the master no longer lists the task (it
    forgets finished ones), and the task counts as ended unless the master lists it live.
    """
    state = await _state(master, curve, timeout)
    task = _find_task(state, task_id, framework_id)
    if task is None and agent_id is None:
        raise CliError(f"no task {task_id} known to the master")
    agents = {a.agent_id: a for a in state.agents}
    where = agent_id if agent_id is not None else task.agent_id if task is not None else ""
    agent = agents.get(AgentID(where))
    if agent is None:
        raise CliError(f"the agent {where} of task {task_id} is gone")
    framework = task.framework_id if task is not None else framework_id
    base = agent_url(agent)
    offset = 0
    terminal = task is None or is_terminal(task.state)
    while True:
        try:
            reading = read_sandbox_file(base, task_id, framework, stream, offset, timeout)
            async for data, next_offset in reading:
                sys.stdout.write(data)
                sys.stdout.flush()
                offset = next_offset
        except SandboxNotFound:
            if not follow or terminal:
                raise
            # the sandbox may not exist yet
        if not follow or terminal:
            return 0
        await asyncio.sleep(POLL_INTERVAL)
        now = _find_task(await _state(master, curve, timeout), task_id, framework)
        # Ended (or forgotten by the master): one more read drains what it wrote last.
        terminal = now is None or is_terminal(now.state)
