"""The agent daemon's options, and how their values become an AgentConfig plus daemon settings."""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agora.agent.containers.gpus import Gpu, discover_gpus
from agora.agent.containers.isolation import ISOLATORS, parse_isolation
from agora.agent.core import AgentConfig
from agora.agent.core.run_as import TaskUsers
from agora.agent.server.resources import host_resources, parse_attributes
from agora.sdk.daemon.http_auth import HttpCredentials, load_http_credentials
from agora.sdk.daemon.settings import (
    Option,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_endpoint,
    parse_port,
    parse_positive_duration,
)
from agora.sdk.discovery import parse_masters
from agora.sdk.logs import LOG_FORMATS, LOG_LEVELS
from agora.sdk.resources import Resources

__all__ = [
    "DESCRIPTION",
    "OPTIONS",
    "PROG",
    "ConfigError",
    "DaemonSettings",
    "build",
    "option_env_names",
]

PROG = "agora-agent"
DESCRIPTION = (
    "The Agora agent: offers this host's resources to a master and runs the executors and tasks "
    "it is given."
)


class ConfigError(ValueError):
    """Option values that do not fit together (a bad --resources, half a CURVE key pair...)."""


def _masters(text: str) -> str:
    """One master endpoint or a comma list of them, normalised (``tcp://`` added)."""
    return ",".join(parse_masters(text))


def _text(text: str) -> str:
    return text.strip()


def _optional_port(text: str) -> int | None:
    """``none``/``off`` for no HTTP server, else a TCP port (0: a free one)."""
    return None if text.strip().lower() in ("none", "off") else parse_port(text)


def _size_mib(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("expected a size in MiB >= 0")
    return value


def _long_duration(text: str) -> float:
    """A duration that may also be given in days or weeks: ``7d``, ``1w``, ``168h``."""
    t = text.strip().lower()
    for suffix, factor in (("d", 86400.0), ("w", 604800.0)):
        if t.endswith(suffix):
            return parse_duration(t[: -len(suffix)] + "s") * factor
    return parse_duration(t)


def _fraction(text: str) -> float:
    value = float(text.strip())
    if not 0.0 <= value < 1.0:
        raise ValueError("expected a fraction >= 0 and < 1")
    return value


def _optional_text(text: str) -> str | None:
    return text.strip() or None


def _executor_bind(text: str) -> str:
    """An endpoint, or nothing: the default (see agora.agent.server.executor_socket)."""
    return parse_endpoint(text) if text.strip() else ""


def _path(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("expected a path")
    return os.path.expanduser(value)


OPTIONS: tuple[Option, ...] = (
    Option(
        "master",
        _masters,
        "tcp://127.0.0.1:5050",
        "the master, or every master of an HA group: tcp://h1:5050,tcp://h2:5050,...",
    ),
    Option("work_dir", _path, "/tmp/agora/agent", "directory of the executor and task sandboxes"),
    Option(
        "history",
        _text,
        "",
        "append a JSONL history of launches, updates and epochs here (for the fault suite)",
    ),
    Option(
        "resources",
        _text,
        None,
        "resources to offer, e.g. 'cpus:4;mem:4096;ports:[31000-32000]'; every name given "
        "replaces the detected value (cpus, mem, disk, ports are detected)",
    ),
    Option("attributes", _text, "", "attributes of this agent, e.g. 'rack:a;zone:w'"),
    Option("hostname", _text, None, "host name to report (None: this host's name)"),
    Option(
        "executor_bind",
        _executor_bind,
        "",
        "endpoint executors connect to (default: the Unix socket <work dir>/run/executors.sock, "
        "tcp://127.0.0.1:0 if that path is too long; tcp://127.0.0.1:0 picks a free port)",
    ),
    Option(
        "master_timeout",
        parse_positive_duration,
        75.0,
        "re-register when the master has not pinged this long",
    ),
    Option(
        "registration_backoff",
        parse_positive_duration,
        1.0,
        "first retry delay of (re-)registration; doubles up to --registration-backoff-max",
    ),
    Option(
        "registration_backoff_max",
        parse_positive_duration,
        10.0,
        "longest retry delay of (re-)registration",
    ),
    Option(
        "status_update_retry",
        parse_positive_duration,
        1.0,
        "first resend delay of an unacknowledged status update; doubles up to the max",
    ),
    Option(
        "status_update_retry_max",
        parse_positive_duration,
        60.0,
        "longest resend delay of an unacknowledged status update",
    ),
    Option(
        "executor_registration_timeout",
        parse_positive_duration,
        60.0,
        "an executor that has not registered this long after its launch is killed",
    ),
    Option(
        "executor_shutdown_grace_period",
        parse_duration,
        5.0,
        "time an executor gets to exit after SIGTERM before SIGKILL",
    ),
    Option(
        "command_executor_idle_timeout",
        parse_duration,
        10.0,
        "the built-in command executor of a framework is shut down after this long without tasks",
    ),
    Option(
        "recovery_timeout",
        parse_duration,
        900.0,
        "how long executors wait for a lost agent before killing their tasks "
        "(AGORA_RECOVERY_TIMEOUT of executors)",
    ),
    Option(
        "switch_user",
        parse_bool,
        True,
        "run executors and tasks as the task's user (needs root; a user other than the agent's "
        "fails the launch without root); --no-switch-user runs every task as the agent's user",
        flag=True,
    ),
    Option(
        "allow_root_tasks",
        parse_bool,
        False,
        "run tasks whose user is root (by name or uid 0; with --no-switch-user under a root "
        "agent, every task); refused with TASK_ERROR, reason TASK_UNAUTHORIZED, without",
        flag=True,
    ),
    Option(
        "default_task_user",
        _optional_text,
        None,
        "the user of a task whose command, executor and framework name none (None: the agent's "
        "own, refused when that is root unless --allow-root-tasks)",
    ),
    Option(
        "isolation",
        _text,
        "auto",
        "isolators to use, comma-separated, or 'auto' for every one this host supports; known: "
        + ", ".join(ISOLATORS),
    ),
    Option(
        "cgroups_root",
        _text,
        "agora",
        "cgroup (under the agent's own) that holds the containers' cgroups",
    ),
    Option(
        "cgroups_enable_cfs",
        parse_bool,
        False,
        "cap each container's cpu time with a CFS quota from its cpus (not just shares)",
        flag=True,
    ),
    Option("image_store", _path, None, "image store directory (None: <work-dir>/images)"),
    Option(
        "fetcher_cache_dir", _path, None, "fetch cache directory (None: <work-dir>/fetch-cache)"
    ),
    Option("fetcher_cache_size", _size_mib, 2048, "fetch cache size cap in MiB"),
    Option(
        "recover",
        parse_choice(("reconnect", "cleanup")),
        "reconnect",
        "after a restart: reconnect to the executors still running, or cleanup (kill them)",
    ),
    Option(
        "container_disk_watermark_interval",
        parse_positive_duration,
        15.0,
        "how often the disk/du isolator measures each running container's sandbox",
    ),
    Option(
        "enforce_container_disk_quota",
        parse_bool,
        True,
        "kill a container whose sandbox outgrows its disk resource (it ends TASK_FAILED, reason "
        "CONTAINER_LIMITATION_DISK); --no-enforce-container-disk-quota only measures",
        flag=True,
    ),
    Option(
        "gc_delay",
        _long_duration,
        604800.0,
        "delete the sandbox of a finished executor or task this long after it finished, less "
        "as the disk fills (e.g. 1w, 2d, 12h, 30m)",
    ),
    Option(
        "disk_watermark_interval",
        parse_positive_duration,
        60.0,
        "how often sandbox garbage collection checks the disk and deletes what is due",
    ),
    Option(
        "gc_disk_headroom",
        _fraction,
        0.1,
        "disk fraction kept free: sandboxes are collected after gc_delay * max(0, 1 - headroom "
        "- disk usage)",
    ),
    Option(
        "nvidia_smi",
        _optional_text,
        None,
        "nvidia-smi to discover GPUs with (None: from PATH; 'none': no GPUs)",
    ),
    Option(
        "http_port",
        _optional_port,
        0,
        "serve the agent HTTP API (/health, /state, /files/read of task sandboxes) on this port "
        "(0: any free port; none/off: no HTTP API)",
    ),
    Option("http_bind", _text, "127.0.0.1", "host/address the agent HTTP API listens on"),
    Option(
        "http_credentials",
        _path,
        None,
        'bearer tokens of the HTTP API (TOML: principal = "token" lines, optional operators = '
        "[...]); without it (or --insecure-http) only /health is served",
    ),
    Option(
        "insecure_http",
        parse_bool,
        None,  # None: as --insecure says (without --http-credentials)
        "serve the HTTP API without tokens (anyone who can reach it reads every task's output); "
        "default: on with --insecure and no --http-credentials, else off",
        flag=True,
    ),
    Option(
        "advertise_host",
        _optional_text,
        None,
        "host/address clients reach the agent HTTP API at, reported to the master (None: the "
        "--http-bind address, or 127.0.0.1 when that is a wildcard)",
    ),
    Option("log_format", parse_choice(LOG_FORMATS), "console", "log format: console or json"),
    Option("log_level", parse_choice(LOG_LEVELS), "info", "log level: debug, info, warning, error"),
    Option(
        "curve_secret_key",
        _path,
        None,
        "this agent's CURVE secret key file (with --curve-server-key: encrypt the master link)",
    ),
    Option("curve_server_key", _path, None, "the master's CURVE public key file"),
    Option(
        "insecure",
        parse_bool,
        False,
        "run without CURVE on purpose (needed without --curve-secret-key/--curve-server-key): "
        "the master link is neither encrypted nor authenticated, and the HTTP API is served "
        "without tokens unless --http-credentials; logged at start (with CURVE keys given, "
        "it changes nothing)",
        flag=True,
    ),
)


def option_env_names() -> frozenset[str]:
    """The environment variables that configure the agent (not passed on to executors)."""
    return frozenset({opt.env for opt in OPTIONS} | {"AGORA_CONFIG"})


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """What the daemon needs besides the core's AgentConfig."""

    master: str
    work_dir: str
    executor_bind: str
    recovery_timeout: float
    switch_user: bool
    log_format: str
    log_level: str
    curve_secret_key: str | None = None
    curve_server_key: str | None = None
    #: None: no HTTP API; 0: any free port.
    http_port: int | None = 0
    http_bind: str = "127.0.0.1"
    #: Who may call the HTTP API (default: nobody but for /health).
    http_credentials: HttpCredentials | None = None
    insecure_http: bool = False
    #: Started --insecure and given no CURVE keys: no CURVE, on purpose.
    insecure: bool = False
    #: The host reported for the HTTP API (the daemon fills in the port once bound).
    advertise_host: str = "127.0.0.1"
    #: Isolators asked for (None: every one the host supports).
    isolation: frozenset[str] | None = None
    cgroups_root: str = "agora"
    cgroups_enable_cfs: bool = False
    image_store: str = ""
    fetcher_cache_dir: str = ""
    fetcher_cache_bytes: int = 2048 * 1024 * 1024
    recover: str = "reconnect"
    #: The GPUs found with nvidia-smi (advertised as ``gpus`` unless --resources names gpus).
    gpus: tuple[Gpu, ...] = ()
    #: Append a JSONL history for the fault suite here ("": none).
    history: str = ""
    #: The disk/du isolator: measuring interval, and whether it kills what is over its disk.
    container_disk_watermark_interval: float = 15.0
    enforce_container_disk_quota: bool = True
    #: Sandbox garbage collection (see agora.agent.core.sandbox_gc).
    gc_delay: float = 604800.0
    disk_watermark_interval: float = 60.0
    gc_disk_headroom: float = 0.1


def build(values: Mapping[str, Any]) -> tuple[AgentConfig, DaemonSettings]:
    """The core's config and the daemon's settings from ``load``'s values; raises ConfigError."""
    work_dir = os.path.abspath(values["work_dir"])
    try:
        resources = host_resources(work_dir, values["resources"])
    except ValueError as exc:
        raise ConfigError(f"--resources: {exc}") from None
    smi = values["nvidia_smi"]
    gpus = () if smi is not None and smi.lower() == "none" else tuple(discover_gpus(smi))
    if gpus and "gpus" not in resources.names():
        resources = resources + Resources.parse(f"gpus:{len(gpus)}")
    try:
        attributes = parse_attributes(values["attributes"])
    except ValueError as exc:
        raise ConfigError(f"--attributes: {exc}") from None
    hostname = values["hostname"] or socket.gethostname()
    if len(hostname) > 255:
        raise ConfigError("--hostname: at most 255 characters")
    secret, server = values["curve_secret_key"], values["curve_server_key"]
    if (secret is None) != (server is None):
        raise ConfigError("--curve-secret-key and --curve-server-key go together")
    for name, path in (("--curve-secret-key", secret), ("--curve-server-key", server)):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{name}: no such file {path}")
    insecure = bool(values["insecure"]) and secret is None  # with CURVE it changes nothing
    if values["registration_backoff_max"] < values["registration_backoff"]:
        raise ConfigError("--registration-backoff-max must be >= --registration-backoff")
    if values["status_update_retry_max"] < values["status_update_retry"]:
        raise ConfigError("--status-update-retry-max must be >= --status-update-retry")
    http_bind = values["http_bind"] or "127.0.0.1"
    advertise = values["advertise_host"] or (
        "127.0.0.1" if http_bind in ("0.0.0.0", "*", "::", "[::]") else http_bind
    )
    if len(advertise) > 255:
        raise ConfigError("--advertise-host: at most 255 characters")
    credentials = None
    insecure_http = values["insecure_http"]
    if insecure_http is None:  # --insecure opens the HTTP API too, unless it has credentials
        insecure_http = insecure and values["http_credentials"] is None
    if values["http_credentials"] is not None:
        if insecure_http:
            raise ConfigError("--http-credentials and --insecure-http contradict each other")
        try:
            credentials = load_http_credentials(Path(values["http_credentials"]))
        except ValueError as exc:
            raise ConfigError(f"--http-credentials: {exc}") from None
    try:
        isolation = parse_isolation(values["isolation"])
    except ValueError as exc:
        raise ConfigError(f"--isolation: {exc}") from None
    cgroups_root = values["cgroups_root"].strip("/")
    if not cgroups_root or ".." in cgroups_root.split("/"):
        raise ConfigError("--cgroups-root: a relative cgroup path without '..'")
    if secret is None and not insecure:
        raise ConfigError(
            "CURVE is off: give --curve-secret-key and --curve-server-key (this agent's key and "
            "the master's public key, from `agora keys generate`), or --insecure to run without "
            "authentication on purpose (anyone who reaches the master could then pose as this "
            "agent)"
        )
    config = AgentConfig(
        hostname=hostname,
        resources=resources,
        attributes=attributes,
        registration_backoff=values["registration_backoff"],
        registration_backoff_max=values["registration_backoff_max"],
        master_timeout=values["master_timeout"],
        status_update_retry=values["status_update_retry"],
        status_update_retry_max=values["status_update_retry_max"],
        executor_registration_timeout=values["executor_registration_timeout"],
        executor_shutdown_grace_period=values["executor_shutdown_grace_period"],
        command_executor_idle_timeout=values["command_executor_idle_timeout"],
        task_users=task_users(
            switch_user=bool(values["switch_user"]),
            allow_root_tasks=bool(values["allow_root_tasks"]),
            default_task_user=values["default_task_user"] or "",
        ),
    )
    settings = DaemonSettings(
        master=values["master"],
        work_dir=work_dir,
        executor_bind=values["executor_bind"],
        recovery_timeout=values["recovery_timeout"],
        switch_user=bool(values["switch_user"]),
        log_format=values["log_format"],
        log_level=values["log_level"],
        curve_secret_key=secret,
        curve_server_key=server,
        http_port=values["http_port"],
        http_bind=http_bind,
        http_credentials=credentials,
        insecure_http=bool(insecure_http),
        insecure=insecure,
        advertise_host=advertise,
        isolation=isolation,
        cgroups_root=cgroups_root,
        cgroups_enable_cfs=bool(values["cgroups_enable_cfs"]),
        image_store=values["image_store"] or os.path.join(work_dir, "images"),
        fetcher_cache_dir=values["fetcher_cache_dir"] or os.path.join(work_dir, "fetch-cache"),
        fetcher_cache_bytes=values["fetcher_cache_size"] * 1024 * 1024,
        recover=values["recover"],
        gpus=gpus,
        history=values["history"],
        container_disk_watermark_interval=values["container_disk_watermark_interval"],
        enforce_container_disk_quota=bool(values["enforce_container_disk_quota"]),
        gc_delay=values["gc_delay"],
        disk_watermark_interval=values["disk_watermark_interval"],
        gc_disk_headroom=values["gc_disk_headroom"],
    )
    return config, settings


def task_users(*, switch_user: bool, allow_root_tasks: bool, default_task_user: str) -> TaskUsers:
    """The core's task-user rules, with this process's own user and the host's uid-0 names."""
    uid = os.geteuid()
    try:
        me = pwd.getpwuid(uid).pw_name
    except KeyError:
        me = "root" if uid == 0 else str(uid)
    roots = {entry.pw_name for entry in pwd.getpwall() if entry.pw_uid == 0} | {"root"}
    if uid == 0:
        roots.add(me)
    return TaskUsers(
        switch_user=switch_user,
        allow_root_tasks=allow_root_tasks,
        default_task_user=default_task_user,
        agent_user=me,
        root_users=frozenset(roots),
    )
