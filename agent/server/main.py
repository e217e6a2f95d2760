"""``agora-agent``: parse the options, set up logging, run the daemon until it is told to stop."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence

import structlog
from agora.agent.server.config import DESCRIPTION, OPTIONS, PROG, ConfigError, build
from agora.agent.server.daemon import AgentDaemon
from agora.sdk.daemon.settings import load
from agora.sdk.logs import configure_logging
from agora.sdk.transport import CurveClient

__all__ = ["main", "run"]

log = structlog.get_logger(__name__)


def run(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """The agent's exit status for these arguments (2: bad configuration)."""
    values = load(PROG, DESCRIPTION, OPTIONS, argv, env)
    configure_logging(values["log_format"], values["log_level"])
    try:
        config, settings = build(values)
        curve = None
        if settings.curve_secret_key is not None and settings.curve_server_key is not None:
            curve = CurveClient(settings.curve_secret_key, settings.curve_server_key)
    except (ConfigError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if curve is None:
        log.warning(
            "running_insecure",
            insecure_flag=settings.insecure,
            http_without_tokens=settings.insecure_http,
            hint="started --insecure, no CURVE: the link to the master is neither encrypted nor "
            "authenticated, and anyone who reaches the master could pose as this agent; give "
            "--curve-secret-key and --curve-server-key",
        )
    daemon = AgentDaemon(config, settings, curve=curve, environ=env)
    return asyncio.run(daemon.run())


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())
