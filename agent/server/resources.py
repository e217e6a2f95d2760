"""What this host offers: detected cpus, memory, disk and ports, overridable per resource name.

Detection follows the Mesos agent:

* ``cpus``: ``os.cpu_count()``;
* ``mem``: total RAM (``MemTotal`` of ``/proc/meminfo``) in MB, minus a reserve for the system
  of ``min(1 GB, 50%)``;
* ``disk``: free space of the work dir's file system in MB, minus ``min(5 GB, 50%)``;
* ``ports``: ``[31000-32000]``.

``--resources`` (text syntax, e.g. ``cpus:2;gpus:1;cpus(batch):2``) replaces the detected value of
every resource *name* it mentions, reservations included, and adds names detection does not know.
"""

from __future__ import annotations

import os
import shutil

from agora.sdk.attributes import parse_attributes
from agora.sdk.resources import ResourceError, Resources

__all__ = [
    "DEFAULT_PORTS",
    "DISK_RESERVE_MB",
    "MEM_RESERVE_MB",
    "apply_override",
    "detect_resources",
    "host_resources",
    "parse_attributes",
    "total_memory_mb",
]

MEM_RESERVE_MB = 1024  # at most this much RAM is left to the system (else half of it)
DISK_RESERVE_MB = 5 * 1024  # at most this much disk is left to the system (else half of it)
DEFAULT_PORTS = "[31000-32000]"


def total_memory_mb(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemTotal`` in MB, or None when it cannot be read."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    fields = line.split()
                    kib = int(fields[1])
                    unit = fields[2].lower() if len(fields) > 2 else "kb"
                    return kib // 1024 if unit == "kb" else kib // (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _after_reserve(total_mb: int, reserve_mb: int) -> int:
    return max(0, total_mb - min(reserve_mb, total_mb // 2))


def _existing_dir(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def detect_resources(work_dir: str, *, meminfo: str = "/proc/meminfo") -> Resources:
    """The host's resources as the agent would offer them without an override."""
    parts = [f"cpus:{os.cpu_count() or 1}"]
    mem = total_memory_mb(meminfo)
    if mem is not None:
        parts.append(f"mem:{_after_reserve(mem, MEM_RESERVE_MB)}")
    try:
        free_mb = shutil.disk_usage(_existing_dir(work_dir)).free // (1024 * 1024)
    except OSError:
        free_mb = None
    if free_mb is not None:
        parts.append(f"disk:{_after_reserve(free_mb, DISK_RESERVE_MB)}")
    parts.append(f"ports:{DEFAULT_PORTS}")
    return Resources.parse(";".join(parts))


def _key_name(key: str) -> str:
    """``"cpus(batch)"`` -> ``"cpus"``."""
    return key.split("(", 1)[0]


def apply_override(detected: Resources, override: Resources) -> Resources:
    """``detected`` with every resource name present in ``override`` replaced by it."""
    names = override.names()
    kept = {k: v for k, v in detected.to_dict().items() if _key_name(k) not in names}
    return Resources.from_dict(kept) + override


def host_resources(work_dir: str, override: str | None = None) -> Resources:
    """Detected resources with the ``--resources`` text applied; raises ValueError on bad text."""
    detected = detect_resources(work_dir)
    if not override or not override.strip():
        return detected
    try:
        parsed = Resources.parse(override)
    except ResourceError as exc:
        raise ValueError(f"bad resources {override!r}: {exc}") from None
    return apply_override(detected, parsed)
