"""``agora-master`` / ``python -m agora.master.server``: parse options, set up logs, serve."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence

from agora.master.server.config import load_settings
from agora.master.server.process import serve
from agora.sdk.logs import configure_logging

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
    """Run the master until SIGTERM/SIGINT; exits 0 then, 1 on a fatal error, 2 on bad options."""
    settings = load_settings(argv, env)
    configure_logging(settings.log_format, settings.log_level)
    sys.exit(asyncio.run(serve(settings)))
