"""Choosing the agent's isolators at start: what ``--isolation`` asks for, what the host supports.

``auto`` takes every isolator the host supports (root: cgroups, namespaces, root filesystems;
otherwise ``posix`` alone, so an unprivileged agent still works). An explicit list the host cannot
honour is an error: the agent refuses to start rather than silently run tasks unisolated.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable

import structlog
from agora.agent.containers.cgroups import CgroupError, Cgroups
from agora.agent.containers.isolation import ContainerConfig, supported_isolators
from agora.agent.server.config import DaemonSettings

__all__ = [
    "IsolationError",
    "agent_cgroups_root",
    "choose_container_config",
    "destroy_orphan_containers",
    "release_agent_cgroups",
    "release_cgroups_of",
]

log = structlog.get_logger(__name__)


class IsolationError(Exception):
    """An isolator asked for is not available on this host."""


def agent_cgroups_root(cgroups_root: str, work_dir: str) -> str:
    """This agent's cgroup root: ``--cgroups-root`` plus a name derived from its work dir, so that
    several agents on one host never share containers' cgroups and a restarted agent finds its
    own again."""
    key = hashlib.sha1(os.path.realpath(work_dir).encode()).hexdigest()[:12]
    return f"{cgroups_root}/agent-{key}"


def destroy_orphan_containers(cgroups: Cgroups, keep: Iterable[str]) -> list[str]:
    """Destroy the containers under the agent's root that are not in ``keep`` (left by an
    agent that died with its executors, or by an executor that was killed)."""
    wanted = set(keep)
    destroyed = []
    for name in cgroups.names():
        if name in wanted:
            continue
        cgroup = cgroups.open(name)
        if cgroup is None:
            continue
        try:
            cgroup.destroy()
        except (OSError, CgroupError) as exc:
            log.error("orphan_container_destroy_failed", container=name, error=str(exc))
            continue
        destroyed.append(name)
    if destroyed:
        log.info("orphan_containers_destroyed", count=len(destroyed))
    return destroyed


def release_agent_cgroups(cgroups: Cgroups) -> None:
    """Destroy every container of the agent, then remove its (now empty) cgroup root and the
    ``--cgroups-root`` above it when no other agent uses that."""
    destroy_orphan_containers(cgroups, ())
    try:
        cgroups.cleanup_root()
    except (OSError, CgroupError) as exc:
        log.warning("cgroup_root_not_removed", error=str(exc))
        return
    for base in cgroups.roots:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(base))


def release_cgroups_of(work_dir: str, cgroups_root: str = "agora") -> None:
    """Destroy the containers of the agent whose work dir is ``work_dir`` and remove its cgroup
    root (for tools that clean up after agents: ``agora local``, test clusters). Root only."""
    if os.geteuid() != 0:
        return
    cgroups = Cgroups.detect(agent_cgroups_root(cgroups_root, work_dir), devices=True)
    if cgroups is not None:
        release_agent_cgroups(cgroups)


def choose_container_config(
    settings: DaemonSettings, work_dir: str
) -> tuple[ContainerConfig, Cgroups | None]:
    """The containerizer settings and the agent's cgroup root (None: no cgroup isolator in use);
    raises IsolationError when ``--isolation`` names an isolator the host lacks."""
    root = agent_cgroups_root(settings.cgroups_root, work_dir)
    is_root = os.geteuid() == 0
    gpus = bool(settings.gpus)
    cgroups = Cgroups.detect(root, devices=gpus) if is_root else None
    controllers = cgroups.controllers if cgroups is not None else frozenset()
    supported = supported_isolators(controllers, root=is_root, gpus=gpus)
    wanted = settings.isolation
    if wanted is None:
        chosen = supported
    else:
        missing = sorted(wanted - supported)
        if missing:
            raise IsolationError(
                f"isolators {', '.join(missing)} are not supported here "
                f"(supported: {', '.join(sorted(supported))})"
            )
        chosen = wanted
    log.info(
        "isolators_chosen",
        isolators=",".join(sorted(chosen)),
        supported=",".join(sorted(supported)),
        cgroups_version=cgroups.version if cgroups is not None else None,
        cgroups_root=root if cgroups is not None else None,
    )
    config = ContainerConfig(
        isolators=chosen,
        cgroups_root=root,
        cfs_quota=settings.cgroups_enable_cfs,
        image_store=settings.image_store or None,
        fetch_cache=settings.fetcher_cache_dir or None,
        fetch_cache_max=settings.fetcher_cache_bytes,
        gpus=tuple((g.index, g.minor) for g in settings.gpus) if "gpu/nvidia" in chosen else (),
    )
    return config, cgroups if config.cgroup_controllers else None
