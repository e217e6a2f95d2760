"""``agora-master`` / ``python -m agora.master.server``: parse options, set up logs, serve."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Mapping, Sequence

from agora.master.server.config import load_settings
from agora.master.server.process import serve
from agora.sdk.logs import configure_logging

__all__ = ["main"]

#: Allocations between young collections (CPython's default: 700), and young collections per
#: older one. A master holds hundreds of thousands of long-lived records; at the default pace a
#: re-registration storm (10,000 agents reporting 100,000 tasks) spends a quarter of its time
#: in the collector, and decoding half of its own (tests/bench/scale.py).
GC_THRESHOLDS = (50_000, 20, 20)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
    """Run the master until SIGTERM/SIGINT; exits 0 then, 1 on a fatal error, 2 on bad options."""
    settings = load_settings(argv, env)
    configure_logging(settings.log_format, settings.log_level)
    tune_gc()
    sys.exit(asyncio.run(serve(settings)))


def tune_gc() -> None:
    """Collect less often, and never again scan what importing made (it lives as long as the
    process). Garbage without cycles is freed at once either way."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
