"""The agent's start-up steps that need no core: its executor socket and its containers.

The executor socket is bound where the previous agent process had it when executors from then are
still running (they reconnect there), else afresh; executors are told the advertised endpoint (a
wildcard bind is reached through loopback). The containment wraps the containerizer with the
isolators chosen for this host, the image store and, under
isolation, the fork server that forks custom executors' containers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Final

from agora.agent.containers.cgroups import Cgroups
from agora.agent.containers.containerizer import Containerizer
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.isolation import ContainerConfig
from agora.agent.core import Agent
from agora.agent.server.checkpointing import Checkpointer
from agora.agent.server.config import DaemonSettings
from agora.agent.server.containment import AgentContainment
from agora.agent.server.executor_socket import bind_executor_socket, socket_dir, socket_modes
from agora.sdk.daemon.images import ImageStore
from agora.sdk.transport import ZmqServer

__all__ = ["advertised_endpoint", "make_containment", "open_executor_socket", "port_of"]

_ANY_HOSTS: Final = ("0.0.0.0", "*", "[::]", "::")


def advertised_endpoint(bound: str) -> str:
    """The endpoint executors connect to: a wildcard bind is reached through loopback."""
    scheme, sep, rest = bound.partition("://")
    if not sep or scheme != "tcp":
        return bound
    host, colon, port = rest.rpartition(":")
    if colon and host in _ANY_HOSTS:
        return f"tcp://127.0.0.1:{port}"
    return bound


def port_of(endpoint: str) -> int:
    """The TCP port of ``endpoint`` (0: none, as for ``ipc://``)."""
    _, _, port = endpoint.rpartition(":")
    return int(port) if port.isdigit() and int(port) <= 65_535 else 0


def open_executor_socket(
    settings: DaemonSettings, work_dir: str, records: Mapping[tuple[str, str], bytes]
) -> ZmqServer | None:
    """The executors' socket, per the checkpoint ``records``; None (logged) if none binds."""
    modes = socket_modes(switch_user=settings.switch_user, euid=os.geteuid())
    return bind_executor_socket(
        # Only running executors need the old endpoint; else it is chosen afresh.
        Checkpointer.executor_endpoint(records) if Checkpointer.executors(records) else None,
        settings.executor_bind,
        work_dir,
        modes,
    )


def make_containment(
    settings: DaemonSettings,
    work_dir: str,
    endpoint: str,
    containers: ContainerConfig,
    cgroups: Cgroups | None,
    core: Callable[[], Agent],
) -> tuple[AgentContainment, ForkServer | None]:
    """The agent's containment, and the fork server it uses (None: not isolated; the caller
    closes it at the end)."""
    images = ImageStore(settings.image_store) if settings.image_store else None
    # Custom executors' containers are forked by a small fork server (with a deadline on
    # each launch) and adopted by the agent, a subreaper, which reaps them.
    forkserver = ForkServer() if containers.isolated else None
    containment = AgentContainment(
        Containerizer(containers, cgroups, images, forkserver, agent_dir=socket_dir(endpoint)),
        core,
    )
    return containment, forkserver
