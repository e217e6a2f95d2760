"""Which isolators an agent uses: parsing ``--isolation``, detecting what the host supports, and the
settings the agent hands to the executors that start containers.

Isolators (Mesos names where Mesos has one):

* ``posix`` — always on: the task runs in its own session, its sandbox as cwd.
* ``cgroups/cpu``, ``cgroups/mem``, ``cgroups/pids`` — a cgroup per container: cpu shares (and a
  CFS quota with ``--cgroups-enable-cfs``), a hard memory limit, a pids limit.
* ``namespaces/pid`` (with a tiny init as pid 1), ``namespaces/mount`` (private /tmp),
  ``namespaces/uts`` (own host name), ``namespaces/ipc``, ``namespaces/net`` (loopback only, for
  tasks that ask for it).
* ``filesystem/rootfs`` — tasks naming an image run in its root filesystem.
* ``gpu/nvidia`` — tasks get exactly their GPUs (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CGROUP_ISOLATORS",
    "CONTAINER_CONFIG_ENV",
    "ISOLATORS",
    "NAMESPACE_ISOLATORS",
    "ContainerConfig",
    "parse_isolation",
    "supported_isolators",
]

CGROUP_ISOLATORS: Final = {"cgroups/cpu": "cpu", "cgroups/mem": "memory", "cgroups/pids": "pids"}
NAMESPACE_ISOLATORS: Final = {
    "namespaces/pid": "pid",
    "namespaces/mount": "mount",
    "namespaces/uts": "uts",
    "namespaces/ipc": "ipc",
    "namespaces/net": "net",
}
ISOLATORS: Final[tuple[str, ...]] = (
    "posix",
    *CGROUP_ISOLATORS,
    *NAMESPACE_ISOLATORS,
    "filesystem/rootfs",
    "gpu/nvidia",
)
#: The environment variable that carries a ContainerConfig (JSON) from the agent to executors.
CONTAINER_CONFIG_ENV: Final = "AGORA_CONTAINER_CONFIG"
_ALIASES: Final = {"cgroups/memory": "cgroups/mem", "filesystem/linux": "filesystem/rootfs"}


def parse_isolation(text: str) -> frozenset[str] | None:
    """``--isolation``: a comma-separated list of isolators, or ``auto`` (None: every isolator
    the host supports). Raises ValueError naming an unknown isolator."""
    value = text.strip()
    if value.lower() in ("", "auto", "default"):
        return None
    chosen = {"posix"}
    for item in value.split(","):
        name = _ALIASES.get(item.strip(), item.strip())
        if not name:
            continue
        if name not in ISOLATORS:
            raise ValueError(f"unknown isolator {name!r} (known: {', '.join(ISOLATORS)})")
        chosen.add(name)
    return frozenset(chosen)


def supported_isolators(
    cgroup_controllers: Iterable[str], *, root: bool, gpus: bool = False
) -> frozenset[str]:
    """What this host supports: cgroup isolators for the usable controllers; namespaces and root
    filesystems need root; ``gpu/nvidia`` needs GPUs."""
    have = set(cgroup_controllers)
    found = {"posix"} | {name for name, ctl in CGROUP_ISOLATORS.items() if ctl in have}
    if root:
        found |= set(NAMESPACE_ISOLATORS) | {"filesystem/rootfs"}
    if gpus:
        found.add("gpu/nvidia")
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """The agent's containerizer settings, as executors that start containers need them."""

    isolators: frozenset[str] = frozenset({"posix"})
    #: The cgroup (relative to the agent's own cgroup) under which its containers' cgroups live.
    cgroups_root: str = "agora"
    cfs_quota: bool = False
    #: The most processes one container may hold (cgroups/pids).
    pids_max: int = 4096
    image_store: str | None = None
    fetch_cache: str | None = None
    fetch_cache_max: int = 2 * 1024**3
    #: The agent's GPUs as (index, device minor), for the devices cgroup (gpu/nvidia).
    gpus: tuple[tuple[int, int], ...] = ()

    @property
    def cgroup_controllers(self) -> frozenset[str]:
        return frozenset(ctl for name, ctl in CGROUP_ISOLATORS.items() if name in self.isolators)

    @property
    def namespaces(self) -> frozenset[str]:
        """Namespaces every container gets (``net`` only for tasks that ask for it)."""
        spaces = {ns for name, ns in NAMESPACE_ISOLATORS.items() if name in self.isolators}
        if "pid" in spaces:
            spaces.add("mount")  # a pid namespace needs its own /proc
        spaces.discard("net")
        return frozenset(spaces)

    @property
    def isolated(self) -> bool:
        """More than posix: processes start through the container launcher."""
        return bool(self.cgroup_controllers or self.namespaces)

    def to_json(self) -> str:
        return json.dumps(
            {
                "isolators": sorted(self.isolators),
                "cgroups_root": self.cgroups_root,
                "cfs_quota": self.cfs_quota,
                "pids_max": self.pids_max,
                "image_store": self.image_store,
                "fetch_cache": self.fetch_cache,
                "fetch_cache_max": self.fetch_cache_max,
                "gpus": [list(g) for g in self.gpus],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ContainerConfig:
        """Raises ValueError on anything malformed."""
        try:
            raw = json.loads(text)
            isolators = frozenset(str(i) for i in raw["isolators"])
            unknown = isolators - set(ISOLATORS)
            if unknown:
                raise ValueError(f"unknown isolators {sorted(unknown)}")
            return cls(
                isolators=isolators | {"posix"},
                cgroups_root=str(raw["cgroups_root"]),
                cfs_quota=bool(raw["cfs_quota"]),
                pids_max=int(raw.get("pids_max", 4096)),
                image_store=_opt_str(raw.get("image_store")),
                fetch_cache=_opt_str(raw.get("fetch_cache")),
                fetch_cache_max=int(raw.get("fetch_cache_max", 2 * 1024**3)),
                gpus=tuple((int(i), int(m)) for i, m in raw.get("gpus") or ()),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"bad container config: {exc}") from None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ContainerConfig:
        """The config the agent gave this executor (posix only when none was given)."""
        env = os.environ if environ is None else environ
        text = env.get(CONTAINER_CONFIG_ENV)
        return cls() if not text else cls.from_json(text)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)
