"""``agora batch serve`` / ``python -m agora.frameworks.batch``: run the batch service.

It opens (or creates) the job store under ``--work-dir``, reloads every job that had not ended,
subscribes to the master as the framework id it had before (so its tasks kept running while it
was away, within ``--failover-timeout``), reconciles them, serves the HTTP API and records its
URL in ``$AGORA_HOME/batch``. The same API is served on a Unix socket (``--unix-socket``, by
default ``$AGORA_HOME/batch.sock``, mode 0666) where each local user submits as themself; over
TCP it needs a bearer token (``--http-credentials``) unless ``--insecure-http``. SIGTERM or
SIGINT stops it and leaves its tasks running for the next start; if the master forgot the
framework (its failover timeout passed), it subscribes afresh and requeues whatever the master no
longer knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import structlog
from agora.frameworks.batch.api import ClusterView, make_app
from agora.frameworks.batch.api_auth import ApiAuth, SocketInUse, remove_socket, start_unix
from agora.frameworks.batch.config import ServiceSettings, load_settings
from agora.frameworks.batch.core import BatchCore, CoreConfig
from agora.frameworks.batch.fairshare import FairShare
from agora.frameworks.batch.service import BatchService
from agora.frameworks.batch.store import JobStore, StoreError
from agora.sdk.daemon.httpd import start_http
from agora.sdk.discovery import agora_home, master_address
from agora.sdk.ids import FrameworkID
from agora.sdk.logs import configure_logging
from agora.sdk.messages import ErrorCode, FrameworkInfo
from agora.sdk.messages.enums import FrameworkCapability
from agora.sdk.operator import OperatorClient
from agora.sdk.scheduler import DriverError, SchedulerDriver
from agora.sdk.transport import CurveClient, discover_client
from aiohttp import web

__all__ = ["main"]

log = structlog.get_logger("agora.frameworks.batch")

TICK = 0.5
STOP_DEADLINE = 10.0


#: The longest path a Unix socket can have (sun_path, less its terminating NUL).
MAX_SOCKET_PATH = 107


def main(argv: Sequence[str] | None = None) -> int:
    settings = load_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    try:
        return asyncio.run(serve(settings))
    except (StoreError, SocketInUse) as exc:
        print(f"agora batch serve: {exc}", file=sys.stderr)
        return 1


def build_core(settings: ServiceSettings, store: JobStore) -> BatchCore:
    fairshare = FairShare(settings.half_life, shares=settings.shares)
    fairshare.restore(store.load_usage())
    config = CoreConfig(
        roles=settings.roles,
        retry_backoff=settings.retry_backoff,
        retry_backoff_max=settings.retry_backoff_max,
        max_losses=settings.max_losses,
        unreachable_timeout=settings.unreachable_timeout,
        half_life=settings.half_life,
        preempt=settings.preempt,
        preempt_after=settings.preempt_after,
        preempt_min_runtime=settings.preempt_min_runtime,
    )
    core = BatchCore(config, fairshare)
    jobs, tasks = store.load_active()
    core.load(jobs, tasks, store.load_job_states(), time.time())
    return core


async def serve(settings: ServiceSettings) -> int:
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    store = JobStore.open(settings.work_dir / "jobs.sqlite")
    try:
        return await _serve(settings, store)
    finally:
        store.close()


async def _serve(settings: ServiceSettings, store: JobStore) -> int:
    core = build_core(settings, store)
    service = BatchService(core, store)
    curve = None
    if settings.curve_secret_key and settings.curve_server_key:
        curve = CurveClient(settings.curve_secret_key, settings.curve_server_key)
    else:
        curve = discover_client()  # this user's keys from agora local, if any
    if curve is None:
        log.warning(
            "running_insecure",
            hint="no CURVE: the link to the master is neither encrypted nor authenticated; "
            "give --curve-secret-key and --curve-server-key",
        )
    master = master_address(settings.master)
    operator = OperatorClient(master, curve=curve)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signo, stop.set)
    service.on_failure = lambda _exc: stop.set()
    auth = ApiAuth(credentials=settings.http_credentials, insecure_http=settings.insecure_http)
    runner, host, port = await start_http(
        make_app(service, ClusterView(operator), settings.roles, auth=auth),
        settings.http_bind,
        settings.http_port,
    )
    url = f"http://{_url_host(host)}:{port}"
    try:
        sock_path, sock_inode = await _serve_unix(runner, settings)
    except BaseException:
        await runner.cleanup()
        raise
    _log_http_policy(auth)
    written = _announce(url, settings)
    log.info(
        "batch_service_started",
        url=url,
        unix_socket=str(sock_path) if sock_path else None,
        work_dir=str(settings.work_dir),
        master=master,
    )
    ticker = asyncio.create_task(_tick(service), name="batch-tick")
    code = 0
    try:
        code = await _run_driver(settings, service, store, master, curve, stop)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        service.flush()
        if sock_path is not None:
            remove_socket(sock_path, sock_inode)
        await runner.cleanup()
        for path in written:
            _remove_if_ours(path, url)
        for signo in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signo)
    if service.failed is not None:
        code = 1
    log.info("batch_service_stopped", code=code)
    return code


async def _run_driver(
    settings: ServiceSettings,
    service: BatchService,
    store: JobStore,
    master: str,
    curve: CurveClient | None,
    stop: asyncio.Event,
) -> int:
    """Run drivers until asked to stop; a new subscription when the master forgot us."""
    while not stop.is_set():
        known = store.get_meta("framework_id")
        # Revocable offers too: a task the master takes back is requeued without a retry.
        capabilities = [
            FrameworkCapability.PARTITION_AWARE,
            FrameworkCapability.GANG,
            FrameworkCapability.REVOCABLE_RESOURCES,
        ]
        if len(settings.roles) > 1:
            capabilities.append(FrameworkCapability.MULTI_ROLE)
        info = FrameworkInfo(
            name=settings.name,
            user=getpass.getuser(),
            roles=settings.roles,
            failover_timeout=settings.failover_timeout,
            capabilities=tuple(capabilities),
            hostname=socket.gethostname(),
            framework_id=FrameworkID(known) if known else None,
            checkpoint=True,
        )
        driver = SchedulerDriver(
            service, info, master, implicit_acknowledgements=False, curve=curve
        )
        service.driver = driver
        running = asyncio.create_task(driver.run(), name="batch-driver")
        stopping = asyncio.create_task(stop.wait(), name="batch-stop")
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not running.done():
            driver.stop(failover=True)  # our tasks keep running for the next start
            with contextlib.suppress(Exception):
                await asyncio.wait_for(driver.join(), STOP_DEADLINE)
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
            return 0
        error = running.exception()
        if isinstance(error, DriverError) and error.code is ErrorCode.FRAMEWORK_REMOVED:
            log.warning("batch_framework_forgotten", framework_id=known, error=str(error))
            store.set_meta("framework_id", "")
            continue
        if error is not None:
            log.error("batch_driver_failed", error=str(error))
            return 1
        return 0
    return 0


async def _serve_unix(runner: web.AppRunner, settings: ServiceSettings) -> tuple[Path | None, int]:
    """Serve the API on the settings' Unix socket: (its path, its inode), or (None, 0)."""
    path = settings.unix_socket
    if path is None:
        return None, 0
    path = path.absolute()
    try:
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise SocketInUse(f"{path} is longer than a Unix socket path can be")
        try:
            return path, await start_unix(runner, path)
        except OSError as exc:
            raise SocketInUse(f"cannot serve the Unix socket {path}: {exc}") from None
    except SocketInUse as exc:
        if settings.unix_socket_explicit:
            raise
        # The default path (another service on this $AGORA_HOME, say): serve TCP alone.
        log.warning("batch_unix_socket_skipped", path=str(path), reason=str(exc))
        return None, 0


def _log_http_policy(auth: ApiAuth) -> None:
    if auth.insecure_http:
        log.warning(
            "batch_http_insecure",
            hint="--insecure-http: anyone who reaches the TCP API is an operator and may run "
            "jobs as any user, root included",
        )
    elif auth.credentials is None:
        log.info(
            "batch_http_locked",
            hint="no --http-credentials: TCP serves only /health; submit through the Unix socket",
        )


async def _tick(service: BatchService) -> None:
    while True:
        await asyncio.sleep(TICK)
        try:
            service.tick()
        except Exception:
            log.exception("batch_tick_failed")


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _announce(url: str, settings: ServiceSettings) -> list[Path]:
    written = []
    for path in (agora_home() / "batch", settings.endpoint_file):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=path.parent, prefix=f".{path.name}.", delete=False, encoding="utf-8"
            ) as tmp:
                tmp.write(url + "\n")
            os.replace(tmp.name, path)
            written.append(path)
        except OSError as exc:
            log.warning("batch_url_not_recorded", path=str(path), error=str(exc))
    return written


def _remove_if_ours(path: Path, url: str) -> None:
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8").strip() == url:
            path.unlink()


if __name__ == "__main__":
    sys.exit(main())
