"""The socket the agent's executors connect to.

By default a ZeroMQ ``ipc://`` (Unix) socket, ``<work dir>/run/executors.sock``, in a directory
the agent owns: file permissions then say who may even reach it, on top of the per-executor
secret (``AGORA_EXECUTOR_SECRET``) that proves which executor is talking. TCP loopback is the
fallback when the path does not fit a Unix socket address (107 bytes) or this libzmq has no
``ipc`` transport, and stays a choice with ``--executor-bind tcp://…``.

Executors in containers reach the socket too: a Unix socket is found by path, so a network
namespace does not hide it; the containerizer keeps the run directory visible under a private
/tmp and binds it (read-only: connecting needs no write access to the mount) into a root
filesystem (see :data:`agora.agent.containers.containerizer.AGENT_DIR_IN_ROOTFS`).

Recovery: the endpoint is checkpointed; a restarted agent removes the dead socket file the
previous process left and binds the same path, and the running executors' ZeroMQ sockets
reconnect to it by themselves. The run directory itself is never replaced (containers hold bind
mounts of it), only its mode is set again.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Final

import structlog
import zmq
from agora.sdk.transport import ZmqServer

__all__ = [
    "RUN_DIR",
    "SOCKET_NAME",
    "TCP_FALLBACK",
    "SocketModes",
    "bind_executor_socket",
    "choose_endpoint",
    "ipc_path",
    "socket_dir",
    "socket_modes",
]

log = structlog.get_logger(__name__)

RUN_DIR: Final = "run"
SOCKET_NAME: Final = "executors.sock"
TCP_FALLBACK: Final = "tcp://127.0.0.1:0"


@dataclass(frozen=True)
class SocketModes:
    directory: int
    socket: int


def socket_modes(*, switch_user: bool, euid: int) -> SocketModes:
    """The tightest modes every executor of this agent can connect with.

    Custom executors run as their task's user (``ExecutorProcesses.account``) when the agent is
    root and switches users; connecting to a Unix socket needs search permission on its
    directory and write permission on the socket, so such an agent must let every user through:
    0711 (others may traverse, not list) and a 0666 socket, the executor secret remaining the
    authenticator. An agent that is not root, or runs everything as itself (--no-switch-user),
    has only executors of its own user: 0700 and 0600 shut every other local user out."""
    if switch_user and euid == 0:
        return SocketModes(directory=0o711, socket=0o666)
    return SocketModes(directory=0o700, socket=0o600)


def ipc_path(endpoint: str) -> str | None:
    """The file of an ``ipc://`` endpoint (None for any other transport)."""
    scheme, sep, path = endpoint.partition("://")
    return path if sep and scheme == "ipc" and path.startswith("/") else None


def socket_dir(endpoint: str) -> str | None:
    """The directory of an ``ipc://`` endpoint's socket, for containers to see (None: TCP)."""
    path = ipc_path(endpoint)
    return os.path.dirname(path) if path is not None else None


def choose_endpoint(explicit: str, work_dir: str, *, has_ipc: bool = True) -> tuple[str, str]:
    """(endpoint to bind, why) for a fresh agent: ``explicit`` (``--executor-bind``) when given,
    else the Unix socket in the run directory when its path fits, else TCP loopback."""
    if explicit:
        return explicit, "--executor-bind"
    if not has_ipc:
        return TCP_FALLBACK, "libzmq has no ipc transport"
    path = os.path.join(work_dir, RUN_DIR, SOCKET_NAME)
    if len(path.encode()) > zmq.IPC_PATH_MAX_LEN:
        return TCP_FALLBACK, f"{path} is longer than a Unix socket path ({zmq.IPC_PATH_MAX_LEN})"
    return f"ipc://{path}", "default"


def _prepare(path: str, modes: SocketModes) -> None:
    """Make the socket's directory (mode set even if it exists: never replaced, see above) and
    remove a socket file a dead agent left. Raises OSError (also for a non-socket at ``path``)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=modes.directory, exist_ok=True)
    os.chmod(directory, modes.directory)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    # The checkpoint journal is flock'ed: no live agent serves this work dir, the file is stale.
    os.unlink(path)
    log.info("executor_socket_stale_removed", path=path)


def _bind(endpoint: str, modes: SocketModes) -> ZmqServer:
    path = ipc_path(endpoint)
    if path is None:
        return ZmqServer.bind(endpoint)
    _prepare(path, modes)
    server = ZmqServer.bind(endpoint)
    try:
        os.chmod(path, modes.socket)
    except OSError:
        server.close()
        raise
    return server


def bind_executor_socket(
    recorded: str | None, explicit: str, work_dir: str, modes: SocketModes
) -> ZmqServer | None:
    """The executor socket: where the previous agent process had it, when recovering, so that
    its executors find this one; else (or if that fails) per :func:`choose_endpoint`. None (and
    logged) when nothing could be bound."""
    if recorded:
        try:
            server = _bind(recorded, modes)
        except (zmq.ZMQError, OSError) as exc:
            log.warning("executor_endpoint_not_recovered", endpoint=recorded, error=str(exc))
        else:
            _log_bound(server.endpoint, "recovered", modes)
            return server
    endpoint, why = choose_endpoint(explicit, work_dir, has_ipc=zmq.has("ipc"))
    try:
        server = _bind(endpoint, modes)
    except (zmq.ZMQError, OSError) as exc:
        if explicit:
            log.error("executor_bind_failed", endpoint=endpoint, error=str(exc))
            return None
        # The work dir's file system may refuse sockets: loopback then, as the fallback says.
        why = f"cannot bind {endpoint}: {exc}"
        try:
            server = _bind(TCP_FALLBACK, modes)
        except zmq.ZMQError as again:
            log.error("executor_bind_failed", endpoint=TCP_FALLBACK, error=str(again))
            return None
    _log_bound(server.endpoint, why, modes)
    return server


def _log_bound(endpoint: str, why: str, modes: SocketModes) -> None:
    if ipc_path(endpoint) is None:
        log.info("executor_socket_bound", endpoint=endpoint, transport="tcp", why=why)
        return
    log.info(
        "executor_socket_bound",
        endpoint=endpoint,
        transport="ipc",
        why=why,
        directory_mode=f"{modes.directory:04o}",
        socket_mode=f"{modes.socket:04o}",
    )
