"""structlog set-up shared by the daemons: JSON lines or a console renderer, to stderr."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "configure_logging", "default_logging"]


class _StderrLogger:
    """Writes each rendered event to whatever ``sys.stderr`` is *now* (tests swap it)."""

    def msg(self, message: str) -> None:
        try:
            stream = sys.stderr
            stream.write(message + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not break the caller
            pass

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    """Route structlog to stderr as ``fmt`` ("json"/"console"), dropping events below ``level``."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {LOG_LEVELS}, got {level!r}")
    tail: list[structlog.typing.Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if fmt == "json"
        else [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )


def default_logging() -> None:
    """Warnings and errors to stderr, unless the program configured structlog itself.

    The SDK drivers call this when they start, so a plain script using them is not flooded with
    structlog's default (every level, to stdout); call :func:`configure_logging` to see more.
    """
    if not structlog.is_configured():
        configure_logging("console", "warning")
