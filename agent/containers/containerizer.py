"""The containerizer: one container per task (or per custom executor), composed of the isolators in
a :class:`ContainerConfig`.

``Containerizer.launch`` creates the container's cgroup with limits from its resources, then starts
the process through the container launcher (namespaces, root filesystem, user). The caller watches
the returned pid; when it has exited, ``Container.limitation()`` says whether a limit ended it (the
memory cgroup's OOM killer: CONTAINER_LIMITATION_MEMORY) and ``Container.destroy()`` kills whatever
is left in the cgroup and removes it. With ``posix`` alone there is nothing to build: callers spawn
processes their usual way and never call ``launch``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, NotRequired, Protocol, TypedDict, Unpack

import structlog
from agora.agent.containers._mounts import AGENT_DIR_IN_ROOTFS
from agora.agent.containers.cgroups import Cgroup, CgroupError, Cgroups, Limits, Usage
from agora.agent.containers.forkserver import ForkServer
from agora.agent.containers.isolation import ContainerConfig
from agora.agent.containers.launch import Bind, ContainerSpec, LaunchError, spawn
from agora.sdk.daemon.images import ImageStore
from agora.sdk.messages import ContainerInfo, Reason
from agora.sdk.resources import Resources
from agora.sdk.runtime import runtime_paths

__all__ = [
    "AGENT_DIR_IN_ROOTFS",
    "SANDBOX_IN_IMAGE",
    "Container",
    "Containerizer",
    "LaunchError",
    "LaunchRequest",
    "User",
    "container_name",
    "endpoint_in_image",
    "host_name_for",
    "limits_of",
]

log = structlog.get_logger(__name__)

_MIB: Final = 1024 * 1024
#: The smallest memory limit a container gets (Mesos: 32 MiB): below it, starting the
#: container's processes alone would run into the limit.
MIN_MEMORY_MIB: Final = 32.0
_HOSTNAME_MAX: Final = 63
_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_.-]")
#: Where a task's sandbox appears inside an image's root filesystem.
SANDBOX_IN_IMAGE: Final = "/mnt/sandbox"


def endpoint_in_image(endpoint: str) -> str:
    """The agent's executor endpoint as an executor in an image's root filesystem reaches it:
    an ``ipc://`` socket through the directory bound at AGENT_DIR_IN_ROOTFS."""
    scheme, sep, path = endpoint.partition("://")
    if not sep or scheme != "ipc":
        return endpoint
    return f"ipc://{AGENT_DIR_IN_ROOTFS}/{os.path.basename(path)}"


class User(Protocol):
    """Whom a container's processes run as: the executor's RunAs and the agent's Account both
    are one."""

    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def groups(self) -> tuple[int, ...]: ...


def container_name(*parts: str) -> str:
    """A cgroup-safe, unique, readable name for the container of ``parts`` (framework, executor,
    task ids): the last part, sanitized and shortened, plus a hash of them all."""
    digest = hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]
    tail = _NAME_CHARS.sub("_", parts[-1])[:40] if parts else ""
    return f"c-{tail}-{digest}"


def host_name_for(name: str) -> str:
    """A valid host name made from an id: letters, digits and '-' only, at most 63."""
    host = "".join(c if c.isascii() and (c.isalnum() or c == "-") else "-" for c in name)
    return host.strip("-")[:_HOSTNAME_MAX].strip("-") or "task"


#: The character device major of NVIDIA GPUs (/dev/nvidia<minor>).
NVIDIA_MAJOR: Final = 195


def gpu_deny_rules(config: ContainerConfig, visible: str | None) -> tuple[str, ...]:
    """Devices-cgroup rules that fence a container off the agent's GPUs it was not given
    (``visible``: its CUDA_VISIBLE_DEVICES, indices; None: no GPU isolation)."""
    if "gpu/nvidia" not in config.isolators or not config.gpus or visible is None:
        return ()
    mine = {int(i) for i in visible.split(",") if i.strip().isdigit()}
    return tuple(
        f"c {NVIDIA_MAJOR}:{minor} rwm" for index, minor in config.gpus if index not in mine
    )


def limits_of(
    resources: Resources, config: ContainerConfig, visible_gpus: str | None = None
) -> Limits:
    controllers = config.cgroup_controllers
    cpus = resources.scalar("cpus")
    mem = resources.scalar("mem")
    return Limits(
        cpus=cpus if "cpu" in controllers and cpus > 0 else None,
        cfs_quota=config.cfs_quota and "cpu" in controllers and cpus > 0,
        mem_bytes=int(max(mem, MIN_MEMORY_MIB) * _MIB)
        if "memory" in controllers and mem > 0
        else None,
        pids_max=config.pids_max if "pids" in controllers else None,
        deny_devices=gpu_deny_rules(config, visible_gpus),
    )


@dataclass(eq=False, slots=True)
class Container:
    """A started container: its watched pid and its cgroup (None without cgroup isolators)."""

    name: str
    pid: int
    cgroup: Cgroup | None
    #: Inside the container, the task's sandbox is here (differs from the host path with a rootfs).
    sandbox_path: str

    def limitation(self) -> tuple[Reason, str] | None:
        """Why the container's limits ended it, if they did (check after the pid has exited)."""
        if self.cgroup is None:
            return None
        try:
            if self.cgroup.oom_killed():
                return (
                    Reason.CONTAINER_LIMITATION_MEMORY,
                    "Memory limit exceeded: the container was OOM-killed",
                )
        except (OSError, CgroupError) as exc:
            log.warning("container_oom_check_failed", container=self.name, error=str(exc))
        return None

    def usage(self) -> Usage | None:
        if self.cgroup is None:
            return None
        try:
            return self.cgroup.usage()
        except (OSError, CgroupError):
            return None

    def update(self, limits: Limits) -> None:
        if self.cgroup is not None:
            self.cgroup.update(limits)

    def destroy(self) -> None:
        """Kill what is left in the container and remove its cgroup. Never raises."""
        if self.cgroup is None:
            return
        try:
            self.cgroup.destroy()
        except (OSError, CgroupError) as exc:
            log.error("container_destroy_failed", container=self.name, error=str(exc))


class LaunchRequest(TypedDict):
    """What :meth:`Containerizer.launch` starts, and in what container."""

    argv: Sequence[str]
    env: Mapping[str, str]
    #: The sandbox on the host (the process's working directory).
    sandbox: str
    stdin: int
    stdout: int
    stderr: int
    #: The container's limits are made from these.
    resources: Resources
    info: NotRequired[ContainerInfo | None]
    user: NotRequired[User | None]
    hostname: NotRequired[str | None]
    #: Share this network namespace (``/proc/<pid>/ns/net`` of a task group's first isolated
    #: member) rather than make one.
    join_network: NotRequired[str | None]


@dataclass(eq=False, slots=True)
class _Prepared:
    """A container built but not started: its cgroup exists, its launch spec is ready. As a
    context manager around the spawn, it destroys the cgroup if the spawn fails (or is
    cancelled)."""

    name: str
    spec: ContainerSpec
    cgroup: Cgroup | None
    sandbox: str
    #: The sandbox as the container sees it.
    sandbox_path: str

    def container(self, pid: int) -> Container:
        return Container(self.name, pid, self.cgroup, self.sandbox_path)

    def __enter__(self) -> _Prepared:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is not None and self.cgroup is not None:
            Container(self.name, 0, self.cgroup, self.sandbox).destroy()


def persistent_volume_binds(sandbox: str) -> tuple[Bind, ...]:
    """The agent links a task's persistent volumes at ``volumes/<id>`` in its sandbox, to
    directories under its work dir. Inside an image's root filesystem those directories do not
    exist: each is bound at its own path there, so the links still lead to it."""
    where = os.path.join(sandbox, "volumes")
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return ()
    binds = []
    for name in names:
        link = os.path.join(where, name)
        if os.path.islink(link):
            target = os.path.realpath(link)
            if os.path.isdir(target):
                binds.append(Bind(target, target, False))
    return tuple(binds)


class Containerizer:
    """Builds containers per the config; ``cgroups`` is the detected hierarchy (None: no cgroup
    isolators usable), ``images`` the image store (None: no images)."""

    def __init__(
        self,
        config: ContainerConfig,
        cgroups: Cgroups | None = None,
        images: ImageStore | None = None,
        forkserver: ForkServer | None = None,
        agent_dir: str | None = None,
    ) -> None:
        """``agent_dir``: the directory of the agent's executor socket, made reachable in the
        containers (the agent's, for custom executors; the default executor's tasks get none)."""
        self.config = config
        self._agent_dir = agent_dir
        self._cgroups = cgroups if config.cgroup_controllers else None
        self._images = images
        self._forkserver = forkserver
        self._runtime = runtime_paths()

    @classmethod
    def from_config(
        cls, config: ContainerConfig, forkserver: ForkServer | None = None
    ) -> Containerizer:
        """Detect the cgroup hierarchy and open the image store the config names. With a
        ``forkserver``, pid-namespace containers are forked by it (see forkserver.py)."""
        cgroups = None
        if config.cgroup_controllers:
            cgroups = Cgroups.detect(config.cgroups_root, devices=bool(config.gpus))
        if config.cgroup_controllers and cgroups is None:
            log.warning("cgroups_unavailable", isolators=sorted(config.isolators))
        images = ImageStore(config.image_store) if config.image_store else None
        return cls(config, cgroups, images, forkserver)

    @property
    def cgroups(self) -> Cgroups | None:
        return self._cgroups

    def isolates(self, info: ContainerInfo | None) -> bool:
        """Whether a task with ``info`` needs the launcher (else: a plain posix spawn)."""
        return self.config.isolated or info is not None

    def problem(self, info: ContainerInfo | None) -> str | None:
        """Why this agent cannot give a task the container it asks for (None: it can)."""
        if info is None:
            return None
        isolators = self.config.isolators
        if info.network_isolation and "namespaces/net" not in isolators:
            return "network isolation needs the agent's namespaces/net isolator"
        if info.hostname is not None and "namespaces/uts" not in isolators:
            return "a host name needs the agent's namespaces/uts isolator"
        if info.image is not None:
            if "filesystem/rootfs" not in isolators:
                return "an image needs the agent's filesystem/rootfs isolator"
            if self._images is None or self._images.get(info.image) is None:
                return f"no image {info.image!r} in the agent's image store"
        for volume in info.volumes:
            if info.image is None and volume.container_path.startswith("/"):
                return f"volume {volume.container_path!r}: an absolute path needs an image"
            if ".." in volume.container_path.split("/"):
                return f"volume {volume.container_path!r}: '..' is not allowed"
        return None

    def sandbox_path(self, info: ContainerInfo | None, sandbox: str) -> str:
        """The task's sandbox as the task sees it."""
        return SANDBOX_IN_IMAGE if info is not None and info.image is not None else sandbox

    def launch(self, name: str, **request: Unpack[LaunchRequest]) -> Container:
        """Create the container and start ``request['argv']`` in it; raises LaunchError (nothing
        is left behind then)."""
        prepared = self._build(name, request)
        forkserver = self._forkserver
        with prepared:
            spec = prepared.spec
            pid = forkserver.spawn(spec) if forkserver is not None else spawn(spec)
        return prepared.container(pid)

    @property
    def launches_async(self) -> bool:
        """Whether :meth:`launch_async` sets containers up while the event loop goes on."""
        return self._forkserver is not None

    async def launch_async(self, name: str, **request: Unpack[LaunchRequest]) -> Container:
        """:meth:`launch` through the fork server without blocking the event loop (several
        containers are set up at once); needs a fork server. Cancelled, it leaves nothing."""
        assert self._forkserver is not None, "launch_async needs a fork server"
        prepared = self._build(name, request)
        with prepared:
            pid = await self._forkserver.spawn_async(prepared.spec)
        return prepared.container(pid)

    def _build(self, name: str, request: LaunchRequest) -> _Prepared:
        """The container's cgroup (created) and its launch spec; LaunchError (nothing left)."""
        info = request.get("info")
        env = request["env"]
        problem = self.problem(info)
        if problem is not None:
            raise LaunchError(problem)
        cgroup: Cgroup | None = None
        if self._cgroups is not None:
            try:
                limits = limits_of(
                    request["resources"], self.config, env.get("CUDA_VISIBLE_DEVICES")
                )
                cgroup = self._cgroups.create(name, limits)
            except (OSError, CgroupError) as exc:
                raise LaunchError(f"cannot create the container's cgroup: {exc}") from None
        namespaces = set(self.config.namespaces)
        rootfs = None
        volumes: tuple[Bind, ...] = ()
        keep_writable: tuple[str, ...] = ()
        hostname = request.get("hostname")
        join_network = request.get("join_network")
        if info is not None:
            if info.network_isolation:
                namespaces.add("net")
            if info.image is not None:
                assert self._images is not None
                record = self._images.get(info.image)
                if record is None:
                    raise LaunchError(f"no image {info.image!r} in the agent's image store")
                rootfs = record.rootfs
                namespaces.add("mount")
            volumes = tuple(Bind(v.host_path, v.container_path, v.read_only) for v in info.volumes)
            if rootfs is not None:
                volumes += persistent_volume_binds(request["sandbox"])
            if volumes:
                namespaces.add("mount")
        if rootfs is None and "mount" in namespaces:  # a private /tmp: keep the volumes there
            keep_writable = tuple(b.host_path for b in persistent_volume_binds(request["sandbox"]))
        if info is not None and info.hostname:
            hostname = info.hostname
        if join_network is not None:
            namespaces.discard("net")
        user = request.get("user")
        sandbox = request["sandbox"]
        spec = ContainerSpec(
            argv=tuple(request["argv"]),
            env=env,
            sandbox=sandbox,
            stdin=request["stdin"],
            stdout=request["stdout"],
            stderr=request["stderr"],
            uid=user.uid if user else None,
            gid=user.gid if user else None,
            groups=user.groups if user else (),
            cgroup_procs=cgroup.procs_files() if cgroup is not None else (),
            namespaces=frozenset(namespaces),
            hostname=hostname if "uts" in namespaces else None,
            rootfs=rootfs,
            volumes=volumes,
            network_of=join_network,
            keep_visible=self._runtime,
            keep_writable=keep_writable,
            agent_dir=self._agent_dir,
        )
        return _Prepared(name, spec, cgroup, sandbox, self.sandbox_path(info, sandbox))

    def recover(self, name: str, pid: int, sandbox: str) -> Container:
        """The container of a running process started by an earlier agent or executor."""
        cgroup = self._cgroups.open(name) if self._cgroups is not None else None
        return Container(name, pid, cgroup, sandbox)
