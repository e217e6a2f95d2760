"""Persistent volumes on disk: one directory per volume under the work dir, keyed by role and
volume id (never by the agent id, which a host reboot changes):
``<work-dir>/volumes/roles/<role>/<volume id>``. The core says when one is created or destroyed
(CreateVolume, DestroyVolume); an executor whose resources hold ``volumes(role):{id}`` finds it
at ``volumes/<id>`` in its sandbox (a symlink), so its data outlives the task and the agent.
"""

from __future__ import annotations

import os
import shutil

import structlog
from agora.sdk.resources import Resources

__all__ = ["VOLUMES", "create", "destroy", "link", "volume_dir"]

log = structlog.get_logger(__name__)

#: The resource name of persistent volumes, and the sandbox folder they appear in.
VOLUMES = "volumes"


def volume_dir(work_dir: str, role: str, volume_id: str) -> str:
    if "/" in role or "/" in volume_id or volume_id in ("", ".", ".."):
        raise ValueError(f"bad volume {role}/{volume_id}")
    return os.path.join(work_dir, VOLUMES, "roles", role, volume_id)


def create(work_dir: str, role: str, volume_id: str) -> None:
    path = volume_dir(work_dir, role, volume_id)
    os.makedirs(path, mode=0o750, exist_ok=True)
    log.info("volume_created", role=role, volume_id=volume_id, path=path)


def destroy(work_dir: str, role: str, volume_id: str) -> None:
    path = volume_dir(work_dir, role, volume_id)
    shutil.rmtree(path, ignore_errors=True)
    log.info("volume_destroyed", role=role, volume_id=volume_id, path=path)


def link(work_dir: str, sandbox: str, resources: Resources, owner: tuple[int, int] | None) -> None:
    """Make each volume the resources hold appear at ``volumes/<id>`` in ``sandbox`` (created
    here), owned by ``owner`` (uid, gid) when the executor runs as another user."""
    for role in sorted(resources.named(VOLUMES).roles()):
        for volume_id in sorted(resources.reserved(role).set_items(VOLUMES)):
            target = volume_dir(work_dir, role, volume_id)
            os.makedirs(target, mode=0o750, exist_ok=True)
            if owner is not None:
                os.chown(target, *owner)
            where = os.path.join(sandbox, VOLUMES)
            os.makedirs(where, exist_ok=True)
            path = os.path.join(where, volume_id)
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(target, path)
