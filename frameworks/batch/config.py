"""``agora batch serve`` settings: flags, then ``AGORA_*`` environment, then a TOML file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agora.frameworks.batch.preempt import MODES
from agora.sdk.daemon.http_auth import HttpCredentials, load_http_credentials
from agora.sdk.daemon.settings import (
    Option,
    load,
    parse_choice,
    parse_port,
    parse_positive_duration,
)
from agora.sdk.discovery import agora_home, parse_masters
from agora.sdk.logs import LOG_FORMATS, LOG_LEVELS

__all__ = ["OPTIONS", "ServiceSettings", "load_settings"]

PROG = "agora batch serve"
DESCRIPTION = (
    "The Agora batch service: a framework scheduler that keeps a job queue in SQLite and runs "
    "its jobs on the cluster; `agora batch submit|status|cancel|wait|logs|history` talk to it."
)


def _text(text: str) -> str:
    return text.strip()


def _optional_path(text: str) -> str | None:
    return os.path.expanduser(text.strip()) or None


def _masters(text: str) -> str:
    return ",".join(parse_masters(text))


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("expected a comma list of names")
    return names


def _shares(text: str) -> dict[str, float]:
    shares: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        user, sep, value = item.partition("=")
        share = float(value) if sep else -1.0
        if not user.strip() or share <= 0:
            raise ValueError(f"expected USER=SHARE with a share above 0, got {item!r}")
        shares[user.strip()] = share
    return shares


def _preempt(text: str) -> dict[str, str]:
    """``QUEUE=MODE,…`` (modes: requeue, cancel, off) -> {role: mode}."""
    modes: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        queue, sep, mode = (part.strip() for part in item.partition("="))
        if not queue or not sep or mode not in MODES:
            raise ValueError(f"expected QUEUE=requeue|cancel|off, got {item!r}")
        modes["*" if queue == "default" else queue] = mode
    return modes


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("expected 0 or more")
    return value


OPTIONS: Sequence[Option] = (
    Option("master", _masters, None, "the master(s), host:port[,host:port…] (default: as the CLI)"),
    Option("work_dir", _optional_path, None, "the job store's dir ($AGORA_HOME/batch-service)"),
    Option("name", _text, "batch", "the framework's name"),
    Option("queues", _names, ("default",), "queues served (each is the role of that name; "
           "'default' is the role '*')"),
    Option("failover_timeout", parse_positive_duration, 7 * 86400.0,
           "how long the master keeps our tasks running while this service is down"),
    Option("http_bind", _text, "127.0.0.1", "the HTTP API's address"),
    Option("http_port", parse_port, 0, "the HTTP API's port (0: a free one)"),
    Option("http_credentials", _optional_path, None,
           'bearer tokens of the TCP HTTP API (TOML: principal = "token" lines); every holder '
           "is an operator (submits as any user); without it (or --insecure-http) TCP serves "
           "only /health"),
    Option("insecure_http", _text, False,
           "serve the TCP HTTP API without tokens: whoever reaches it is an operator (submits "
           "jobs as any user, root included)", flag=True),
    Option("unix_socket", _optional_path, None,
           "the Unix socket every local user submits through, each as themself "
           "($AGORA_HOME/batch.sock; none: no socket)"),
    Option("endpoint_file", _optional_path, None,
           "also write the API's URL here (it always goes to $AGORA_HOME/batch)"),
    Option("half_life", parse_positive_duration, 86400.0, "fair-share usage half-life"),
    Option("shares", _shares, {}, "users' fair shares, USER=N,… (others: 1)"),
    Option("retry_backoff", parse_positive_duration, 1.0, "first wait before a retry"),
    Option("retry_backoff_max", parse_positive_duration, 60.0, "longest wait before a retry"),
    Option("max_losses", _count, 5, "requeues of a task lost by the cluster before it fails"),
    Option("unreachable_timeout", parse_positive_duration, 300.0,
           "how long a task on an unreachable agent keeps its place before it is requeued"),
    Option("preempt", _preempt, {}, "priority preemption per queue, QUEUE=requeue|cancel|off,… "
           "(as Slurm's PreemptMode; unnamed queues: off)"),
    Option("preempt_after", parse_positive_duration, 10.0,
           "how long a higher-priority job waits with nothing running before it preempts"),
    Option("preempt_min_runtime", parse_positive_duration, 30.0,
           "a task that started less than this long ago is never preempted"),
    Option("curve_secret_key", _optional_path, None, "this service's CURVE secret key file"),
    Option("curve_server_key", _optional_path, None, "the master's CURVE public key file"),
    Option("log_format", parse_choice(LOG_FORMATS), "console", "log format"),
    Option("log_level", parse_choice(LOG_LEVELS), "info", "log level"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    master: str | None
    work_dir: Path
    name: str
    queues: tuple[str, ...]
    failover_timeout: float
    http_bind: str
    http_port: int
    endpoint_file: Path | None
    half_life: float
    shares: Mapping[str, float]
    retry_backoff: float
    retry_backoff_max: float
    max_losses: int
    unreachable_timeout: float
    preempt: Mapping[str, str]
    preempt_after: float
    preempt_min_runtime: float
    curve_secret_key: str | None
    curve_server_key: str | None
    http_credentials: HttpCredentials | None
    insecure_http: bool
    unix_socket: Path | None
    #: Whether ``unix_socket`` was given (a default path too long for a socket is skipped).
    unix_socket_explicit: bool
    log_format: str
    log_level: str

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple("*" if q == "default" else q for q in self.queues)


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ServiceSettings:
    values: dict[str, Any] = load(PROG, DESCRIPTION, OPTIONS, argv, env)
    work_dir = values["work_dir"]
    if (values["curve_secret_key"] is None) != (values["curve_server_key"] is None):
        raise SystemExit(f"{PROG}: --curve-secret-key and --curve-server-key go together")
    credentials = None
    insecure_http = bool(values["insecure_http"])
    if values["http_credentials"] is not None:
        if insecure_http:
            raise SystemExit(f"{PROG}: --http-credentials and --insecure-http contradict")
        try:
            credentials = load_http_credentials(Path(values["http_credentials"]))
        except ValueError as exc:
            raise SystemExit(f"{PROG}: --http-credentials: {exc}") from None
    socket_text = values["unix_socket"]
    unix_socket: Path | None = agora_home(env) / "batch.sock"
    if socket_text is not None:
        unix_socket = None if socket_text.lower() in ("none", "off") else Path(socket_text)
    return ServiceSettings(
        master=values["master"],
        work_dir=Path(work_dir) if work_dir else agora_home(env) / "batch-service",
        name=values["name"],
        queues=tuple(values["queues"]),
        failover_timeout=values["failover_timeout"],
        http_bind=values["http_bind"],
        http_port=values["http_port"],
        endpoint_file=Path(values["endpoint_file"]) if values["endpoint_file"] else None,
        half_life=values["half_life"],
        shares=dict(values["shares"]),
        retry_backoff=values["retry_backoff"],
        retry_backoff_max=values["retry_backoff_max"],
        max_losses=values["max_losses"],
        unreachable_timeout=values["unreachable_timeout"],
        preempt=dict(values["preempt"]),
        preempt_after=values["preempt_after"],
        preempt_min_runtime=values["preempt_min_runtime"],
        curve_secret_key=values["curve_secret_key"],
        curve_server_key=values["curve_server_key"],
        http_credentials=credentials,
        insecure_http=insecure_http,
        unix_socket=unix_socket,
        unix_socket_explicit=socket_text is not None,
        log_format=values["log_format"],
        log_level=values["log_level"],
    )
