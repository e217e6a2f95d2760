"""The master process: lock the work dir, bind, join the election group, serve until a signal.

``serve`` wires the pieces together: the ROUTER socket (with CURVE and the ACL when configured),
the :class:`MasterDaemon` that moves messages, the :class:`Leadership` (Raft member, registry
replica and, while leading, the core), the optional operator HTTP API, the endpoint files and the
history. It returns the process's exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import structlog
import zmq
from agora.master.core.run_as import RunAsPolicy
from agora.master.election.storage import StorageError
from agora.master.election.types import RaftConfig
from agora.master.server.config import DaemonSettings
from agora.master.server.daemon import MasterDaemon
from agora.master.server.leadership import Leadership
from agora.sdk.daemon.history import History
from agora.sdk.transport import Acl, CurveClient, CurveServer, ZmqServer

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["serve"]

log = structlog.get_logger(__name__)

#: libzmq I/O threads behind the master's socket. One thread reads and writes every client
#: connection and the other masters' too: with 10,000 agents re-registering at once it fell
#: more than the election timeout behind, so the other masters' replies reached the leader too
#: late and it lost its quorum under load it was otherwise keeping up with. Two share the
#: connections between them (and are what this master needs up to 10,000 agents measured).
IO_THREADS: Final = 2


async def serve(settings: DaemonSettings) -> int:
    """Bind, serve until SIGTERM/SIGINT, clean up. Returns the process exit status."""
    try:
        lock = _lock_work_dir(settings.work_dir)
    except OSError as exc:
        log.error("work_dir_unusable", work_dir=str(settings.work_dir), error=str(exc))
        return 1
    try:
        return await _serve_locked(settings)
    finally:
        lock.close()


async def _serve_locked(settings: DaemonSettings) -> int:
    curve: CurveServer | None = None
    acl: Acl | None = None
    try:
        if settings.curve_secret_key is not None and settings.curve_authorized_keys is not None:
            curve = CurveServer(settings.curve_secret_key, settings.curve_authorized_keys)
        if settings.acl is not None:
            acl = Acl.load(settings.acl)
    except (OSError, ValueError) as exc:
        log.error("security_config_unusable", error=str(exc))
        return 1
    if curve is None:
        log.warning(
            "running_insecure",
            insecure_flag=settings.insecure,
            hint="no CURVE: any local or network user who reaches this master's port can "
            "register agents, subscribe frameworks and make operator calls; give "
            "--curve-secret-key and --curve-authorized-keys",
        )
    try:
        server = ZmqServer.bind(settings.bind, curve=curve, io_threads=IO_THREADS)
    except (OSError, ValueError, zmq.ZMQError) as exc:
        log.error("bind_failed", bind=settings.bind, error=str(exc))
        return 1
    endpoint_file = settings.endpoint_file
    http: web.AppRunner | None = None
    history = History(settings.history, settings.advertise or server.endpoint)
    leadership: Leadership | None = None
    try:
        # The daemon feeds its core in bursts and allocates once per burst (Master.end_burst).
        config = replace(
            settings.master, address=server.endpoint, run_as=run_as_policy(acl), bursts=True
        )
        me = settings.advertise or server.endpoint
        masters = settings.masters or (me,)
        if me not in masters:
            log.error("not_a_member", advertise=me, masters=list(masters))
            return 1
        daemon = MasterDaemon(
            None,
            server,
            tick_interval=settings.tick_interval,
            peer_timeout=settings.peer_timeout,
            acl=acl,
            authenticated=curve is not None,
            electors=_electors(curve, acl),
            debug=settings.log_level == "debug",
            history=history,
        )
        raft = RaftConfig(
            node_id=me,
            members=masters,
            heartbeat_interval=settings.election_heartbeat,
            election_timeout=settings.election_timeout,
        )
        leadership = Leadership(
            replace(config, master_id=me),
            raft,
            settings.work_dir,
            on_change=daemon.leadership_changed,
            history=history,
            curve=_peer_curve(settings) if curve is not None else None,
            source_host=_host_of(me) if len(masters) > 1 else None,
        )
        daemon.attach(leadership)
        if len(masters) > 1 and curve is None:
            # Anyone who can reach this port could then speak for a master in the election.
            log.warning(
                "election_traffic_unauthenticated",
                hint="turn CURVE on: then only the masters' principal takes part in the election",
            )
        try:
            await leadership.start()
        except (OSError, ValueError, StorageError) as exc:
            log.error("election_state_unusable", work_dir=str(settings.work_dir), error=str(exc))
            return 1
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.stop)
        if settings.http_port is not None:
            # Imported here: aiohttp and prometheus_client cost a master without HTTP ~150 ms.
            from agora.master.server.http import Operator, make_app, start_http
            from agora.master.server.http_calls import load_credentials

            try:
                tokens = {}
                if settings.http_credentials is not None:
                    tokens = load_credentials(settings.http_credentials)
            except ValueError as exc:
                log.error("http_credentials_unusable", error=str(exc))
                return 1
            operator = Operator(
                daemon.call,
                tokens,
                authenticated=curve is not None,
                submit=daemon.submit,
                streams=daemon.streams,
            )
            try:
                app = make_app(
                    lambda: daemon.core,
                    daemon.stats,
                    daemon.leader_json,
                    members=daemon.members,
                    operator=operator,
                    # Election traffic comes only from the masters' principal under CURVE, so
                    # the leader URL a standby knows is the leader's own; without CURVE anyone
                    # could have planted it, and clients follow redirects with their token.
                    redirect=curve is not None,
                )
                http, http_url = await start_http(app, settings.http_bind, settings.http_port)
            except OSError as exc:
                log.error(
                    "http_bind_failed",
                    host=settings.http_bind,
                    port=settings.http_port,
                    error=str(exc),
                )
                return 1
            log.info("http_listening", url=http_url, credentials=bool(tokens))
            leadership.node.http_url = _advertised_http(http_url, me)
            if len(masters) > 1 and not leadership.node.http_url:
                log.warning(
                    "http_not_advertised",
                    url=http_url,
                    hint="standbys cannot redirect to this API: bind it where the others reach it",
                )
            if endpoint_file is not None:
                # Before the endpoint file: whoever sees that one finds this one too.
                _write_atomically(_http_file(endpoint_file), http_url + "\n")
        if endpoint_file is not None:
            _write_atomically(endpoint_file, server.endpoint + "\n")
        log.info(
            "master_bound",
            endpoint=server.endpoint,
            master_id=me,
            masters=list(masters),
            curve=curve is not None,
            acl=str(settings.acl) if settings.acl is not None else None,
            work_dir=str(settings.work_dir),
            pid=os.getpid(),
        )
        rc = await daemon.run()
        log.info("master_stopped", endpoint=server.endpoint, status=rc)
        return rc
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if leadership is not None:
            await leadership.stop()
        if http is not None:
            try:
                await http.cleanup()
            except Exception:
                log.exception("http_shutdown_failed")
        server.close()
        history.close()
        if endpoint_file is not None:
            for path in (endpoint_file, _http_file(endpoint_file)):
                with contextlib.suppress(OSError):
                    path.unlink()


def _electors(curve: CurveServer | None, acl: Acl | None) -> frozenset[str] | None:
    """Who may send election traffic under CURVE: the ACL's ``masters`` when it names them, else
    whoever holds this master's own key pair (the masters of a group share one). None: CURVE is
    off, and the daemon cannot tell senders apart."""
    if curve is None:
        return None
    if acl is not None and "*" not in acl.masters:
        return acl.masters
    return frozenset(name for key, name in curve.principals.items() if key == curve.public_key)


def _host_of(endpoint: str) -> str | None:
    """The host of ``tcp://host:port`` (outgoing election links bind to it), else None."""
    if not endpoint.startswith("tcp://"):
        return None
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    return None if host in ("", "*", "0.0.0.0", "::") else host


def _peer_curve(settings: DaemonSettings) -> CurveClient:
    """CURVE credentials for links to the other masters. The masters of one group share one key
    pair (deploy/README.md): each connects to the others with it, as client and as server key,
    and its public half sits among every master's authorized keys under the ACL's masters."""
    assert settings.curve_secret_key is not None
    return CurveClient(settings.curve_secret_key, settings.curve_secret_key)


def _lock_work_dir(work_dir: Path) -> IO[str]:
    """Create the work dir and take its lock: one master per work dir."""
    work_dir.mkdir(parents=True, exist_ok=True)
    handle = (work_dir / "master.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise OSError(f"another master holds {work_dir / 'master.lock'}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _http_file(endpoint_file: Path) -> Path:
    """Where the operator API's URL goes: ``<endpoint-file>.http``."""
    return endpoint_file.with_name(endpoint_file.name + ".http")


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _advertised_http(url: str, me: str) -> str:
    """The HTTP URL standbys redirect operators to ("": none they could reach). A wildcard bind
    is shown as the host this master advertises on ZeroMQ; a loopback one only when the masters
    themselves are on loopback (one machine), since on another host it would name that host."""
    scheme, _, rest = url.partition("://")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    mine = _host_of(me)
    if host in ("", "0.0.0.0", "::"):
        if mine is None:
            return ""
        host = mine
    elif _loopback(host) and (mine is None or not _loopback(mine)):
        return ""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def run_as_policy(acl: Acl | None) -> RunAsPolicy | None:
    """The core's run_as rule from the ACL (None: no ACL or no ``[run_as]``, any user)."""
    if acl is None or acl.run_as is None:
        return None
    return RunAsPolicy(users=dict(acl.run_as), defaults=dict(acl.default_user))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
