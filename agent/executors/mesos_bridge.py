"""Run a Mesos custom executor (a program written against the Mesos v1 executor HTTP API, such
as a pymesos ``MesosExecutorDriver``) as an Agora executor.

    python -m agora.agent.executors.mesos_bridge 'COMMAND'

The agent starts this bridge as the executor, with the usual AGORA_* environment. The bridge
registers with the agent like any executor, serves ``POST /api/v1/executor`` on a port of
127.0.0.1 of its own, and starts ``COMMAND`` (through ``/bin/sh -c``, in the sandbox, in a
session of its own) with the environment Mesos gives an executor: ``MESOS_AGENT_ENDPOINT`` (the
bridge's ``host:port``), ``MESOS_FRAMEWORK_ID``, ``MESOS_EXECUTOR_ID``, ``MESOS_AGENT_ID`` (and
``MESOS_SLAVE_ID``), ``MESOS_DIRECTORY``, ``MESOS_SANDBOX`` and
``MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD``. The agent's secret for the executor is not passed on.

Then it relays: the agent's launches, kills, framework messages, acknowledgements and shutdown
become the stream's LAUNCH, LAUNCH_GROUP, KILL, MESSAGE, ACKNOWLEDGED and SHUTDOWN events;
the executor's UPDATE and MESSAGE calls go to the agent (an update keeps the executor's uuid,
so ACKNOWLEDGED names it). Events before the executor subscribes, or while it re-subscribes,
wait (the newest :data:`MAX_PENDING`). When the command exits the bridge stops, and the agent
reports whatever the executor left unfinished.

Only the command's own processes are served: each connection's client socket must be open in
one of them (see :mod:`agora.agent.executors.loopback_peer`); anyone else gets 403.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any, Final

import structlog
from agora.agent.executors.loopback_peer import descendants, holds_socket, socket_inode
from agora.sdk.daemon.httpd import start_http
from agora.sdk.errors import ProtocolError
from agora.sdk.executor import Executor, ExecutorDriver
from agora.sdk.ids import TaskID
from agora.sdk.mesos.executor_api import (
    MAX_CALL_BYTES,
    ExecutorCall,
    acknowledged_event,
    error_event,
    executor_call_from_mesos,
    heartbeat_event,
    kill_event,
    launch_event,
    launch_group_event,
    message_event,
    recordio,
    shutdown_event,
    subscribed_event,
)
from agora.sdk.messages import AgentInfo, ExecutorInfo, FrameworkInfo, TaskGroupInfo, TaskInfo
from aiohttp import web

__all__ = ["MAX_PENDING", "MesosBridge", "main"]

log = structlog.get_logger(__name__)

#: Events kept for an executor that has not subscribed (yet, or again).
MAX_PENDING: Final = 1024
#: Seconds between HEARTBEAT events on the stream.
HEARTBEAT_SECONDS: Final = 15.0
_PATH: Final = "/api/v1/executor"
_OWN_ENV: Final = ("AGORA_EXECUTOR_SECRET",)


class MesosBridge(Executor):
    """The Agora executor that relays between the agent and one Mesos executor command."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.endpoint = ""  # host:port, once serving
        self.child: asyncio.subprocess.Process | None = None
        self._driver: ExecutorDriver | None = None
        self._executor_info: ExecutorInfo | None = None
        self._framework_info: FrameworkInfo | None = None
        self._agent_info: AgentInfo | None = None
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
        self._stream: asyncio.Queue[dict[str, Any]] | None = None
        self._trusted: dict[int, bool] = {}  # client socket inode -> served
        self._runner: web.AppRunner | None = None
        self._watch: asyncio.Task[None] | None = None
        self.exit_code: int | None = None

    # -------------------------------------------------------------- the HTTP side

    async def serve(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        app = web.Application(client_max_size=MAX_CALL_BYTES)
        app.router.add_post(_PATH, self._call)
        self._runner, host, port = await start_http(app, "127.0.0.1", 0)
        self.endpoint = f"{host}:{port}"

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.put_nowait({})  # ends the stream
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._kill_child()

    async def _call(self, request: web.Request) -> web.StreamResponse:
        if not self._served(request):
            return _refuse(403, "only the executor this bridge started may call it")
        if request.content_type != "application/json":
            return _refuse(415, "Expecting 'Content-Type' of application/json")
        try:
            call = executor_call_from_mesos(json.loads(await request.read()))
        except (ValueError, UnicodeDecodeError) as exc:
            return _refuse(400, f"Failed to parse body into JSON: {exc}")
        except ProtocolError as exc:
            return _refuse(400, f"Failed to validate agent::Call: {exc}")
        except web.HTTPRequestEntityTooLarge:
            return _refuse(413, f"calls are at most {MAX_CALL_BYTES} bytes")
        driver, info = self._driver, self._executor_info
        if driver is None or info is None:
            return _refuse(503, "the executor is not registered with the agent yet")
        if (call.framework_id, call.executor_id) != (info.framework_id, info.executor_id):
            return _refuse(400, "the call names another framework or executor")
        if call.kind == "SUBSCRIBE":
            return await self._subscribe(request, info)
        return self._relay(driver, call)

    def _relay(self, driver: ExecutorDriver, call: ExecutorCall) -> web.StreamResponse:
        try:
            if call.status is not None:
                driver.send_status_update(call.status, keep_uuid=True)
            else:
                driver.send_framework_message(call.data)
        except ProtocolError as exc:
            return _refuse(400, f"Failed to validate agent::Call: {exc}")
        return web.Response(status=202)

    async def _subscribe(self, request: web.Request, info: ExecutorInfo) -> web.StreamResponse:
        if self._stream is not None:
            self._stream.put_nowait({})  # the newest subscription wins, as in Mesos
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._stream = queue
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        driver = self._driver
        assert driver is not None
        first = subscribed_event(
            info,
            self._framework_info,
            self._agent_info,
            agent_id=driver.agent_id,
            container_id=f"{info.framework_id}.{info.executor_id}",
        )
        try:
            await response.write(recordio(first))
            while self._pending and self._stream is queue:
                await response.write(recordio(self._pending.popleft()))
            while self._stream is queue:
                try:
                    event = await asyncio.wait_for(queue.get(), HEARTBEAT_SECONDS)
                except TimeoutError:
                    event = heartbeat_event()
                if not event:
                    break
                await response.write(recordio(event))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if self._stream is queue:
                self._stream = None
                self._pending.extendleft(reversed(_drain(queue)))
        return response

    def _served(self, request: web.Request) -> bool:
        child = self.child
        peer = request.transport.get_extra_info("peername") if request.transport else None
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        if child is None or not peer or not sock:
            return False
        inode = socket_inode(int(peer[1]), int(sock[1]))
        if inode is None:
            return False
        known = self._trusted.get(inode)
        if known is None:
            known = holds_socket(descendants(child.pid), inode) is not None
            if len(self._trusted) > 4096:
                self._trusted.clear()
            self._trusted[inode] = known
            if not known:
                log.warning("mesos_executor_api_refused", client_port=peer[1])
        return known

    def _emit(self, event: dict[str, Any]) -> None:
        if self._stream is not None:
            self._stream.put_nowait(event)
        else:
            self._pending.append(event)

    # -------------------------------------------------------------- the agent side

    async def registered(
        self,
        driver: ExecutorDriver,
        executor_info: ExecutorInfo,
        framework_info: FrameworkInfo,
        agent_info: AgentInfo,
    ) -> None:
        self._driver = driver
        self._executor_info = executor_info
        self._framework_info = framework_info
        self._agent_info = agent_info
        if self.child is None:
            await self._start_child(driver)

    def reregistered(self, driver: ExecutorDriver, agent_info: AgentInfo) -> None:
        self._agent_info = agent_info

    def launch_task(self, driver: ExecutorDriver, task: TaskInfo) -> None:
        self._emit(launch_event(task))

    def launch_task_group(
        self, driver: ExecutorDriver, executor_info: ExecutorInfo, group: TaskGroupInfo
    ) -> None:
        self._emit(launch_group_event(group.tasks))

    def kill_task(self, driver: ExecutorDriver, task_id: TaskID) -> None:
        self._emit(kill_event(task_id))

    def framework_message(self, driver: ExecutorDriver, data: bytes) -> None:
        self._emit(message_event(data))

    def acknowledged(self, driver: ExecutorDriver, task_id: TaskID, uuid: bytes) -> None:
        self._emit(acknowledged_event(task_id, uuid))

    def error(self, driver: ExecutorDriver, message: str) -> None:
        self._emit(error_event(message))

    async def shutdown(self, driver: ExecutorDriver) -> None:
        """Tell the executor, give it the grace period to finish, then kill what is left."""
        self._emit(shutdown_event())
        child = self.child
        if child is not None and child.returncode is None:
            grace = driver.environment.shutdown_grace_period
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), grace)
        await self._kill_child()

    async def _start_child(self, driver: ExecutorDriver) -> None:
        env = driver.environment
        grace = env.shutdown_grace_period
        environ = {k: v for k, v in os.environ.items() if k not in _OWN_ENV}
        environ.update(
            MESOS_AGENT_ENDPOINT=self.endpoint,
            MESOS_FRAMEWORK_ID=str(env.framework_id),
            MESOS_EXECUTOR_ID=str(env.executor_id),
            MESOS_DIRECTORY=env.sandbox,
            MESOS_SANDBOX=env.sandbox,
            MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD=f"{grace:g}secs",
        )
        agent_id = driver.agent_id
        if agent_id is not None:
            environ.update(MESOS_AGENT_ID=str(agent_id), MESOS_SLAVE_ID=str(agent_id))
        # A session of its own: a Mesos executor kills its process group on shutdown.
        self.child = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            self.command,
            cwd=env.sandbox,
            env=environ,
            start_new_session=True,
        )
        log.info("mesos_executor_started", pid=self.child.pid, endpoint=self.endpoint)
        self._watch = asyncio.get_running_loop().create_task(self._await_child(driver))

    async def _await_child(self, driver: ExecutorDriver) -> None:
        child = self.child
        assert child is not None
        self.exit_code = await child.wait()
        log.info("mesos_executor_exited", code=self.exit_code)
        driver.stop()

    async def _kill_child(self) -> None:
        child = self.child
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), 5.0)


def _drain(queue: asyncio.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    while not queue.empty():
        event = queue.get_nowait()
        if event:
            out.append(event)
    return out


def _refuse(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text)


async def _run(command: str, environ: Mapping[str, str] | None = None) -> int:
    bridge = MesosBridge(command)
    await bridge.serve()
    try:
        driver = ExecutorDriver(bridge, environ=environ)
        code = await driver.run()
    finally:
        await bridge.close()
    if code == 0 and bridge.exit_code:
        return 1  # the executor failed
    return code


def main(argv: list[str] | None = None) -> int:
    from agora.sdk.logs import configure_logging

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].strip():
        print("usage: python -m agora.agent.executors.mesos_bridge 'COMMAND'", file=sys.stderr)
        return 2
    configure_logging(os.environ.get("AGORA_LOG_FORMAT", "console"), "info")
    try:
        return asyncio.run(_run(args[0]))
    except ValueError as exc:  # a missing or bad AGORA_* variable
        log.error("bad_executor_environment", error=str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
