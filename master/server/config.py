"""The master daemon's options, and how they become a ``MasterConfig`` plus daemon settings.

Every option is a flag (``--allocation-interval 0.5``), an environment variable
(``AGORA_ALLOCATION_INTERVAL=0.5``) and a key of the TOML file named by ``--config`` /
``AGORA_CONFIG`` (``allocation_interval = 0.5``), in that order of precedence
(see :mod:`agora.sdk.daemon.settings`).

Role options:

- ``--roles batch,mpi`` — the roles frameworks may subscribe with (empty: any valid role).
- ``--weights batch=2,mpi=1`` — DRF weights (> 0; default 1).
- ``--quota "batch:cpus:4;mem:1024"`` — a role's quota guarantee: the role name, a colon, then
  scalar resources in the usual text form (``;`` between resources). Several roles in one value
  are separated by ``,``: ``--quota "batch:cpus:4;mem:1024, mpi:cpus:8"``.
  In TOML, a list of such strings also works (``quota = ["batch:cpus:4", "mpi:cpus:8"]``), and
  so does a table (``[quota]`` then ``batch = "cpus:4;mem:1024"``): ``role=resources`` is
  accepted as well as ``role:resources``.
- ``--quota-limit "batch:cpus:16"`` — the same syntax, for quota limits (caps). A role with a
  limit and no guarantee gets an empty guarantee.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from agora.master.allocator import Allocator, AllocatorError
from agora.master.allocator.reclaim import ReclaimConfig
from agora.master.core import MasterConfig
from agora.sdk.daemon.settings import (
    Option,
    load,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_endpoint,
    parse_master_list,
    parse_optional_float,
    parse_optional_path,
    parse_port,
    parse_positive_int,
)
from agora.sdk.logs import LOG_FORMATS, LOG_LEVELS
from agora.sdk.resources import ResourceError, Resources

__all__ = [
    "OPTIONS",
    "ConfigError",
    "DaemonSettings",
    "load_settings",
    "parse_quotas",
    "parse_roles",
    "parse_weights",
    "settings_from",
]

PROG = "agora-master"
DESCRIPTION = "The Agora master: pools agents' resources and offers them to frameworks."


class ConfigError(ValueError):
    """Options that are fine one by one but not together (e.g. a CURVE secret without clients)."""


# ---- value parsers: text (flags, environment, TOML values as text) -> value ----------------


def positive_seconds(text: str) -> float:
    """A duration > 0: seconds, or with a unit (``250ms``, ``5s``, ``2m``, ``1h``)."""
    out: float = parse_duration(text)
    if out <= 0:
        raise ValueError("expected a duration > 0")
    return out


def optional_seconds(text: str) -> float | None:
    """``none`` (or empty) for no timeout, else a duration > 0."""
    out: float | None = parse_optional_float(text)
    if out is not None and out <= 0:
        raise ValueError("expected a duration > 0, or none")
    return out


def _path(text: str) -> Path:
    text = text.strip()
    if not text:
        raise ValueError("expected a path")
    return Path(text).expanduser()


def non_negative_seconds(text: str) -> float:
    out: float = parse_duration(text)
    if out < 0:
        raise ValueError("expected a duration >= 0")
    return out


def _share(text: str) -> float:
    try:
        out = float(text.strip())
    except ValueError:
        raise ValueError("expected a number between 0 and 1") from None
    if not 0.0 <= out <= 1.0:
        raise ValueError("expected a number between 0 and 1")
    return out


def _optional_endpoint(text: str) -> str | None:
    return parse_master_list(text)[0] if text.strip() else None


def _optional_port(text: str) -> int | None:
    """``none``/``off``/empty for no HTTP server, else a TCP port (0: an ephemeral one)."""
    return None if text.strip().lower() in ("", "none", "off") else parse_port(text)


def _host(text: str) -> str:
    text = text.strip()
    if not text:
        raise ValueError("expected a host name or address")
    return text


def _role(text: str) -> str:
    role = text.strip()
    # The resources parser owns the rules for role names; reuse them rather than copy them.
    try:
        Resources.parse(f"cpus({role}):1")
    except ResourceError:
        raise ValueError(f"bad role name {text!r}") from None
    return role


def _items(text: str, separators: str = r"[,\s]+") -> list[str]:
    """Entries of a list option, separated by ``,`` or whitespace (a TOML list arrives joined)."""
    return [item.strip() for item in re.split(separators, text) if item.strip()]


def parse_roles(text: str) -> frozenset[str]:
    """``"batch,mpi"`` -> ``frozenset({"batch", "mpi"})``; empty -> any role."""
    return frozenset(_role(item) for item in _items(text))


#: Role weights allowed (the range operator calls and the state's roles carry on the wire).
MIN_WEIGHT: Final = 0.0001
MAX_WEIGHT: Final = 1_000_000.0


def parse_weights(text: str) -> dict[str, float]:
    """``"batch=2,mpi=1"`` (or a TOML table ``{batch = 2}``) -> ``{"batch": 2.0, "mpi": 1.0}``."""
    out: dict[str, float] = {}
    for item in _items(text):
        role, sep, weight = item.partition("=")
        if not sep:
            raise ValueError(f"expected role=weight, got {item!r}")
        name = _role(role)
        try:
            w = float(weight)
        except ValueError:
            raise ValueError(f"weight of {name!r} is not a number: {weight!r}") from None
        if not (math.isfinite(w) and MIN_WEIGHT <= w <= MAX_WEIGHT):
            raise ValueError(
                f"weight of {name!r} must be from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, got {weight!r}"
            )
        if name in out:
            raise ValueError(f"role {name!r} has two weights")
        out[name] = w
    return out


def parse_quotas(text: str) -> dict[str, Resources]:
    """``"batch:cpus:4;mem:1024, mpi:cpus:8"`` -> ``{"batch": cpus:4;mem:1024, "mpi": cpus:8}``.

    Only scalar resources make sense in a quota; roles inside the resources are ignored by the
    allocator (quota counts quantities).
    """
    out: dict[str, Resources] = {}
    for item in _items(text, ","):  # resources text may contain spaces
        cut = min((i for i in (item.find(":"), item.find("=")) if i >= 0), default=-1)
        role, sep, spec = (item[:cut], item[cut], item[cut + 1 :]) if cut >= 0 else (item, "", "")
        if not sep or not spec.strip():
            raise ValueError(f"expected role:resources (e.g. batch:cpus:4;mem:1024), got {item!r}")
        name = _role(role)
        try:
            res = Resources.parse(spec)
        except ResourceError as exc:
            raise ValueError(f"quota of {name!r}: {exc}") from None
        if name in out:
            raise ValueError(f"role {name!r} appears twice")
        out[name] = res
    return out


def _cluster_name(text: str) -> str:
    name = text.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise ValueError("a cluster name is 1 to 64 printable characters")
    return name


OPTIONS: tuple[Option, ...] = (
    Option(
        "bind", parse_endpoint, "tcp://127.0.0.1:5050", "endpoint to bind (port 0 or * = ephemeral)"
    ),
    Option("work_dir", _path, Path("/tmp/agora/master"), "the master's own directory (created)"),
    Option(
        "endpoint_file",
        parse_optional_path,
        None,
        "write the actual bound endpoint to this file once bound (atomically)",
    ),
    Option(
        "http_port",
        _optional_port,
        None,
        "serve the operator HTTP API (/health, /state, /metrics) on this port (0: ephemeral; "
        "default: off); with --endpoint-file, its URL goes to <endpoint-file>.http",
    ),
    Option("http_bind", _host, "127.0.0.1", "host/address the operator HTTP API listens on"),
    Option(
        "http_credentials",
        parse_optional_path,
        None,
        'TOML file of principal = "token" (16+ characters): operator calls over HTTP then '
        "need 'Authorization: Bearer TOKEN' and are made as that principal (the ACL applies)",
    ),
    Option("cluster", _cluster_name, "agora", "the cluster's name, shown to operators"),
    Option(
        "masters",
        parse_master_list,
        (),
        "every master of the election group, this one included: tcp://h1:5050,tcp://h2:5050,... "
        "(1, 3 or 5; default: this master alone)",
    ),
    Option(
        "advertise",
        _optional_endpoint,
        None,
        "this master's endpoint as written in --masters (default: the bound endpoint)",
    ),
    Option(
        "election_timeout",
        positive_seconds,
        1.0,
        "T: a standby that hears no leader for a random time in [T, 2T) starts an election",
    ),
    Option(
        "election_heartbeat",
        positive_seconds,
        0.1,
        "how often the leader heartbeats the other masters",
    ),
    Option(
        "agent_reregister_timeout",
        positive_seconds,
        600.0,
        "after a failover, agents not back this long are marked unreachable",
    ),
    Option(
        "framework_reregister_timeout",
        optional_seconds,
        None,
        "after a failover, frameworks have this long to re-subscribe before their own"
        " failover timeout counts (default: --agent-reregister-timeout)",
    ),
    Option(
        "recovery_hold_off",
        non_negative_seconds,
        2.0,
        "after a failover, offers wait this long unless --recovery-agent-share agents are back",
    ),
    Option(
        "recovery_agent_share",
        _share,
        0.8,
        "after a failover, offers start once this share of the registry's agents is back",
    ),
    Option(
        "history",
        parse_optional_path,
        None,
        "append a JSONL history of terms, leadership and commits here (for the fault suite)",
    ),
    Option("allocation_interval", positive_seconds, 1.0, "seconds between batch allocations"),
    Option(
        "min_refuse_seconds",
        non_negative_seconds,
        0.1,
        "declined resources stay away from their framework at least this long, whatever its"
        " refuse_seconds (and until the next batch allocation)",
    ),
    Option(
        "offer_timeout",
        optional_seconds,
        None,
        "rescind outstanding offers after this many seconds ('none': keep them)",
    ),
    Option("agent_ping_interval", positive_seconds, 15.0, "seconds between PINGs to agents"),
    Option(
        "max_agent_ping_timeouts",
        parse_positive_int,
        5,
        "unanswered PINGs before an agent is marked unreachable",
    ),
    Option("heartbeat_interval", positive_seconds, 15.0, "seconds between framework HEARTBEATs"),
    Option(
        "peer_timeout",
        positive_seconds,
        45.0,
        "a client silent this long is treated as disconnected",
    ),
    Option("roles", parse_roles, frozenset(), "roles frameworks may use, e.g. a,b (empty: any)"),
    Option("weights", parse_weights, {}, "role weights, e.g. a=2,b=1"),
    Option(
        "quota",
        parse_quotas,
        {},
        "quota guarantees: role:resources, roles joined by ',' ('a:cpus:4;mem:1024,b:cpus:2')",
    ),
    Option("quota_limit", parse_quotas, {}, "quota limits, same syntax as --quota"),
    Option(
        "reclaim",
        parse_bool,
        True,
        "take back what a role below its --quota guarantee is owed when it wants it: lent"
        " (revocable) tasks first, then tasks of roles above their own guarantee",
    ),
    Option("reclaim_interval", positive_seconds, 1.0, "seconds between reclaim rounds"),
    Option(
        "reclaim_min_runtime",
        non_negative_seconds,
        10.0,
        "reclaim never stops a task that started less than this many seconds ago",
    ),
    Option("reclaim_max_victims", parse_positive_int, 100, "tasks reclaim may stop per round"),
    Option("log_format", parse_choice(LOG_FORMATS), "console", "log format: console or json"),
    Option("log_level", parse_choice(LOG_LEVELS), "info", "log level: debug, info, warning, error"),
    Option(
        "curve_secret_key",
        parse_optional_path,
        None,
        "the master's CURVE secret key file (pyzmq certificate); turns CURVE on",
    ),
    Option(
        "curve_authorized_keys",
        parse_optional_path,
        None,
        "directory of admitted clients' public keys (<principal>.key)",
    ),
    Option(
        "acl",
        parse_optional_path,
        None,
        "ACL TOML file (agents, operators, [roles]) by CURVE principal; without CURVE every "
        "client is anonymous and matches only '*' entries",
    ),
    Option(
        "insecure",
        parse_bool,
        False,
        "run without CURVE on purpose (needed without --curve-secret-key): anyone who reaches "
        "the port may then register agents, subscribe frameworks, make operator calls and, in "
        "an election group, speak for a master; logged at start and shown by agora top",
        flag=True,
    ),
)


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """Everything the daemon needs: the core's config plus the shell's own settings."""

    master: MasterConfig
    bind: str
    work_dir: Path
    endpoint_file: Path | None
    peer_timeout: float
    log_format: str
    log_level: str
    curve_secret_key: Path | None
    curve_authorized_keys: Path | None
    acl: Path | None
    #: The operator HTTP API's port (0: ephemeral), or None for none.
    http_port: int | None = None
    http_bind: str = "127.0.0.1"
    http_credentials: Path | None = None
    #: The election group (empty: this master alone) and this master's name in it.
    masters: tuple[str, ...] = ()
    advertise: str | None = None
    election_timeout: float = 1.0
    election_heartbeat: float = 0.1
    history: Path | None = None
    #: Started with --insecure (CURVE off on purpose).
    insecure: bool = False

    @property
    def curve(self) -> bool:
        return self.curve_secret_key is not None

    @property
    def tick_interval(self) -> float:
        """How often the daemon calls ``Master.tick``."""
        return min(0.1, float(self.master.allocation_interval))


def settings_from(values: Mapping[str, Any]) -> DaemonSettings:
    """Build the settings from loaded option values; raises :class:`ConfigError`."""
    guarantees: dict[str, Resources] = values["quota"]
    limits: dict[str, Resources] = values["quota_limit"]
    quotas = {
        role: (guarantees.get(role, Resources()), limits.get(role))
        for role in sorted(guarantees.keys() | limits.keys())
    }
    master = replace(
        MasterConfig(),
        cluster=values["cluster"],
        allocation_interval=values["allocation_interval"],
        min_refuse_seconds=values["min_refuse_seconds"],
        offer_timeout=values["offer_timeout"],
        heartbeat_interval=values["heartbeat_interval"],
        agent_ping_interval=values["agent_ping_interval"],
        max_agent_ping_timeouts=values["max_agent_ping_timeouts"],
        roles=values["roles"],
        weights=dict(values["weights"]),
        quotas=quotas,
        reclaim=ReclaimConfig(
            enabled=values["reclaim"],
            interval=values["reclaim_interval"],
            min_runtime=values["reclaim_min_runtime"],
            max_victims=values["reclaim_max_victims"],
        ),
        agent_reregister_timeout=values["agent_reregister_timeout"],
        framework_reregister_timeout=values["framework_reregister_timeout"],
        recovery_hold_off=values["recovery_hold_off"],
        recovery_agent_share=values["recovery_agent_share"],
    )
    _check_roles(master)
    masters: tuple[str, ...] = values["masters"]
    advertise: str | None = values["advertise"]
    if masters and len(masters) not in (1, 3, 5):
        raise ConfigError(f"--masters lists {len(masters)} masters; use 1, 3 or 5")
    if masters and advertise is not None and advertise not in masters:
        raise ConfigError(f"--advertise {advertise} is not one of --masters")
    if values["election_heartbeat"] * 2 > values["election_timeout"]:
        raise ConfigError("--election-heartbeat must be at most half of --election-timeout")
    secret: Path | None = values["curve_secret_key"]
    authorized: Path | None = values["curve_authorized_keys"]
    acl: Path | None = values["acl"]
    if (secret is None) != (authorized is None):
        raise ConfigError("--curve-secret-key and --curve-authorized-keys go together")
    if len(masters) > 1 and secret is None and not values["insecure"]:
        raise ConfigError(
            f"--masters names {len(masters)} masters and CURVE is off: anyone who reaches a "
            "master's port could then vote or speak for the leader. Give --curve-secret-key and "
            "--curve-authorized-keys (and the masters' principal under 'masters' in --acl), or "
            "--insecure to run without authentication on purpose"
        )
    if secret is None and not values["insecure"]:
        raise ConfigError(
            "CURVE is off: give --curve-secret-key and --curve-authorized-keys (keys from "
            "`agora keys generate`), or --insecure to let anyone who reaches this master's port "
            "register agents, subscribe frameworks and make operator calls"
        )
    master = replace(master, insecure=secret is None)
    return DaemonSettings(
        master=master,
        bind=values["bind"],
        work_dir=values["work_dir"],
        endpoint_file=values["endpoint_file"],
        peer_timeout=values["peer_timeout"],
        http_port=values["http_port"],
        http_bind=values["http_bind"],
        http_credentials=values["http_credentials"],
        log_format=values["log_format"],
        log_level=values["log_level"],
        curve_secret_key=secret,
        curve_authorized_keys=authorized,
        acl=acl,
        masters=masters,
        advertise=advertise,
        election_timeout=values["election_timeout"],
        election_heartbeat=values["election_heartbeat"],
        history=values["history"],
        insecure=values["insecure"],
    )


def _check_roles(cfg: MasterConfig) -> None:
    """Weights and quotas go through the allocator's own validation, on a throwaway one."""
    if cfg.roles:
        unknown = sorted((cfg.weights.keys() | cfg.quotas.keys()) - cfg.roles)
        if unknown:
            raise ConfigError(f"weights/quota name roles not in --roles: {', '.join(unknown)}")
    probe = Allocator(cfg.allocator)
    try:
        for role, weight in cfg.weights.items():
            probe.set_weight(role, weight)
        for role, (guarantee, limit) in cfg.quotas.items():
            probe.set_quota(role, guarantee, limit)
    except AllocatorError as exc:
        raise ConfigError(str(exc)) from None


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> DaemonSettings:
    """Flags > ``AGORA_*`` environment > TOML file > defaults. Bad input: ``SystemExit(2)``."""
    values = load(PROG, DESCRIPTION, OPTIONS, argv=argv, env=env)
    try:
        return settings_from(values)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        raise SystemExit(2) from None
