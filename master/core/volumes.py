"""Persistent volumes as resources: a volume of ``disk`` MB reserved to ``role`` is the set
item ``volumes(role):{volume_id}`` in an agent's total, in place of that disk. Pure helpers; the
operations live in launch.py (CREATE/DESTROY) and the agent's checkpoint in reservations.py."""

from __future__ import annotations

import re
from collections.abc import Iterable

from agora.sdk._resources_base import valid_role
from agora.sdk.messages import PersistentVolume
from agora.sdk.resources import UNRESERVED, Resources

__all__ = ["VOLUMES", "as_item", "create", "disk_of", "problem", "uncreate"]

#: The resource name of persistent volumes (a set of volume ids per role).
VOLUMES = "volumes"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

VolumeKey = tuple[str, str]


def as_item(volume: PersistentVolume) -> Resources:
    return Resources.from_dict({f"{VOLUMES}({volume.role})": [volume.volume_id]})


def disk_of(volume: PersistentVolume) -> Resources:
    return Resources.scalars(volume.role, disk=volume.disk)


def create(total: Resources, volumes: Iterable[PersistentVolume]) -> Resources:
    """``total`` with each volume's disk turned into its item (the disk must be there)."""
    for volume in volumes:
        total = total - disk_of(volume) + as_item(volume)
    return total


def uncreate(total: Resources, volumes: Iterable[PersistentVolume]) -> Resources:
    """The inverse of :func:`create`."""
    for volume in volumes:
        total = total - as_item(volume) + disk_of(volume)
    return total


def problem(volume: PersistentVolume) -> str | None:
    """What is wrong with the volume's own fields."""
    if not _ID.fullmatch(volume.volume_id):
        return f"volume id {volume.volume_id!r} must be letters, digits, '.', '_', '-' (<= 64)"
    if volume.role == UNRESERVED or not valid_role(volume.role):
        return f"a volume needs a role it is reserved to, not {volume.role!r}"
    return None
