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

This module holds the life cycle (start-up, recovery, serving, shutdown); its parts live beside
it: :mod:`~agora.agent.server.startup` (executor socket, containment),
:mod:`~agora.agent.server.recovery` (adopting surviving executors),
:mod:`~agora.agent.server.intake` (frames in), :mod:`~agora.agent.server.core_feed` (the core,
the journal's commits), :mod:`~agora.agent.server.performer` (the core's actions),
:mod:`~agora.agent.server.launcher` (starting executors), :mod:`~agora.agent.server.outbox`
(messages out) and :mod:`~agora.agent.server.http_serve` (the HTTP API).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final

import structlog
import zmq
from agora.agent.containers.containerizer import Containerizer
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.isolation import ContainerConfig
from agora.agent.core import Agent, AgentConfig
from agora.agent.core.sandbox_gc import SandboxGc
from agora.agent.server.checkpointing import Checkpointer
from agora.agent.server.config import DaemonSettings
from agora.agent.server.containment import AgentContainment
from agora.agent.server.core_feed import CoreFeed
from agora.agent.server.disk_du import DiskIsolator
from agora.agent.server.history import AgentHistory
from agora.agent.server.intake import Intake
from agora.agent.server.isolation import IsolationError, choose_container_config
from agora.agent.server.journal import JournalError
from agora.agent.server.launcher import ExecutorLauncher
from agora.agent.server.outbox import AgentOutbox
from agora.agent.server.performer import ActionPerformer
from agora.agent.server.processes import ExecutorProcesses
from agora.agent.server.recovery import live_containers, recover_agent
from agora.agent.server.sandbox_gc import SandboxCollector
from agora.agent.server.startup import (
    advertised_endpoint,
    make_containment,
    open_executor_socket,
    port_of,
)
from agora.sdk.daemon.history import History
from agora.sdk.discovery import parse_masters
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID
from agora.sdk.messages import ContainerUsage, UnregisterAgent
from agora.sdk.transport import CurveClient, Dial, MasterLink, Server, TransportClosed
from aiohttp import web

__all__ = ["TICK_INTERVAL", "AgentDaemon", "advertised_endpoint"]

log = structlog.get_logger(__name__)

TICK_INTERVAL: Final = 0.1
_FLUSH_TIMEOUT: Final = 2.0  # at shutdown, how long queued messages may take to go out
_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class AgentDaemon:
    """One agent: run it with ``await AgentDaemon(config, settings).run()``.

    The transports default to ZeroMQ (a :class:`MasterLink` to ``settings.master``, an executor
    socket bound per ``settings.executor_bind``). ``dial`` makes the link to each master instead
    (see :meth:`MasterLink.connect`; ``curve`` is then unused); ``executor_server`` is the server
    executors reach the agent on, used as given (its ``endpoint`` is what executors are told) and
    left open for its owner to close. With both from an :class:`~agora.sdk.transport.InprocHub`
    the agent opens no socket. ``subreaper=False`` keeps the process from adopting orphans (an
    agent sharing its process, as in tests).
    """

    def __init__(
        self,
        config: AgentConfig,
        settings: DaemonSettings,
        *,
        curve: CurveClient | None = None,
        environ: Mapping[str, str] | None = None,
        dial: Dial | None = None,
        executor_server: Server | None = None,
        subreaper: bool = True,
    ) -> None:
        self._config = config
        self._settings = settings
        self._curve = curve
        self._dial = dial
        self._given_server = executor_server
        self._subreaper = subreaper
        self._environ = dict(os.environ if environ is None else environ)
        self._core = Agent(config)  # replaced in run() once the executor port is known
        self._work_dir = settings.work_dir
        self._outbox = AgentOutbox()
        self._stop = asyncio.Event()
        self._stop_reason = ""
        self._terminated_by_master = False
        #: Stop by draining (kill every executor, unregister) rather than leaving them running.
        self._drain = False
        self._checkpoint = Checkpointer(self._work_dir)
        self._exit_code = 0
        self._client: MasterLink | None = None
        self._history = AgentHistory(
            History(settings.history or None, config.hostname), config.resources
        )
        self._server: Server | None = None
        self._processes: ExecutorProcesses | None = None
        self._launcher: ExecutorLauncher | None = None
        self._endpoint = ""
        self._http: web.AppRunner | None = None
        self._http_port = 0
        self._containers = ContainerConfig()
        self._containment = AgentContainment(Containerizer(self._containers), lambda: self._core)
        self._forkserver: ForkServer | None = None
        #: Stimuli into the core, journal commits, then actions out.
        self._feed = CoreFeed(
            lambda: self._core,
            lambda: self._checkpoint,
            self._history,
            perform=self._perform,
            commit_failed=self._commit_failed,
        )
        #: Frames from the master and executors, and the master link's comings and goings.
        self._intake = Intake(
            lambda: self._core,
            self._feed.call,
            history=self._history,
            outbox=self._outbox,
            master=settings.master,
        )
        #: Carries out the core's actions (made in run(), with the executors' processes).
        self._performer: ActionPerformer | None = None
        # Read by /metrics at scrape time (agora.agent.server.metrics.AgentCounters).
        self.started = time.monotonic()
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

    @property
    def messages_received(self) -> int:
        """Frames from the master and executors that decoded."""
        return self._intake.messages_received

    @property
    def bad_frames_received(self) -> int:
        """Frames from the master and executors that did not decode."""
        return self._intake.bad_frames_received

    def bad_frames_by_peer(self) -> list[tuple[str, int]]:
        """(peer, bad frames) of the few peers with the most, among the recent."""
        return self._intake.bad_frames_by_peer()

    @property
    def latest_usage(self) -> tuple[ContainerUsage, ...]:
        """The container usage sampled for the latest PONG (empty: none, or no containers)."""
        return self._performer.latest_usage if self._performer is not None else ()

    @property
    def executor_auth_refused(self) -> int:
        """Registrations refused for a missing or wrong executor secret."""
        return self._performer.executor_auth_refused if self._performer is not None else 0

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
        self._server = self._given_server or open_executor_socket(
            self._settings, self._work_dir, records
        )
        if self._server is None:
            self._checkpoint.close()
            return 1
        self._endpoint = advertised_endpoint(self._server.endpoint)
        self._checkpoint.record_endpoint(self._server.endpoint)
        self._containment, self._forkserver = make_containment(
            self._settings,
            self._work_dir,
            self._endpoint,
            self._containers,
            cgroups,
            lambda: self._core,
        )
        self._processes = ExecutorProcesses(
            loop,
            self._work_dir,
            self._executor_exited,
            switch_user=self._settings.switch_user,
            subreaper=self._subreaper,
        )
        if self._settings.http_port is not None:
            # Before registering: the master learns the bound port in AgentInfo. Imported here:
            # it loads prometheus_client, which an agent without HTTP does not need.
            from agora.agent.server.http_serve import serve_http

            serving = await serve_http(
                self._settings, self._settings.http_port, lambda: self._core, self._work_dir, self
            )
            if serving is None:
                self._close_server()
                return 1
            self._http, self._http_port = serving
        self._config = replace(
            self._config,
            port=port_of(self._endpoint),
            http_port=self._http_port,
            address=self._settings.advertise_host if self._http_port else "",
            gpus=self._containment.assignable_gpus(),
        )
        self._core = Agent(self._config)
        self._launcher = ExecutorLauncher(
            self._processes,
            self._containment,
            settings=self._settings,
            work_dir=self._work_dir,
            endpoint=self._endpoint,
            containers=self._containers,
            environ=self._environ,
            grace=self._config.executor_shutdown_grace_period,
            agent_id=lambda: self._core.agent_id,
        )
        self._performer = ActionPerformer(
            outbox=self._outbox,
            containment=self._containment,
            disk=self.disk,
            history=self._history,
            launcher=self._launcher,
            processes=self._processes,
            terminate=self._terminate,
        )
        if not self._recover(records):
            self._close_server()
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
                masters = self._settings.master
                self._client = MasterLink.connect(
                    # A dial decides what its endpoints mean: they need not be ZeroMQ ones.
                    parse_masters(masters) if self._dial is None else masters.split(","),
                    curve=self._curve,
                    on_connected=self._intake.master_connected,
                    on_disconnected=self._intake.master_disconnected,
                    dial=self._dial,
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
                loop.create_task(
                    self._feed.serve(self._client, self._intake.from_master), name="agent-master"
                ),
                loop.create_task(
                    self._feed.serve(self._server, self._intake.from_executor),
                    name="agent-executors",
                ),
                loop.create_task(self._ticker(), name="agent-tick"),
                loop.create_task(self._outbox.run(self._client, self._server), name="agent-send"),
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
            self._close_server()
            if self._http is not None:
                try:
                    await self._http.cleanup()
                except Exception:
                    log.exception("http_shutdown_failed")
            self._checkpoint.close()
            if self._forkserver is not None:
                self._forkserver.close()
            if self._launcher is not None:
                self._launcher.close()
            if not self._drain:
                self._containment.tidy()
        log.info("agent_stopped", reason=self._stop_reason, status=self._exit_code)
        return self._exit_code

    def _close_server(self) -> None:
        """Close the executor socket the daemon opened (an injected server is its owner's)."""
        if self._server is not None and self._server is not self._given_server:
            self._server.close()

    def _make_disk_watchers(self) -> None:
        """The disk/du isolator (sandbox sizes, enforcement) and sandbox garbage collection,
        on the (resolved) work dir."""
        settings = self._settings
        self.disk = DiskIsolator(
            self._work_dir,
            settings.container_disk_watermark_interval,
            settings.enforce_container_disk_quota,
            lambda: self._core,
            lambda used: self._feed.call("disk_usage", self._core.disk_usage, used, time.time()),
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
        recovered = recover_agent(
            self._core,
            records,
            work_dir=self._work_dir,
            processes=self._processes,
            containment=self._containment,
            mode=self._settings.recover,
            now=time.time(),
        )
        if recovered is None:
            return False
        alive, actions = recovered
        self._feed.recovered(actions)
        # Containers of executors that died meanwhile go now; those of live ones (killed, in
        # cleanup mode) when their executor's exit is seen.
        self._containment.keep_only(live_containers(self._core, alive))
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
        assert self._processes is not None and self._launcher is not None
        self._launcher.stopping = True
        if not self._drain:
            # An exit (upgrade, restart): the executors stay and re-attach to the next agent.
            self._feed.flush()
            log.info("executors_left_running", count=len(self._processes))
            await self._outbox.flush(_FLUSH_TIMEOUT, self._client)
            return
        grace = self._config.executor_shutdown_grace_period
        # Executors keep talking while they wind down: their final updates reach the master.
        await self._processes.terminate_all(grace)
        agent_id = self._agent_id()
        if agent_id is not None and not self._terminated_by_master:
            self._outbox.put(None, UnregisterAgent(agent_id=agent_id))
        await self._outbox.flush(_FLUSH_TIMEOUT, self._client)
        # The master forgets this agent id: the next start is a new agent.
        self._checkpoint.discard()
        self._containment.release()

    def _agent_id(self) -> AgentID | None:
        return self._core.agent_id if self._core.registered else None

    # ---- stimuli ---------------------------------------------------------------------------

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
            self._feed.call("tick", self._core.tick, time.time())

    def _summarise_bad_frames(self) -> None:
        self._intake.summarise(time.monotonic())
        if self._performer is not None:
            self._performer.summarise(time.monotonic())

    def _executor_exited(
        self, framework_id: FrameworkID, executor_id: ExecutorID, status: int | None
    ) -> None:
        limitation = self._containment.executor_exited(framework_id, executor_id)
        self._feed.call(
            "executor_exited",
            self._core.executor_exited,
            framework_id,
            executor_id,
            status,
            time.time(),
            limitation,
        )

    def _commit_failed(self) -> None:
        self._exit_code = 1
        self.request_stop("cannot write the checkpoint")

    # ---- actions ---------------------------------------------------------------------------

    def _perform(self, actions: Iterable[object]) -> None:
        assert self._performer is not None
        failed = self._performer.perform(actions)
        # Reported after this batch, so that what the core said first also goes out first.
        for fid, eid, error in failed:
            self._feed.call(
                "executor_launch_failed",
                self._core.executor_launch_failed,
                fid,
                eid,
                error,
                time.time(),
            )

    def _terminate(self, reason: str) -> None:
        """The master ended this agent: drain, and do not unregister."""
        self._terminated_by_master = True
        self._drain = True
        self.request_stop(f"master: {reason}")
