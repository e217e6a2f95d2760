"""``agora-relay``'s options: flags, ``AGORA_*`` variables or a TOML file, as for the master."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agora.master.relay.core import DEFAULT_MAX_AGENTS
from agora.master.relay.relay import IDLE_SECONDS
from agora.sdk.daemon.settings import (
    Option,
    load,
    parse_bool,
    parse_choice,
    parse_endpoint,
    parse_master_list,
    parse_optional_path,
    parse_positive_duration,
    parse_positive_int,
)
from agora.sdk.logs import LOG_FORMATS, LOG_LEVELS

__all__ = ["OPTIONS", "RelaySettings", "load_settings"]

PROG = "agora-relay"
DESCRIPTION = "The Agora relay: carries many agents to the leading master over one connection."


OPTIONS: tuple[Option, ...] = (
    Option("bind", parse_endpoint, "tcp://127.0.0.1:5060", "endpoint the agents connect to"),
    Option("masters", parse_master_list, (), "the master group, comma-separated (required)"),
    Option(
        "advertise",
        lambda t: t.strip() or None,
        None,
        "the name the relay gives itself in LEADER (default: its bound endpoint)",
    ),
    Option(
        "endpoint_file", parse_optional_path, None, "write the bound endpoint here once serving"
    ),
    Option(
        "curve_secret_key",
        parse_optional_path,
        None,
        "the relay's CURVE secret key: its agents must trust its public key, and the masters "
        "must admit it and name its principal in their ACL's relays",
    ),
    Option(
        "curve_authorized_keys",
        parse_optional_path,
        None,
        "directory of the agents' public keys it admits",
    ),
    Option("master_public_key", parse_optional_path, None, "the masters' CURVE public key file"),
    Option(
        "insecure",
        parse_bool,
        False,
        "run without CURVE on purpose (the masters must run --insecure too)",
        flag=True,
    ),
    Option("max_agents", parse_positive_int, DEFAULT_MAX_AGENTS, "most agents the relay carries"),
    Option(
        "idle_timeout",
        parse_positive_duration,
        IDLE_SECONDS,
        "forget an agent silent this long (seconds)",
    ),
    Option("log_format", parse_choice(LOG_FORMATS), "console", "log format: console or json"),
    Option("log_level", parse_choice(LOG_LEVELS), "info", "log level: debug, info, warning, error"),
)


@dataclass(frozen=True, slots=True)
class RelaySettings:
    bind: str
    masters: tuple[str, ...]
    advertise: str | None
    endpoint_file: Path | None
    curve_secret_key: Path | None
    curve_authorized_keys: Path | None
    master_public_key: Path | None
    insecure: bool
    max_agents: int
    idle_timeout: float
    log_format: str
    log_level: str


def settings_from(values: Mapping[str, Any]) -> RelaySettings:
    """Settings from parsed values; ValueError when they do not fit together."""
    settings = RelaySettings(**values)
    if not settings.masters:
        raise ValueError("--masters is required")
    keys = (settings.curve_secret_key, settings.curve_authorized_keys, settings.master_public_key)
    if any(keys) and not all(keys):
        raise ValueError(
            "CURVE needs --curve-secret-key, --curve-authorized-keys and --master-public-key"
        )
    if not any(keys) and not settings.insecure:
        raise ValueError(
            "give --curve-secret-key, --curve-authorized-keys and --master-public-key, or "
            "--insecure to run without CURVE on purpose"
        )
    if any(keys) and settings.insecure:
        raise ValueError("--insecure and CURVE keys exclude each other")
    return settings


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> RelaySettings:
    """Flags > ``AGORA_*`` environment > TOML file > defaults. Bad input: ``SystemExit(2)``."""
    values = load(PROG, DESCRIPTION, OPTIONS, argv=argv, env=env)
    try:
        return settings_from(values)
    except ValueError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        raise SystemExit(2) from None
