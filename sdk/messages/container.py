"""Records that describe how a task runs on its agent: its container, fetched URIs, health checks,
and the usage the agent measures.

Defaults follow Apache Mesos: a health check waits 15 s, runs every 10 s with a 20 s timeout, and
kills the task after 3 consecutive failures once its 10 s grace period is over.
"""

from __future__ import annotations

import enum
from typing import Annotated

from agora.sdk.ids import ExecutorID, FrameworkID, TaskID
from agora.sdk.messages._record import MaxItems, MaxLen, Range, Record, Seconds, Timestamp

__all__ = [
    "URI",
    "ContainerInfo",
    "ContainerUsage",
    "HealthCheck",
    "HealthCheckKind",
    "Volume",
]

_Path = Annotated[str, MaxLen(4096)]
_Port = Annotated[int, Range(1, 65_535)]
_Bytes = Annotated[int, Range(0, 2**63 - 1)]


class URI(Record, frozen=True, kw_only=True):
    """A file the agent fetches into the sandbox before the task starts (``file://``, ``http://``,
    ``https://`` or an absolute path). ``extract``: unpack tar/zip archives; ``executable``: mark
    the file executable; ``cache``: keep it in the agent's fetch cache; ``output_file``: the name to
    give it in the sandbox (default: the URI's last path component)."""

    value: _Path
    extract: bool = True
    executable: bool = False
    cache: bool = False
    output_file: Annotated[str, MaxLen(255)] | None = None


class HealthCheckKind(enum.Enum):
    COMMAND = "COMMAND"
    HTTP = "HTTP"
    TCP = "TCP"


class HealthCheck(Record, frozen=True, kw_only=True):
    """How the executor checks that a task is healthy.

    COMMAND runs ``command`` with ``/bin/sh -c`` in the task's sandbox (healthy: exit 0); HTTP
    GETs ``http://127.0.0.1:port/path`` (healthy: status 200-399); TCP connects to
    ``127.0.0.1:port``. Failures before ``grace_period`` has passed since the task started do not
    count, unless a check already succeeded. ``consecutive_failures`` failures in a row kill the
    task (reason TASK_HEALTH_CHECK_STATUS_UPDATED)."""

    kind: HealthCheckKind
    command: Annotated[str, MaxLen(16 * 1024)] | None = None
    port: _Port | None = None
    path: Annotated[str, MaxLen(2048)] = "/"
    delay: Seconds = 15.0
    interval: Annotated[float, Range(0, 86_400, lo_open=True)] = 10.0
    timeout: Annotated[float, Range(0, 86_400, lo_open=True)] = 20.0
    consecutive_failures: Annotated[int, Range(1, 1_000)] = 3
    grace_period: Seconds = 10.0


class Volume(Record, frozen=True, kw_only=True):
    """A host directory or file bind-mounted into the task's root filesystem."""

    host_path: _Path
    container_path: _Path
    read_only: bool = False


class ContainerInfo(Record, frozen=True, kw_only=True):
    """How to contain a task beyond the agent's default isolation.

    ``image``: the name of an image in the agent's image store (``agora image import``); the task
    runs with that root filesystem, its sandbox at /mnt/sandbox. ``volumes`` are mounted into it.
    ``network_isolation``: a private network namespace with only a loopback interface (needs the
    agent's ``namespaces/net`` isolator). ``hostname``: the task's host name in its own UTS
    namespace (default: the task id, shortened)."""

    image: Annotated[str, MaxLen(255)] | None = None
    volumes: Annotated[tuple[Volume, ...], MaxItems(64)] = ()
    network_isolation: bool = False
    hostname: Annotated[str, MaxLen(64)] | None = None


class ContainerUsage(Record, frozen=True, kw_only=True):
    """One container's resource use, sampled by its agent. ``task_id`` is None for a custom
    executor's container (which holds all its tasks). Limits of 0 mean none. ``disk_*``: its
    sandbox's size and ``disk`` limit, as the agent's disk/du isolator last measured them."""

    framework_id: FrameworkID
    executor_id: ExecutorID
    task_id: TaskID | None = None
    cpu_seconds: Annotated[float, Range(0, 1e15)] = 0.0
    rss_bytes: _Bytes = 0
    mem_limit_bytes: _Bytes = 0
    cpu_limit: Annotated[float, Range(0, 1e6)] = 0.0
    timestamp: Timestamp = 0.0
    disk_used_bytes: _Bytes = 0
    disk_limit_bytes: _Bytes = 0
