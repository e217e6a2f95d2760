"""The agent daemon: the master link, the executor socket and the processes, around the core.

One asyncio loop. Frames from the master (a DEALER to ``--master``) and from executors (a ROUTER on
``--executor-bind``) go to the pure :class:`agora.agent.core.Agent` as they arrive, a burst at a
time (``recv_nowait``); the actions it returns are performed at once: messages are queued on one
ordered outbox that a single sender task drains, launches and signals happen in place. The core
ticks every 0.1 s. Bad frames are logged and dropped; nothing a peer sends stops the daemon.

Durability: every change the core makes to its durable state (agent id, frameworks, executors,
tasks, unacknowledged status updates) is written to the journal under ``<work-dir>/meta`` and
committed (one fsync per burst of stimuli) before the actions it caused are performed, so nothing
acknowledged to an executor can be lost. A restarted agent recovers from it (see
:mod:`agora.agent.server.checkpointing`): executors still running are adopted and re-attach
(``--recover=reconnect``) or are killed (``--recover=cleanup``); it re-registers with the same id.

SIGTERM/SIGINT: the agent exits and leaves its executors running (they wait up to their recovery
timeout for it to come back), as for an upgrade. SIGUSR1, or SHUTDOWN_AGENT from the master,
drains: every executor gets SIGTERM, then SIGKILL after the executor shutdown grace period, what
they leave behind is killed, the status updates that produced are flushed, the master is told
UNREGISTER_AGENT, the checkpoint is discarded, and :meth:`AgentDaemon.run` returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Final

import structlog
import zmq
from agora.agent.containers.containerizer import (
    Containerizer,
    container_name,
)
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.gpus import GpuAllocator
from agora.agent.containers.isolation import CONTAINER_CONFIG_ENV, ContainerConfig
from agora.agent.core import (
    Agent,
    AgentConfig,
    ExecutorRefused,
    LaunchExecutor,
    SignalExecutor,
    Terminate,
    ToExecutor,
    ToMaster,
)
from agora.agent.core.sandbox_gc import SandboxGc
from agora.agent.server.checkpointing import Checkpointer, find_alive
from agora.agent.server.config import DaemonSettings, option_env_names
from agora.agent.server.containment import AgentContainment
from agora.agent.server.disk_du import DiskIsolator
from agora.agent.server.executor_socket import bind_executor_socket, socket_dir, socket_modes
from agora.agent.server.gpu_assign import GpuAssignments
from agora.agent.server.history import AgentHistory
from agora.agent.server.isolation import (
    IsolationError,
    choose_container_config,
)
from agora.agent.server.journal import JournalError
from agora.agent.server.processes import (
    ExecutorProcesses,
    ExecutorStarter,
    LaunchError,
    executor_argv,
    executor_environment,
    resolve_sandbox,
    runs_default_executor,
)
from agora.agent.server.sandbox_gc import SandboxCollector
from agora.agent.server.zygote import ExecutorZygote
from agora.sdk.batching import BATCHES, coalesce, unbatch
from agora.sdk.discovery import parse_masters
from agora.sdk.history import History
from agora.sdk.httpd import start_http
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID
from agora.sdk.images import ImageStore
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    ContainerUsage,
    Error,
    KillTask,
    Message,
    Pong,
    Reason,
    StatusUpdateMessage,
    UnregisterAgent,
)
from agora.sdk.ratelimit import KeyedLogLimiter
from agora.sdk.transport import CurveClient, MasterLink, Received, TransportClosed, ZmqServer
from aiohttp import web

__all__ = ["TICK_INTERVAL", "AgentDaemon", "advertised_endpoint"]

log = structlog.get_logger(__name__)

TICK_INTERVAL: Final = 0.1
_BURST: Final = 512  # frames handled per turn before yielding to the other tasks
_FLUSH_TIMEOUT: Final = 2.0  # at shutdown, how long queued messages may take to go out
_SETTLE: Final = 0.1  # seconds, see _shutdown
_ANY_HOSTS: Final = ("0.0.0.0", "*", "[::]", "::")
_MASTER_PEER: Final = "master"  # the bad-frame limiter's key for frames from the master
_BAD_FRAME_TOP_PEERS: Final = 10  # how many peers /metrics names in the per-peer bad frames
_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def advertised_endpoint(bound: str) -> str:
    """The endpoint executors connect to: a wildcard bind is reached through loopback."""
    scheme, sep, rest = bound.partition("://")
    if not sep or scheme != "tcp":
        return bound
    host, colon, port = rest.rpartition(":")
    if colon and host in _ANY_HOSTS:
        return f"tcp://127.0.0.1:{port}"
    return bound


def _port_of(endpoint: str) -> int:
    _, _, port = endpoint.rpartition(":")
    return int(port) if port.isdigit() and int(port) <= 65_535 else 0


class AgentDaemon:
    """One agent: run it with ``await AgentDaemon(config, settings).run()``."""

    def __init__(
        self,
        config: AgentConfig,
        settings: DaemonSettings,
        *,
        curve: CurveClient | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._settings = settings
        self._curve = curve
        self._environ = dict(os.environ if environ is None else environ)
        self._core = Agent(config)  # replaced in run() once the executor port is known
        self._work_dir = settings.work_dir
        self._outbox: deque[tuple[str | None, Message]] = deque()  # (None = master | peer, msg)
        self._outbox_ready = asyncio.Event()
        #: The master said it reads batches (STATUS_UPDATES) when it last accepted this agent.
        self._master_reads_batches = False
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._stopping = False
        self._terminated_by_master = False
        #: Stop by draining (kill every executor, unregister) rather than leaving them running.
        self._drain = False
        self._checkpoint = Checkpointer(self._work_dir)
        #: Actions held while a burst of stimuli is fed to the core (performed after one commit).
        self._pending: list[object] = []
        self._in_burst = False
        self._exit_code = 0
        self._client: MasterLink | None = None
        self._history = AgentHistory(
            History(settings.history or None, config.hostname), config.resources
        )
        self._server: ZmqServer | None = None
        self._processes: ExecutorProcesses | None = None
        self._endpoint = ""
        self._http: web.AppRunner | None = None
        self._http_port = 0
        self._drop_env = option_env_names()
        self._containers = ContainerConfig()
        self._containment = AgentContainment(Containerizer(self._containers), lambda: self._core)
        self._forkserver: ForkServer | None = None
        self._zygote: ExecutorZygote | None = None
        # Read by /metrics at scrape time (agora.agent.server.metrics.AgentCounters).
        self.started = time.monotonic()
        #: Frames from the master and executors that decoded, and that did not.
        self.messages_received = 0
        self.bad_frames_received = 0
        #: Registrations refused for a missing or wrong executor secret.
        self.executor_auth_refused = 0
        #: Bad-frame warnings per peer ("master" or an executor's): a few a second, the rest
        #: counted and summarised; also the per-peer counts /metrics shows.
        self._bad_frame_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)
        #: Likewise for executor messages refused for a wrong secret (a stranger's flood).
        self._refusal_log = KeyedLogLimiter(rate=3.0, burst=3, max_keys=256)
        #: The container usage sampled for the latest PONG (empty: none, or no containers).
        self.latest_usage: tuple[ContainerUsage, ...] = ()
        #: The disk/du isolator (sandbox sizes, enforcement) and sandbox garbage collection.
        self.disk: DiskIsolator
        self.sandbox_gc: SandboxCollector
        self._make_disk_watchers()

    @property
    def core(self) -> Agent:
        return self._core

    @property
    def executor_endpoint(self) -> str:
        return self._endpoint

    @property
    def container_config(self) -> ContainerConfig:
        """The isolators in use and what the built-in executor needs to contain tasks."""
        return self._containers

    @property
    def http_port(self) -> int:
        """The bound port of the HTTP API (0: none)."""
        return self._http_port

    def uptime(self) -> float:
        """Seconds since the daemon was made."""
        return time.monotonic() - self.started

    def bad_frames_by_peer(self) -> list[tuple[str, int]]:
        """(peer, bad frames) of the few peers with the most, among the recent."""
        return self._bad_frame_log.counts(_BAD_FRAME_TOP_PEERS)

    # ---- life cycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT or SHUTDOWN_AGENT; returns the exit status (0)."""
        loop = asyncio.get_running_loop()
        os.makedirs(self._work_dir, exist_ok=True)
        self._work_dir = os.path.realpath(self._work_dir)
        self._checkpoint = Checkpointer(self._work_dir)
        self._make_disk_watchers()
        try:
            records = self._checkpoint.open()
        except (OSError, JournalError) as exc:
            log.error("checkpoint_unusable", work_dir=self._work_dir, error=str(exc))
            return 1
        try:
            self._containers, cgroups = choose_container_config(self._settings, self._work_dir)
        except IsolationError as exc:
            log.error("isolation_unavailable", error=str(exc))
            self._checkpoint.close()
            return 1
        modes = socket_modes(switch_user=self._settings.switch_user, euid=os.geteuid())
        self._server = bind_executor_socket(
            # Only running executors need the old endpoint; else it is chosen afresh.
            Checkpointer.executor_endpoint(records) if Checkpointer.executors(records) else None,
            self._settings.executor_bind,
            self._work_dir,
            modes,
        )
        if self._server is None:
            self._checkpoint.close()
            return 1
        self._endpoint = advertised_endpoint(self._server.endpoint)
        self._checkpoint.record_endpoint(self._server.endpoint)
        images = ImageStore(self._settings.image_store) if self._settings.image_store else None
        gpus = None
        if "gpu/nvidia" in self._containers.isolators:
            gpus = GpuAssignments(
                GpuAllocator(self._settings.gpus), os.path.join(self._work_dir, "gpus.json")
            )
        # Custom executors' containers are forked by a small fork server (with a deadline on
        # each launch) and adopted by the agent, a subreaper, which reaps them.
        self._forkserver = ForkServer() if self._containers.isolated else None
        self._containment = AgentContainment(
            Containerizer(
                self._containers,
                cgroups,
                images,
                self._forkserver,
                agent_dir=socket_dir(self._endpoint),
            ),
            lambda: self._core,
            gpus,
        )
        self._processes = ExecutorProcesses(
            loop, self._work_dir, self._executor_exited, switch_user=self._settings.switch_user
        )
        if self._processes.subreaper:
            # Built-in executors are forked from a warm process (re-parented to us, a subreaper).
            base = {k: v for k, v in self._environ.items() if k not in self._drop_env}
            self._zygote = ExecutorZygote(base)
        if self._settings.http_port is not None:
            # Before registering: the master learns the bound port in AgentInfo. Imported here:
            # it loads prometheus_client, which an agent without HTTP does not need.
            from agora.agent.server.http import make_app
            from agora.agent.server.http_auth import HttpAuth

            settings = self._settings
            auth = HttpAuth(settings.http_credentials, insecure=settings.insecure_http)
            app = make_app(lambda: self._core, self._work_dir, self, auth)
            try:
                self._http, _, self._http_port = await start_http(
                    app, self._settings.http_bind, self._settings.http_port
                )
            except OSError as exc:
                log.error(
                    "http_bind_failed",
                    host=self._settings.http_bind,
                    port=self._settings.http_port,
                    error=str(exc),
                )
                self._server.close()
                return 1
            log.info(
                "http_listening",
                host=self._settings.http_bind,
                port=self._http_port,
                credentials=settings.http_credentials is not None,
                insecure=settings.insecure_http,
            )
            if settings.http_credentials is None and not settings.insecure_http:
                log.warning(
                    "http_api_locked",
                    detail="no --http-credentials: every endpoint but /health answers 401; give "
                    'a TOML file of principal = "token" lines (agora local writes '
                    "$AGORA_HOME/keys/http-credentials.toml), or --insecure-http (implied by "
                    "--insecure) to serve without tokens",
                )
        self._config = replace(
            self._config,
            port=_port_of(self._endpoint),
            http_port=self._http_port,
            address=self._settings.advertise_host if self._http_port else "",
        )
        self._core = Agent(self._config)
        if not self._recover(records):
            self._server.close()
            self._checkpoint.close()
            return 1
        try:
            self.sandbox_gc.open()
        except OSError as exc:
            log.warning("sandbox_gc_unavailable", error=str(exc))
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._signalled, sig)
        tasks: list[asyncio.Task[None]] = []
        try:
            try:
                self._client = MasterLink.connect(
                    parse_masters(self._settings.master),
                    curve=self._curve,
                    on_connected=self._master_connected,
                    on_disconnected=self._master_disconnected,
                )
            except (zmq.ZMQError, ValueError) as exc:
                log.error("master_connect_failed", master=self._settings.master, error=str(exc))
                return 1
            log.info(
                "agent_started",
                master=self._settings.master,
                executor_endpoint=self._endpoint,
                work_dir=self._work_dir,
                hostname=self._config.hostname,
                resources=self._config.resources.to_text(),
                subreaper=self._processes.subreaper,
                isolation=",".join(sorted(self._containers.isolators)),
                pid=os.getpid(),
            )
            tasks = [
                loop.create_task(self._serve_master(), name="agent-master"),
                loop.create_task(self._serve_executors(), name="agent-executors"),
                loop.create_task(self._ticker(), name="agent-tick"),
                loop.create_task(self._sender(), name="agent-send"),
                loop.create_task(self.disk.run(), name="agent-disk"),
                loop.create_task(
                    self.sandbox_gc.run(self._settings.disk_watermark_interval),
                    name="agent-sandbox-gc",
                ),
            ]
            for task in tasks:
                task.add_done_callback(self._task_done)
            await self._stop.wait()
            log.info("agent_stopping", reason=self._stop_reason)
            await self._shutdown()
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            if self._processes is not None:
                self._processes.close()
            if self._client is not None:
                self._client.close()
            if self._server is not None:
                self._server.close()
            if self._http is not None:
                try:
                    await self._http.cleanup()
                except Exception:
                    log.exception("http_shutdown_failed")
            self._checkpoint.close()
            if self._forkserver is not None:
                self._forkserver.close()
            if self._zygote is not None:
                self._zygote.close()
            if not self._drain:
                self._containment.tidy()
        log.info("agent_stopped", reason=self._stop_reason, status=self._exit_code)
        return self._exit_code

    def _make_disk_watchers(self) -> None:
        """The disk/du isolator (sandbox sizes, enforcement) and sandbox garbage collection,
        on the (resolved) work dir."""
        settings = self._settings
        self.disk = DiskIsolator(
            self._work_dir,
            settings.container_disk_watermark_interval,
            settings.enforce_container_disk_quota,
            lambda: self._core,
            lambda used: self._call("disk_usage", self._core.disk_usage, used, time.time()),
        )
        self.sandbox_gc = SandboxCollector(
            self._work_dir,
            SandboxGc(settings.gc_delay, settings.gc_disk_headroom),
            lambda: self._core,
        )

    def _recover(self, records: dict[tuple[str, str], bytes]) -> bool:
        """Take the core's state back from the checkpoint and adopt the executors still running.
        False (the agent must not start) when the checkpoint cannot be read."""
        if not Checkpointer.recovering(records):
            self._containment.keep_only(())
            return True
        assert self._processes is not None
        cleanup = self._settings.recover == "cleanup"
        try:
            alive = find_alive(self._work_dir, Checkpointer.executors(records))
            for (fid, eid), pid in list(alive.items()):
                sandbox = resolve_sandbox(self._work_dir, f"frameworks/{fid}/executors/{eid}")
                if self._processes.adopt(fid, eid, pid, sandbox) is None:
                    del alive[(fid, eid)]
                else:
                    self._containment.adopt_executor(fid, eid, pid, sandbox)
            actions = self._core.recover(records, time.time(), alive=set(alive), cleanup=cleanup)
        except (ValueError, LaunchError) as exc:
            log.error(
                "checkpoint_unreadable",
                error=str(exc),
                hint="move <work-dir>/meta away to start this agent afresh",
            )
            return False
        log.info(
            "agent_recovered",
            agent_id=self._core.agent_id,
            tasks=len(self._core.state.tasks),
            executors_alive=len(alive),
            mode=self._settings.recover,
        )
        self._pending.extend(actions)
        if self._history.enabled:
            self._history.recovered(self._core.state.tasks)  # launched before the restart
            self._history.settled(self._core.state.tasks)
        self._checkpoint.save(self._core.checkpoint())
        self._flush()
        # Containers of executors that died meanwhile go now; those of live ones (killed, in
        # cleanup mode) when their executor's exit is seen.
        live = [
            container_name(task.framework_id, task.info.task_id)
            for task in self._core.state.tasks.values()
            if (task.framework_id, task.executor_id) in alive
        ]
        live += [container_name(fid, "executor", eid) for fid, eid in alive]
        self._containment.keep_only(live)
        return True

    def _signalled(self, sig: signal.Signals) -> None:
        if sig is signal.SIGUSR1:
            self._drain = True
        if self._stop.is_set() and self._processes is not None and self._drain:
            # A second signal while draining: no more grace.
            log.warning("agent_stop_hastened", signal=sig.name)
            self._processes.kill_all()
        self.request_stop(f"signal {sig.name}")

    def request_stop(self, reason: str) -> None:
        if not self._stop.is_set():
            self._stop_reason = reason
            self._stop.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, TransportClosed):
            log.error("agent_task_crashed", task=task.get_name(), error=repr(exc))
            self._exit_code = 1
            self.request_stop(f"internal error in {task.get_name()}")

    async def _shutdown(self) -> None:
        assert self._processes is not None
        self._stopping = True
        if not self._drain:
            # An exit (upgrade, restart): the executors stay and re-attach to the next agent.
            self._flush()
            log.info("executors_left_running", count=len(self._processes))
            await self._flush_outbox()
            return
        grace = self._config.executor_shutdown_grace_period
        # Executors keep talking while they wind down: their final updates reach the master.
        await self._processes.terminate_all(grace)
        agent_id = self._agent_id()
        if agent_id is not None and not self._terminated_by_master:
            self._outbox.append((None, UnregisterAgent(agent_id=agent_id)))
            self._outbox_ready.set()
        await self._flush_outbox()
        # The master forgets this agent id: the next start is a new agent.
        self._checkpoint.discard()
        self._containment.release()

    async def _flush_outbox(self) -> None:
        deadline = time.monotonic() + _FLUSH_TIMEOUT
        while self._outbox and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._client is not None and self._client.connected:
            # The sockets close without linger: give ZeroMQ's I/O thread a moment to write.
            await asyncio.sleep(_SETTLE)

    def _agent_id(self) -> AgentID | None:
        return self._core.agent_id if self._core.registered else None

    # ---- inputs ----------------------------------------------------------------------------

    async def _serve_master(self) -> None:
        assert self._client is not None
        client = self._client
        while True:
            received = await client.recv()
            self._in_burst = True
            try:
                self._from_master(received)
                n = 1
                while n < _BURST:
                    more = client.recv_nowait()
                    if more is None:
                        break
                    self._from_master(more)
                    n += 1
            finally:
                self._in_burst = False
                self._flush()
            await asyncio.sleep(0)

    async def _serve_executors(self) -> None:
        assert self._server is not None
        server = self._server
        while True:
            received = await server.recv()
            self._in_burst = True
            try:
                self._from_executor(received)
                n = 1
                while n < _BURST:
                    more = server.recv_nowait()
                    if more is None:
                        break
                    self._from_executor(more)
                    n += 1
            finally:
                self._in_burst = False
                self._flush()
            await asyncio.sleep(0)

    async def _ticker(self) -> None:
        assert self._processes is not None
        processes = self._processes
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            next_tick += TICK_INTERVAL
            delay = next_tick - loop.time()
            if delay < 0:  # fell behind (a stall): do not try to catch up tick by tick
                next_tick = loop.time()
                delay = 0
            await asyncio.sleep(delay)
            try:
                processes.sweep()
            except Exception:
                log.exception("reap_failed")
            self._summarise_bad_frames()
            self._call("tick", self._core.tick, time.time())

    def _summarise_bad_frames(self) -> None:
        suppressed = self._bad_frame_log.summary(time.monotonic())
        if suppressed is not None:
            log.warning("bad_frames_suppressed", **suppressed.log_fields())
        refused = self._refusal_log.summary(time.monotonic())
        if refused is not None:
            log.warning("executor_auth_refusals_suppressed", **refused.log_fields())

    def _from_master(self, received: Received) -> None:
        message = received.message
        if message is None:
            self.bad_frames_received += 1
            if self._bad_frame_log.allow(_MASTER_PEER, time.monotonic()):
                log.warning("bad_frame_from_master", error=str(received.error))
            return
        self.messages_received += 1
        if isinstance(message, Error):
            log.warning("master_error", code=message.code.value, message=message.message)
        elif isinstance(message, KillTask):
            task = self._core.state.tasks.get((message.framework_id, message.task_id))
            log.info(
                "kill_received",
                framework_id=message.framework_id,
                task_id=message.task_id,
                kill_id=message.kill_id,
                task_state=task.state.value if task is not None else None,
                launched=task.launched if task is not None else None,
            )
        elif isinstance(message, AgentRegistered | AgentReregistered):
            self._master_reads_batches = BATCHES in message.master_info.features
        for part in unbatch(message):
            if self._history.enabled:
                self._history.from_master(part, received.epoch, self._core.state.master_epoch)
            self._call("from_master", self._core.from_master, part, received.epoch, time.time())

    def _from_executor(self, received: Received) -> None:
        message = received.message
        if message is None:
            self.bad_frames_received += 1
            if self._bad_frame_log.allow(received.peer, time.monotonic()):
                log.warning(
                    "bad_frame_from_executor", peer=received.peer, error=str(received.error)
                )
            return
        self.messages_received += 1
        self._call("from_executor", self._core.from_executor, received.peer, message, time.time())

    def _master_connected(self) -> None:
        log.info("master_connected", master=self._settings.master)
        self._call("connected", self._core.connected, time.time())

    def _master_disconnected(self) -> None:
        self._master_reads_batches = False  # until the next master says it does
        log.warning("master_disconnected", master=self._settings.master)
        self._call("disconnected", self._core.disconnected, time.time())

    def _executor_exited(
        self, framework_id: FrameworkID, executor_id: ExecutorID, status: int | None
    ) -> None:
        limitation = self._containment.executor_exited(framework_id, executor_id)
        self._call(
            "executor_exited",
            self._core.executor_exited,
            framework_id,
            executor_id,
            status,
            time.time(),
            limitation,
        )

    def _call(self, what: str, fn: Callable[..., Iterable[object]], *args: object) -> None:
        """Feed the core; a failure there is logged and dropped, never fatal. What the stimulus
        changed goes to the journal; its actions are performed once that is committed (at the
        end of the burst, when inside one)."""
        try:
            actions = fn(*args)
        except Exception:
            log.exception("core_failed", stimulus=what)
            return
        self._pending.extend(actions)
        if self._history.enabled:
            self._history.settled(self._core.state.tasks)
        self._checkpoint.save(self._core.checkpoint())
        if not self._in_burst:
            self._flush()

    def _flush(self) -> None:
        """Commit the journal (one fsync), then perform the actions it covers."""
        try:
            self._checkpoint.commit()
        except (OSError, JournalError) as exc:
            # Without a durable checkpoint nothing may be acknowledged: stop, keep the tasks.
            log.error("checkpoint_commit_failed", error=str(exc))
            self._exit_code = 1
            self.request_stop("cannot write the checkpoint")
            # Nothing that rests on the lost changes may happen: no launch, no acknowledgement.
            self._pending = []
        actions, self._pending = self._pending, []
        if actions:
            self._perform(actions)

    # ---- actions ---------------------------------------------------------------------------

    def _perform(self, actions: Iterable[object]) -> None:
        failed: list[tuple[FrameworkID, ExecutorID, str]] = []
        queued = False
        for action in actions:
            if isinstance(action, ToMaster):
                if self._history.enabled:
                    self._history.to_master(action.message)
                message = self._containment.to_master(action.message)
                if isinstance(message, Pong):
                    message = Pong(usage=self.disk.annotate(message.usage))
                    self.latest_usage = message.usage
                elif (
                    isinstance(message, StatusUpdateMessage)
                    and message.update.status.reason is Reason.TASK_UNAUTHORIZED
                ):
                    log.warning(
                        "task_unauthorized",
                        framework_id=message.update.framework_id,
                        task_id=message.update.status.task_id,
                        reason=message.update.status.message,
                    )
                self._outbox.append((None, message))
                queued = True
            elif isinstance(action, ToExecutor):
                message = self._containment.to_executor(action.message)
                if isinstance(message, KillTask):
                    log.info(
                        "kill_forwarded",
                        task_id=message.task_id,
                        kill_id=message.kill_id,
                        peer=action.peer,
                    )
                self._outbox.append((action.peer, message))
                queued = True
            elif isinstance(action, LaunchExecutor):
                error = self._launch(action)
                if error is not None:
                    failed.append((action.framework_id, action.executor_id, error))
            elif isinstance(action, SignalExecutor):
                assert self._processes is not None
                try:
                    self._processes.signal(action.framework_id, action.executor_id, action.kill)
                except OSError as exc:
                    log.warning("executor_signal_failed", error=str(exc))
            elif isinstance(action, ExecutorRefused):
                self.executor_auth_refused += 1
                if self._refusal_log.allow(action.peer, time.monotonic()):
                    log.warning(
                        "executor_auth_refused",
                        framework_id=action.framework_id,
                        executor_id=action.executor_id,
                        peer=action.peer,
                        reason=action.reason,
                    )
            elif isinstance(action, Terminate):
                log.warning("agent_terminated_by_master", reason=action.reason)
                self._terminated_by_master = True
                self._drain = True
                self.request_stop(f"master: {action.reason}")
            else:
                log.error("unknown_action", action=repr(action))
        if queued:
            self._outbox_ready.set()
        # Reported after this batch, so that what the core said first also goes out first.
        for fid, eid, error in failed:
            self._call(
                "executor_launch_failed",
                self._core.executor_launch_failed,
                fid,
                eid,
                error,
                time.time(),
            )

    def _launch(self, action: LaunchExecutor) -> str | None:
        """Start the executor; None when it is running, else why it could not start."""
        assert self._processes is not None
        fid, eid = action.framework_id, action.executor_id
        try:
            if self._stopping:
                raise LaunchError("the agent is shutting down")
            sandbox = resolve_sandbox(self._work_dir, action.sandbox)
            argv = executor_argv(action.info, action.builtin)
            required = {"AGORA_AGENT_ENDPOINT": self._endpoint, "AGORA_SANDBOX": sandbox}
            user = action.user
            if action.builtin or runs_default_executor(action.info):
                # Ours: it runs as the agent (it builds the tasks' containers) and starts each
                # task as the framework's user.
                required[CONTAINER_CONFIG_ENV] = self._containers.to_json()
                if user and self._settings.switch_user:
                    required["AGORA_TASK_USER"] = user
                if not self._settings.switch_user:
                    required["AGORA_SWITCH_USER"] = "0"
                if not action.builtin:
                    required["AGORA_DEFAULT_EXECUTOR"] = "1"
                user = None
            starter = None
            if not (action.builtin or runs_default_executor(action.info)):
                starter = self._containment.executor_starter(fid, eid, action.info, required)
            env = executor_environment(
                self._environ,
                drop=self._drop_env,
                info=action.info,
                given=self._executor_defaults(fid, eid) | dict(action.environment),
                required=required,
            )
            self._processes.launch(
                fid, eid, argv, sandbox, env, user, starter, self._fork_starter(action)
            )
        except LaunchError as exc:
            log.warning("executor_launch_failed", framework_id=fid, executor_id=eid, error=str(exc))
            return str(exc)
        except Exception as exc:  # the core must hear about every launch, whatever happened
            log.exception("executor_launch_crashed", framework_id=fid, executor_id=eid)
            return f"internal error: {exc!r}"
        return None

    def _fork_starter(self, action: LaunchExecutor) -> ExecutorStarter | None:
        """The zygote's spawn for a built-in executor once the zygote runs. The first launch
        starts the zygote and is itself started by exec: it need not wait for the zygote's
        imports, and an agent that never runs a built-in executor never pays for them."""
        zygote = self._zygote
        if zygote is None or not (action.builtin or runs_default_executor(action.info)):
            return None
        if zygote.pid is None:
            try:
                zygote.start()
            except OSError as exc:  # this launch and the next go by exec; it is tried again
                log.warning("executor_zygote_start_failed", error=str(exc))
            return None
        return zygote.spawn

    def _executor_defaults(self, fid: FrameworkID, eid: ExecutorID) -> dict[str, str]:
        env = {
            "AGORA_FRAMEWORK_ID": str(fid),
            "AGORA_EXECUTOR_ID": str(eid),
            "AGORA_SHUTDOWN_GRACE_PERIOD": repr(self._config.executor_shutdown_grace_period),
            "AGORA_RECOVERY_TIMEOUT": repr(self._settings.recovery_timeout),
        }
        agent_id = self._core.agent_id
        if agent_id is not None:
            env["AGORA_AGENT_ID"] = str(agent_id)
        return env

    async def _sender(self) -> None:
        """Send the outbox in order: the single writer of both sockets."""
        assert self._client is not None and self._server is not None
        client, server, outbox, ready = self._client, self._server, self._outbox, self._outbox_ready
        while True:
            await ready.wait()
            ready.clear()
            while outbox:
                if self._master_reads_batches and len(outbox) > 1:
                    # Status updates queued together reach the master as one message.
                    queued = list(outbox)
                    outbox.clear()
                    to_master = coalesce(m for peer, m in queued if peer is None)
                    sends: list[tuple[str | None, Message]] = [(None, m) for m in to_master]
                    sends += [(peer, m) for peer, m in queued if peer is not None]
                else:
                    sends = [outbox.popleft()]
                for peer, message in sends:
                    try:
                        if peer is None:
                            await client.send(message)
                        elif not await server.send(peer, message):
                            log.info("executor_unreachable", peer=peer, message=message.NAME)
                    except TransportClosed:
                        return
                    except Exception:
                        log.exception("send_failed", peer=peer, message=type(message).__name__)
