"""``agora-relay`` / ``python -m agora.master.relay``: parse options, then relay until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Mapping, Sequence

import structlog
import zmq
from agora.master.relay.config import RelaySettings, load_settings
from agora.master.relay.relay import Relay
from agora.sdk.logs import configure_logging
from agora.sdk.transport import CurveClient, CurveServer

__all__ = ["main", "run"]

log = structlog.get_logger(__name__)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
    """Relay until SIGTERM/SIGINT; exits 0 then, 1 on a fatal error, 2 on bad options."""
    settings = load_settings(argv, env)
    configure_logging(settings.log_format, settings.log_level)
    sys.exit(asyncio.run(run(settings)))


async def run(settings: RelaySettings) -> int:
    agents_curve: CurveServer | None = None
    masters_curve: CurveClient | None = None
    try:
        if settings.curve_secret_key is not None:
            assert settings.curve_authorized_keys is not None
            assert settings.master_public_key is not None
            agents_curve = CurveServer(settings.curve_secret_key, settings.curve_authorized_keys)
            masters_curve = CurveClient(settings.curve_secret_key, settings.master_public_key)
        relay = await Relay.start(
            settings.bind,
            settings.masters,
            agents_curve=agents_curve,
            masters_curve=masters_curve,
            advertise=settings.advertise,
            idle=settings.idle_timeout,
            max_agents=settings.max_agents,
        )
    except (OSError, ValueError, zmq.ZMQError) as exc:
        log.error("relay_unusable", error=str(exc))
        return 1
    if agents_curve is None:
        log.warning(
            "running_insecure",
            hint="no CURVE: anyone who reaches this relay's port can speak as an agent",
        )
    status = 0
    try:
        serving = asyncio.create_task(relay.serve(), name="relay")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, serving.cancel)
        if settings.endpoint_file is not None:
            tmp = settings.endpoint_file.with_name(settings.endpoint_file.name + ".tmp")
            tmp.write_text(relay.endpoint + "\n")
            os.replace(tmp, settings.endpoint_file)
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    except Exception:
        log.exception("relay_failed")
        status = 1
    finally:
        relay.close()
        if settings.endpoint_file is not None:
            with contextlib.suppress(OSError):
                settings.endpoint_file.unlink()
    log.info("relay_stopped", **dataclasses.asdict(relay.stats))
    return status
